#!/usr/bin/env python3
"""Each method's parallel efficiency on this machine: `attnlab run scaling` at every thread count asked for, in one
run (issue "Costs on the machine the user runs", item 4).

    tools/bench_threads.py [--n 4096 16384] [--threads 1,2] [--repeats 15] [--methods SPEC ...]
                           [--out results/bench/threads.csv] [--md results/bench/threads.md]

Float32, d = 64, every method's default (and exact both ways) unless --methods; each time the fastest of --repeats
compute + output calls after a warm-up (the library's cost harness, analysis/cost.hpp). Writes tidy rows (method, spec,
n, threads, time_s, device: the CPU's name and kernels as the scaling run records them) and a Markdown table: per
method and length the time at each thread count, the speed-up from one thread to the most, the parallel efficiency
(speed-up / threads) and Amdahl's extrapolation to 16 threads from it — the serial fraction
f = (1/S − 1/p) / (1 − 1/p) of a speed-up S on p threads, then 1 / (f + (1 − f)/16): an extrapolation from two
points, not a measurement (memory bandwidth, caches and the OS set in on a real 16-core machine). A thread count above
this machine's cores is refused: it would time the scheduler, not the method.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAPOLATE_TO = 16


def attnlab_bin():
    b = os.environ.get("ATTNLAB_BIN")
    return Path(b) if b else ROOT / "build" / "bin" / "attnlab"


def config_line(path, prefix):
    """The value after `prefix` in a run's .config (the CPU's name, the kernels), or ''."""
    for line in open(path, encoding="utf-8"):
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return ""


def run(binary, n, threads, repeats, methods, tmp, extra=()):
    """The scaling run's time rows at one thread count (extra: more of its options, e.g. --d)."""
    out = Path(tmp) / f"scaling_t{threads}.csv"
    cmd = [str(binary), "run", "scaling", "--threads", str(threads), "--repeats", str(repeats), "--out", str(out),
           "--n", *[str(x) for x in n], *extra]
    if methods:
        cmd += ["--methods", *methods]
    print(f"bench_threads: {threads} thread(s): {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [r for r in csv.DictReader(open(out, encoding="utf-8")) if r["metric"] == "time_s"]
    config = str(out) + ".config"
    device = config_line(config, "# costs measured on:")
    kernels = config_line(config, "# costs measured with:")
    return [{"method": r["method"], "spec": r["spec"], "n": int(r["n"]), "threads": threads,
             "time_s": float(r["value"]), "device": device, "kernels": kernels} for r in rows]


def amdahl(speedup, p, to=EXTRAPOLATE_TO):
    """Amdahl's extrapolation of a speed-up S measured on p threads to `to` threads (None when p = 1)."""
    if p <= 1 or speedup <= 0:
        return None
    f = (1 / speedup - 1 / p) / (1 - 1 / p)
    f = min(max(f, 0.0), 1.0)  # a superlinear or a slower run: clamp to the law's range
    return 1 / (f + (1 - f) / to)


def table(rows):
    """The Markdown table: per method and n, the times, the speed-up, the efficiency and the extrapolation."""
    counts = sorted({int(r["threads"]) for r in rows})
    top = counts[-1]
    # A row's label: the method's name where it has one spec here, else the spec (exact's two paths, or several
    # budgets given with --methods).
    specs = {}
    for r in rows:
        specs.setdefault(r["method"], set()).add(r["spec"])
    label = {r["spec"]: (r["method"] if len(specs[r["method"]]) == 1 else r["spec"].split(",tile=")[0]) for r in rows}
    if len(set(label.values())) < len(label):  # two specs that differ only in their tile: the specs in full
        label = {sp: sp for sp in label}
    by = {}
    for r in rows:
        by.setdefault((label[r["spec"]], int(r["n"])), {})[int(r["threads"])] = float(r["time_s"])
    text = lambda x: x if isinstance(x, str) else ""  # noqa: E731  (a CSV's empty field reads back as NaN)
    device = text(rows[0]["device"]) or "this machine's CPU"
    # The kernels as the first run recorded them, less its thread count (the table's columns give those).
    kernels = " ".join(w for w in text(rows[0]["kernels"]).split() if not w.startswith("threads="))
    lines = [f"Float32, d = 64, compute + output, the fastest of the repeats; measured on {device}"
             f"{' (' + kernels + ')' if kernels else ''}. Amdahl's 16-thread figure is an extrapolation from "
             f"{counts[0]} and {top} threads, not a measurement, and says little where the efficiency is within "
             "the timing noise of 100% (a few percent either way extrapolates to anything near 16×).", "",
             "| method | n | " + " | ".join(f"{t} thread{'s' if t > 1 else ''} (ms)" for t in counts)
             + f" | speed-up {counts[0]} → {top} | efficiency | Amdahl → {EXTRAPOLATE_TO} threads |",
             "|---|---|" + "---|" * (len(counts) + 3)]
    out = []
    for (spec, n), t in sorted(by.items(), key=lambda x: (x[0][1], x[0][0])):
        if counts[0] not in t or top not in t:
            continue
        s = t[counts[0]] / t[top] if t[top] > 0 else float("nan")
        eff = s / (top / counts[0])
        a = amdahl(s, top) if counts[0] == 1 else None  # Amdahl's law needs the one-thread time
        out.append({"spec": spec, "n": n, "speedup": s, "efficiency": eff, "amdahl16": a})
        lines.append(f"| {spec} | {n} | " + " | ".join(f"{t[c] * 1e3:.3g}" if c in t else "–" for c in counts)
                     + f" | {s:.2f}× | {eff:.0%} | {'–' if a is None else f'{a:.1f}×'} |")
    return "\n".join(lines) + "\n", out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (each ≤ this machine's cores)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--methods", nargs="*", default=None, help="method specs (default: scaling's: every method)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "threads.csv"))
    ap.add_argument("--md", default=str(ROOT / "results" / "bench" / "threads.md"))
    a = ap.parse_args()
    try:
        counts = sorted({int(x) for x in a.threads.split(",") if x.strip()})
    except ValueError:
        sys.exit(f"bench_threads: --threads {a.threads!r}: give comma-separated integers")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not counts or counts[0] < 1:
        sys.exit("bench_threads: thread counts must be ≥ 1")
    if counts[-1] > cores:
        sys.exit(f"bench_threads: {counts[-1]} threads on a machine with {cores} cores would time the scheduler, "
                 "not the method: run it on the machine you mean (tools/bench_gpu.py --device cpu there, then "
                 "attnlab report --costs)")
    if len(counts) < 2:
        sys.exit("bench_threads: give at least two thread counts (e.g. --threads 1,2)")
    if a.repeats < 1:
        sys.exit("bench_threads: --repeats must be ≥ 1")
    binary = attnlab_bin()
    if not binary.exists():
        sys.exit(f"bench_threads: {binary} is missing: build it (tools/setup.sh) or set ATTNLAB_BIN")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in counts:
            rows += run(binary, a.n, t, a.repeats, a.methods, tmp)
    if not rows:
        sys.exit("bench_threads: the scaling runs produced no time rows")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["method", "spec", "n", "threads", "time_s", "device", "kernels"])
        w.writeheader()
        w.writerows(rows)
    md, _ = table(rows)
    Path(a.md).write_text(md, encoding="utf-8")
    print(md)
    print(f"bench_threads: wrote {a.out} and {a.md}")


if __name__ == "__main__":
    main()
