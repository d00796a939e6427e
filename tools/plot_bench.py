#!/usr/bin/env python3
"""The side-by-side benchmark's table and figure from results/bench/attnlab.json (Google Benchmark) and peers.csv
(tools/bench_peers.py): time against n per method, attnlab beside PyTorch eager, and the ratios that matter (each
method against exact streaming attention and against its PyTorch transcription, both measured in the same job).

    tools/plot_bench.py [--dir results/bench]
"""
import argparse
import math
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def load(dirname):
    bm = json.load(open(os.path.join(dirname, "attnlab.json")))
    rows = []
    for b in bm["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        name, dtype, n = b["name"].split("/")[:3]
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        rows.append({"method": name, "dtype": dtype, "n": int(n.split(":")[1]), "attnlab_s": b["real_time"] * unit})
    ours = pd.DataFrame(rows)
    peers = pd.read_csv(os.path.join(dirname, "peers.csv")).rename(columns={"seconds": "torch_s"})
    if "glibc_tunables" not in peers:
        peers["glibc_tunables"] = ""
    both = ours.merge(peers[["method", "dtype", "n", "torch_s", "openblas_coretype", "glibc_tunables"]],
                      on=["method", "dtype", "n"], how="left")
    exact = ours[ours.method == "exact"].set_index(["dtype", "n"])["attnlab_s"]
    both["speedup_vs_exact"] = [exact.get((r.dtype, r.n), float("nan")) / r.attnlab_s for r in both.itertuples()]
    both["torch_over_attnlab"] = both.torch_s / both.attnlab_s
    return both, bm.get("context", {})


def table(both, context):
    lines = [f"Machine: {context.get('num_cpus', '?')} CPUs at {context.get('mhz_per_cpu', '?')} MHz; "
             f"OpenBLAS core type for PyTorch: {', '.join(sorted(set(both.openblas_coretype.dropna())))}; "
             f"allocator for both: GLIBC_TUNABLES={', '.join(sorted(set(both.glibc_tunables.fillna('')) - {''})) or '(default)'} "
             "(freed buffers stay mapped: steady-state kernels, not first-touch page faults).", ""]
    for dtype in sorted(both.dtype.unique()):
        d = both[(both.dtype == dtype) & both.n.isin([4096, 16384])]
        lines += [f"### {dtype}", "", "| method | n | attnlab (s) | PyTorch eager (s) | PyTorch / attnlab | exact / method |",
                  "|---|---|---|---|---|---|"]
        for r in d.sort_values(["method", "n"]).itertuples():
            torch_s = f"{r.torch_s:.4g}" if r.torch_s == r.torch_s else "–"
            ratio = f"{r.torch_over_attnlab:.2f}" if r.torch_over_attnlab == r.torch_over_attnlab else "–"
            vs = f"{r.speedup_vs_exact:.2f}" if r.speedup_vs_exact == r.speedup_vs_exact else "–"
            lines.append(f"| {r.method} | {r.n} | {r.attnlab_s:.4g} | {torch_s} | {ratio} | {vs} |")
        lines.append("")
    # Log-log slope of attnlab's time between the two largest lengths (linear-time methods: ≤ 1.15 is the target).
    lines += ["### Time slope between n = 16384 and 65536 (log-log)", "", "| method | f32 | f64 |", "|---|---|---|"]
    for m in sorted(both.method.unique()):
        cells = []
        for dtype in ("f32", "f64"):
            g = both[(both.method == m) & (both.dtype == dtype)].set_index("n")["attnlab_s"]
            cells.append(f"{math.log(g[65536] / g[16384]) / math.log(4):.2f}" if 16384 in g and 65536 in g else "–")
        if cells != ["–", "–"]:
            lines.append(f"| {m} | {cells[0]} | {cells[1]} |")
    lines.append("")
    return "\n".join(lines)


def figure(both, path):
    d = both[both.dtype == "f32"]
    methods = sorted(set(d.method) & set(d[d.torch_s.notna()].method))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for i, m in enumerate(methods):
        g = d[d.method == m].sort_values("n")
        color = plt.get_cmap("tab10")(i % 10)
        axes[0].loglog(g.n, g.attnlab_s, "-o", color=color, ms=3, label=f"{m}")
        axes[0].loglog(g.n, g.torch_s, "--", color=color, lw=1)
        axes[1].semilogx(g.n, g.torch_over_attnlab, "-o", color=color, ms=3, label=m)
    axes[0].set(xlabel="n", ylabel="time per call (s)", title="attnlab (solid) and PyTorch eager (dashed), float32, d = 64")
    axes[1].axhline(1, color="gray", lw=1)
    axes[1].set(xlabel="n", ylabel="PyTorch time / attnlab time", title="above 1: attnlab faster")
    for ax in axes:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from plot import compact_png
    compact_png(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="results/bench")
    a = ap.parse_args()
    both, context = load(a.dir)
    both.to_csv(os.path.join(a.dir, "merged.csv"), index=False)
    with open(os.path.join(a.dir, "table.md"), "w") as f:
        f.write(table(both, context))
    figure(both, os.path.join(a.dir, "bench.png"))
    print(os.path.join(a.dir, "table.md"))


if __name__ == "__main__":
    main()
