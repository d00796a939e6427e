#!/usr/bin/env python3
"""The side-by-side benchmark's table and figure from results/bench/attnlab.json and attnlab_fast.json (Google
Benchmark: the default and the fast build, tools/bench.sh) and peers.csv (tools/bench_peers.py): time against n per
method, attnlab beside PyTorch eager, and the ratios that matter (each method against exact streaming attention and
against its PyTorch transcription, all measured in the same job).

    tools/plot_bench.py [--dir results/bench]
"""
import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_data import BUILDS, allocator_frame, load  # noqa: E402  (the frames; no matplotlib there)


def fmt(x, spec=".3g"):
    return "–" if x != x else format(x, spec)


def table(both, contexts):
    c = next(iter(contexts.values()))
    lines = [f"Machine: {c.get('num_cpus', '?')} CPUs at {c.get('mhz_per_cpu', '?')} MHz; "
             f"OpenBLAS core type (PyTorch and the fast build): {', '.join(sorted(set(both.openblas_coretype.dropna())))}; "
             f"allocator for all: GLIBC_TUNABLES={', '.join(sorted(set(both.glibc_tunables.fillna('')) - {''})) or '(unset: glibc defaults, as users run)'}; "
             f"{c.get('attnlab_cost_context', '')}.", ""]
    for build, ctx in contexts.items():
        lines.append(f"- attnlab {build} build: -march={ctx.get('attnlab_arch', '?')}, products by "
                     f"{ctx.get('attnlab_products', '?')}")
    lines.append("")
    wide = both.pivot_table(index=["dtype", "method", "n"], columns="build",
                            values=["attnlab_s", "torch_over_attnlab", "speedup_vs_exact"])
    torch_s = both.groupby(["dtype", "method", "n"]).torch_s.first()
    builds = [b for b in BUILDS if b in contexts]
    for dtype in sorted(both.dtype.unique()):
        lines += [f"### {dtype}", "",
                  "| method | n | " + " | ".join(f"attnlab {b} (s)" for b in builds) + " | PyTorch eager (s) | "
                  + " | ".join(f"PyTorch / {b}" for b in builds) + " | "
                  + " | ".join(f"exact / method ({b})" for b in builds) + " |",
                  "|---|---|" + "---|" * (3 * len(builds) + 1)]
        for (dt, m, n), r in wide.iterrows():
            if dt != dtype or n not in (4096, 16384):
                continue
            cells = [fmt(r[("attnlab_s", b)], ".4g") for b in builds] + [fmt(torch_s[(dt, m, n)], ".4g")]
            cells += [fmt(r[("torch_over_attnlab", b)], ".2f") for b in builds]
            cells += [fmt(r[("speedup_vs_exact", b)], ".2f") for b in builds]
            lines.append(f"| {m} | {n} | " + " | ".join(cells) + " |")
        lines.append("")
    # Log-log slope of attnlab's time between the two largest lengths (linear-time methods: ≤ 1.15 is the target).
    cols = [(b, dt) for b in builds for dt in ("f32", "f64")]
    lines += ["### Time slope between n = 16384 and 65536 (log-log)", "",
              "| method | " + " | ".join(f"{dt} {b}" for b, dt in cols) + " |", "|---|" + "---|" * len(cols)]
    for m in sorted(both.method.unique()):
        cells = []
        for b, dtype in cols:
            g = both[(both.method == m) & (both.dtype == dtype) & (both.build == b)].set_index("n")["attnlab_s"]
            cells.append(f"{math.log(g[65536] / g[16384]) / math.log(4):.2f}" if 16384 in g and 65536 in g else "–")
        if set(cells) != {"–"}:
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def allocator_table(dirname):
    """The default build and PyTorch with glibc's defaults (as users run) and with GLIBC_TUNABLES raising the mmap and
    trim thresholds (freed buffers stay mapped): what the setting changes, per method. Target: ≤ 1.3× for attnlab."""
    a, ctx = allocator_frame(dirname)
    if a is None:
        return ""
    lines = ["### The allocator setting: glibc defaults against GLIBC_TUNABLES", "",
             f"Default build; {ctx.get('glibc_tunables', '')!s} in the second run. A ratio above 1: slower without the "
             "setting (page faults on buffers freed and mapped again). Target for attnlab: ≤ 1.3.", "",
             "| dtype | method | n | attnlab (s) | with tunables (s) | ratio | PyTorch (s) | with tunables (s) | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in a.sort_values(["dtype", "method", "n"]).itertuples():
        if r.n not in (4096, 16384):
            continue
        lines.append(f"| {r.dtype} | {r.method} | {r.n} | {fmt(r.attnlab_s, '.4g')} | {fmt(r.attnlab_s_tunables, '.4g')} | "
                     f"{fmt(r.ratio, '.2f')} | {fmt(r.seconds, '.4g')} | {fmt(r.seconds_tunables, '.4g')} | "
                     f"{fmt(r.torch_ratio, '.2f')} |")
    worst = a[a.n.isin([4096, 16384])].ratio.max()
    lines += ["", f"Largest attnlab ratio: {fmt(worst, '.2f')}.", ""]
    return "\n".join(lines)


def figure(both, path):
    d = both[both.dtype == "f32"]
    methods = sorted(set(d.method) & set(d[d.torch_s.notna()].method))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    style = {"fast": "-o", "default": ":"}
    labelled = "fast" if (d.build == "fast").any() else "default"
    for i, m in enumerate(methods):
        color = plt.get_cmap("tab10")(i % 10)
        for build, ls in style.items():
            g = d[(d.method == m) & (d.build == build)].sort_values("n")
            if g.empty:
                continue
            label = m if build == labelled else None
            axes[0].loglog(g.n, g.attnlab_s, ls, color=color, ms=3, label=label)
            axes[1].semilogx(g.n, g.torch_over_attnlab, ls, color=color, ms=3, label=label)
        g = d[(d.method == m)].drop_duplicates("n").sort_values("n")
        axes[0].loglog(g.n, g.torch_s, "--", color=color, lw=1)
    axes[0].set(xlabel="n", ylabel="time per call (s)",
                title="attnlab fast build (solid), default build (dotted), PyTorch eager (dashed); float32, d = 64")
    axes[1].axhline(1, color="gray", lw=1)
    axes[1].set(xlabel="n", ylabel="PyTorch time / attnlab time",
                title="above 1: attnlab faster (solid: fast build, dotted: default build)")
    for ax in axes:
        ax.legend(fontsize=7, ncol=2)
        ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    from figures.common import compact_png   # here, not at the top: importing it sets the figures' rcParams
    compact_png(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="results/bench")
    a = ap.parse_args()
    both, contexts = load(a.dir)
    both.to_csv(os.path.join(a.dir, "merged.csv"), index=False)
    with open(os.path.join(a.dir, "table.md"), "w") as f:
        f.write(table(both, contexts))
        f.write(allocator_table(a.dir))
        paths = os.path.join(a.dir, "cost_paths.md")
        if os.path.exists(paths):
            f.write("\n### Every path that reports a cost, in one run\n\n" + open(paths).read())
    figure(both, os.path.join(a.dir, "bench.png"))
    print(os.path.join(a.dir, "table.md"))


if __name__ == "__main__":
    main()
