#!/usr/bin/env python3
"""One method, one size, every path that reports its cost — in one run, on one machine.

attnlab's costs reach users through the Google Benchmark suite, the experiments' cost rows (`attnlab run scaling`),
`attnlab compare`, the report and the Python module. They all time the same call through the library's cost harness
(attnlab/cost.hpp: a warm-up, then repeated calls in steady state); this script shows that they agree, method by
method, as ratios to the benchmark's figure (~1 expected), and the benchmark with and without glibc's allocator
tunables (the setting tools/bench.sh used to impose on every run; users do not have it).

    tools/cost_paths.py [--n 4096] [--methods exact,performer,nystrom,linear] [--repeats 10] [--out table.md]

Float32, d = 64, Gaussian inputs, the build in build/ (the benchmark binary needs `tools/setup.sh --bench`).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"


def env_without_tunables(extra=None):
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(extra or {})
    return env


def benchmark(build, methods, n, tunables):
    """Google Benchmark's real time per call (s), default build; GLIBC_TUNABLES set or not."""
    binary = build / "bin" / "attnlab_bench_methods"
    if not binary.exists():
        sys.exit(f"cost_paths: {binary} is missing: build it with tools/setup.sh --bench")
    names = "|".join(methods)
    env = env_without_tunables({"GLIBC_TUNABLES": TUNABLES} if tunables else None)
    out = subprocess.run([str(binary), f"--benchmark_filter=^({names})/f32/n:{n}/", "--benchmark_format=json",
                          "--benchmark_min_time=0.3", "--benchmark_repetitions=3",
                          "--benchmark_report_aggregates_only=true"],
                         env=env, check=True, capture_output=True, text=True).stdout
    times = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"].split("/")[0]
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        times[name] = b["real_time"] * unit
    return times


def scaling(build, methods, n, repeats, tmp):
    """`attnlab run scaling` (the experiments' cost rows): time_s = fastest of --repeats calls after a warm-up."""
    import pandas as pd
    out = Path(tmp) / "scaling.csv"
    subprocess.run([str(build / "bin" / "attnlab"), "run", "scaling", "--n", str(n), "--repeats", str(repeats),
                    "--methods", ";".join(methods), "--out", str(out)],
                   env=env_without_tunables(), check=True, capture_output=True)
    df = pd.read_csv(out)
    df = df[df.metric == "time_s"]
    return {m: float(df[df.method == m].value.min()) for m in methods if (df.method == m).any()}


def compare(build, methods, n, repeats, tmp):
    """`attnlab compare --repeats`: the method's time_s in its CSV."""
    import pandas as pd
    out = Path(tmp) / "compare.csv"
    cmd = [str(build / "bin" / "attnlab"), "compare", "--n", str(n), "--d", "64", "--dtype", "f32",
           "--matrix-metrics", "off", "--repeats", str(repeats), "--csv", str(out)]
    for m in methods:
        if m != "exact":
            cmd += ["--method", m]
    subprocess.run(cmd, env=env_without_tunables(), check=True, capture_output=True)
    df = pd.read_csv(out)
    times = {m: float(df[(df.method == m) & (df.metric == "time_s")].value.iloc[0])
             for m in methods if m != "exact" and ((df.method == m) & (df.metric == "time_s")).any()}
    times["exact"] = float(df[df.metric == "exact_time_s"].value.iloc[0])
    return times


def module(build, methods, n, repeats):
    """The Python module, in a child (a fresh process without the tunables): attnlab.cost (the harness), and what a
    Python caller's own loop pays — a fitted attnlab.Method refitted and applied each call (m.fit(q, k);
    m.output(v)), and attnlab.apply (which also builds the method each call) — each the fastest of `repeats` calls
    after a warm-up, as the harness times."""
    code = f"""
import json, time, numpy as np, attnlab
rng = np.random.default_rng(1)
q, k, v = (rng.standard_normal(({n}, 64)).astype(np.float32) for _ in range(3))
def fastest(f):
    f()
    best = float("inf")
    for _ in range({repeats}):
        t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
    return best
out = {{"module": {{}}, "Method loop": {{}}, "apply": {{}}}}
for m in {methods!r}:
    out["module"][m] = attnlab.cost(q, k, v, m, repeats={repeats}, memory=False)["min_s"]
    meth = attnlab.Method(m)
    out["Method loop"][m] = fastest(lambda: (meth.fit(q, k), meth.output(v)))
    out["apply"][m] = fastest(lambda: attnlab.apply(m, q, k, v))
print(json.dumps(out))
"""
    env = env_without_tunables({"PYTHONPATH": str(build / "python")})
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--methods", default="exact,linear,performer,nystrom,linformer,local,reformer,vq,probsparse")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    build = Path(args.build)
    methods = args.methods.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {
            "benchmark": benchmark(build, methods, args.n, False),
            "benchmark + tunables": benchmark(build, methods, args.n, True),
            "run scaling": scaling(build, methods, args.n, args.repeats, tmp),
            "compare": compare(build, methods, args.n, args.repeats, tmp),
        }
        paths.update(module(build, methods, args.n, args.repeats))
    cols = list(paths)
    lines = [f"Cost per call at n = {args.n}, d = 64, float32, {os.cpu_count()} threads, ms "
             f"(ratio to the benchmark without tunables in brackets); OPENBLAS_CORETYPE="
             f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}",
             "", "| method | " + " | ".join(cols) + " | largest ratio |", "|---" * (len(cols) + 2) + "|"]
    worst = 1.0
    for m in methods:
        ref = paths["benchmark"].get(m)
        cells, ratios = [], []
        for c in cols:
            t = paths[c].get(m)
            if t is None or ref is None:
                cells.append("–")
                continue
            r = t / ref
            ratios.append(max(r, 1 / r))
            cells.append(f"{t * 1e3:.3g} ({r:.2f})")
        w = max(ratios) if ratios else float("nan")
        worst = max(worst, w) if ratios else worst
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {w:.2f} |")
    lines.append("")
    lines.append(f"largest disagreement between paths: {worst:.2f}x (target: within 1.3x)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
