#!/usr/bin/env python3
"""attnlab's exact attention against the exact attention a user of current PyTorch already has on the same CPU
(issue "Costs on the machine the user runs", item 5): `torch.nn.functional.scaled_dot_product_attention` (PyTorch
>= 2.0; on the CPU its fused flash-attention kernel) and attnlab's streaming exact attention, float32, one head, the
same head dimensions, lengths and thread counts, in one run.

    tools/bench_exact_peer.py --torch-python PY [--n 1024,4096,16384] [--d 32,64] [--threads 1,2] [--repeats 15]
                              [--build LABEL=BIN ...] [--out results/bench/exact_peer.csv] [--md ...]
    tools/bench_exact_peer.py --table-only [--out ...] [--md ...]

PY is a Python whose torch has scaled_dot_product_attention — Debian's torch 1.13 has none, so it is a current
PyTorch from Python's index in a virtual environment of its own (outside the main job and CI:
`python3 -m venv /tmp/torch2 && /tmp/torch2/bin/pip install torch numpy`; the CUDA wheel runs on the CPU too). Each
--build is an attnlab command (default: `default=` build/bin/attnlab, the x86-64-v3 build with pinned blocking; add
e.g. `native=build-native/bin/attnlab`, a -DATTNLAB_NATIVE=ON build). attnlab is timed by its own cost harness
(`attnlab run scaling --methods exact`: compute + output, the fastest of --repeats calls after a warm-up); PyTorch by
the same statistic around the call under no_grad, in float32 and, for information, bfloat16, with torch's threads set
to the same count. Every row records the CPU, attnlab's kernels (its run's .config), torch's version, the CPU
capability its kernels dispatch to and the SDPA backend torch chose for these inputs.

Writes tidy rows (impl, build, dtype, n, d, threads, time_s, device, detail) and a Markdown table per length and thread
count: each build's time, PyTorch's, the ratio attnlab / PyTorch (> 1: attnlab slower) and the fastest float32 exact
attention measured — the baseline the README's speed-ups are restated against.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_threads  # noqa: E402  (the scaling run and its .config reading)

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ["impl", "build", "dtype", "n", "d", "threads", "time_s", "device", "detail"]
PEER = "PyTorch SDPA"

# Run by --torch-python: one JSON line per (n, threads, dtype), or {"error": ...} and exit status 3.
PEER_SCRIPT = r"""
import json, sys, time
a = json.loads(sys.argv[1])
try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(json.dumps({"error": f"no torch for {sys.executable}: {e}"})); sys.exit(3)
if not hasattr(F, "scaled_dot_product_attention"):
    print(json.dumps({"error": f"torch {torch.__version__} at {sys.executable} has no "
                               "scaled_dot_product_attention (PyTorch >= 2.0)"})); sys.exit(3)
cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
g = torch.Generator().manual_seed(a["seed"])
for n, d in [(n, d) for d in a["d"] for n in a["n"]]:
    q, k, v = (torch.randn(1, 1, n, d, generator=g) for _ in range(3))
    for t in a["threads"]:
        torch.set_num_threads(t)
        for name in a["dtypes"]:
            x = [y.to(dtypes[name]) for y in (q, k, v)]
            try:
                from torch.nn.attention import SDPBackend
                backend = SDPBackend(torch._fused_sdp_choice(*x)).name
            except Exception:  # an older torch: the choice is not exposed
                backend = "?"
            with torch.no_grad():
                F.scaled_dot_product_attention(*x)  # warm-up
                best = float("inf")
                for _ in range(a["repeats"]):
                    t0 = time.perf_counter()
                    F.scaled_dot_product_attention(*x)
                    best = min(best, time.perf_counter() - t0)
            if torch.get_num_threads() != t:
                print(json.dumps({"error": f"torch runs {torch.get_num_threads()} threads, asked for {t}"}))
                sys.exit(3)
            print(json.dumps({"n": n, "d": d, "threads": t, "dtype": name, "time_s": best,
                              "detail": f"torch {torch.__version__}, cpu capability {cap}, SDPA backend {backend}"}),
                  flush=True)
"""


def time_peer(python, ns, ds, counts, repeats, dtypes, device, probe=False):
    """PyTorch's rows; with probe, only whether `python` has a torch with SDPA (before anything is timed)."""
    cmd = [python, "-c", PEER_SCRIPT, json.dumps({"n": ns, "threads": counts, "repeats": repeats, "d": ds,
                                                   "dtypes": dtypes, "seed": 0})]
    if not probe:
        print(f"bench_exact_peer: {PEER} through {python}", flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"bench_exact_peer: --torch-python {python}: {e}")
    rows = []
    for line in p.stdout.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "error" in r:
            sys.exit(f"bench_exact_peer: {r['error']}")
        rows.append({"impl": PEER, "build": "", "dtype": r["dtype"], "n": r["n"], "d": r["d"], "threads": r["threads"],
                     "time_s": r["time_s"], "device": device, "detail": r["detail"]})
    if p.returncode != 0 or not (rows or probe):
        sys.exit(f"bench_exact_peer: {python} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    return rows


def table(rows):
    """The Markdown table and, per (n, threads), the summary the README quotes."""
    text = lambda x: x if isinstance(x, str) else ""  # noqa: E731  (a CSV's empty field reads back as NaN)
    builds = []
    for r in rows:
        if r["impl"] == "attnlab" and r["build"] not in builds:
            builds.append(r["build"])
    cells = {}
    for r in rows:
        key = (int(r["d"]), int(r["n"]), int(r["threads"]))
        name = f"attnlab {r['build']}" if r["impl"] == "attnlab" else f"{PEER} {r['dtype']}"
        cells.setdefault(key, {})[name] = float(r["time_s"])
    device = next((text(r["device"]) for r in rows if text(r["device"])), "this machine's CPU")
    details = sorted({text(r["detail"]) for r in rows if text(r["detail"])})
    lines = [f"Exact attention, one head, forward, the fastest of the repeats; measured on {device}. "
             + "; ".join(details) + ". Ratio = attnlab / PyTorch in float32 (> 1: attnlab is slower).", "",
             "| d | n | threads | " + " | ".join(f"attnlab {b} (ms)" for b in builds)
             + f" | {PEER} fp32 (ms) | {PEER} bf16 (ms) | " + " | ".join(f"ratio, {b}" for b in builds)
             + " | fastest fp32 exact |",
             "|---|---|---|" + "---|" * (2 * len(builds) + 3)]
    summary = []
    ms = lambda x: "–" if x is None else f"{x * 1e3:.3g}"  # noqa: E731
    for (d, n, t), c in sorted(cells.items()):
        peer = c.get(f"{PEER} fp32")
        ratios = {b: (c[f"attnlab {b}"] / peer if peer and f"attnlab {b}" in c else None) for b in builds}
        fp32 = {k: v for k, v in c.items() if k.startswith("attnlab") or k == f"{PEER} fp32"}
        fastest = min(fp32, key=fp32.get) if fp32 else "–"
        summary.append({"d": d, "n": n, "threads": t, "ratios": ratios, "fastest": fastest,
                        "fastest_s": fp32.get(fastest), "peer_s": peer,
                        "attnlab_s": {b: c.get(f"attnlab {b}") for b in builds}})
        lines.append(f"| {d} | {n} | {t} | " + " | ".join(ms(c.get(f'attnlab {b}')) for b in builds)
                     + f" | {ms(peer)} | {ms(c.get(f'{PEER} bf16'))} | "
                     + " | ".join("–" if ratios[b] is None else f"{ratios[b]:.2f}" for b in builds)
                     + f" | {fastest} |")
    return "\n".join(lines) + "\n", summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch-python", help="a Python whose torch has scaled_dot_product_attention (torch >= 2)")
    ap.add_argument("--n", default="1024,4096,16384", help="comma-separated lengths")
    ap.add_argument("--d", default="32,64", help="comma-separated head dimensions")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (each ≤ this machine's cores)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtypes", default="fp32,bf16", help="PyTorch's formats (fp32 is the comparison; bf16 said)")
    ap.add_argument("--build", action="append", default=None, metavar="LABEL=BIN",
                    help="an attnlab command to time, labelled (repeatable; default: default=build/bin/attnlab)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "exact_peer.csv"))
    ap.add_argument("--md", default=None, help="the table (default: --out with .md)")
    ap.add_argument("--table-only", action="store_true", help="redraw the table from --out, time nothing")
    a = ap.parse_args()
    md_path = Path(a.md) if a.md else Path(a.out).with_suffix(".md")
    if a.table_only:
        if not Path(a.out).exists():
            sys.exit(f"bench_exact_peer: --table-only: {a.out} is missing")
        rows = list(csv.DictReader(open(a.out, encoding="utf-8")))
        if not rows:
            sys.exit(f"bench_exact_peer: {a.out} has no rows")
    else:
        if not a.torch_python:
            sys.exit("bench_exact_peer: give --torch-python PY, a Python with torch >= 2 (see the header)")
        try:
            ns = [int(x) for x in a.n.split(",") if x.strip()]
            ds = [int(x) for x in a.d.split(",") if x.strip()]
            counts = sorted({int(x) for x in a.threads.split(",") if x.strip()})
        except ValueError:
            sys.exit(f"bench_exact_peer: --n {a.n!r} / --threads {a.threads!r}: give comma-separated integers")
        if not ns or min(ns) < 1 or not ds or min(ds) < 1 or not counts or counts[0] < 1:
            sys.exit("bench_exact_peer: lengths, head dimensions and thread counts must be ≥ 1")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if counts[-1] > cores:
            sys.exit(f"bench_exact_peer: {counts[-1]} threads on a machine with {cores} cores would time the "
                     "scheduler, not the kernels")
        if a.repeats < 1:
            sys.exit("bench_exact_peer: --repeats must be ≥ 1")
        dtypes = [x for x in a.dtypes.split(",") if x]
        if "fp32" not in dtypes or any(x not in ("fp32", "bf16") for x in dtypes):
            sys.exit(f"bench_exact_peer: --dtypes {a.dtypes!r}: fp32 (the comparison) and optionally bf16")
        builds = []
        for b in a.build or [f"default={bench_threads.attnlab_bin()}"]:
            label, sep, path = b.partition("=")
            if not sep or not label or not Path(path).exists():
                sys.exit(f"bench_exact_peer: --build {b!r}: give LABEL=BIN with an existing attnlab command")
            builds.append((label, Path(path)))
        time_peer(a.torch_python, [], ds, counts, a.repeats, dtypes, "", probe=True)  # fail before timing anything
        rows, device = [], ""
        with tempfile.TemporaryDirectory() as tmp:
            for label, binary in builds:
                for d, t in [(d, t) for d in ds for t in counts]:
                    sub = Path(tmp) / f"{label}_{d}_{t}"
                    sub.mkdir()
                    for r in bench_threads.run(binary, ns, t, a.repeats, ["exact"], sub, ["--d", str(d)]):
                        device = device or r["device"]
                        kernels = " ".join(w for w in r["kernels"].split() if not w.startswith("threads="))
                        rows.append({"impl": "attnlab", "build": label, "dtype": "fp32", "n": r["n"], "d": d,
                                     "threads": t, "time_s": r["time_s"], "device": r["device"],
                                     "detail": f"attnlab {label}: {kernels}"})
        rows += time_peer(a.torch_python, ns, ds, counts, a.repeats, dtypes, device or bench_threads_cpu())
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    md, _ = table(rows)
    md_path.write_text(md, encoding="utf-8")
    print(md)
    print(f"bench_exact_peer: wrote {md_path}" + ("" if a.table_only else f" and {a.out}"))


def bench_threads_cpu():
    """The CPU's model name from /proc/cpuinfo (when no attnlab run recorded it)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()
