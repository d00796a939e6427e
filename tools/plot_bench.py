#!/usr/bin/env python3
"""The side-by-side benchmark's table and figure from results/bench/attnlab.json and attnlab_fast.json (Google
Benchmark: the default and the fast build, tools/bench.sh) and peers.csv (tools/bench_peers.py): time against n per
method, attnlab beside PyTorch eager, and the ratios that matter (each method against exact streaming attention and
against its PyTorch transcription, all measured in the same job). The backward suite likewise (backward.json,
backward_fast.json, peers_backward.csv → backward.md, backward.png, backward_merged.csv).

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
from bench_data import BUILDS, allocator_frame, load, load_backward  # noqa: E402  (the frames; no matplotlib)

BACKWARD_TARGET = 1.5       # every approximation's backward: ≥ 1.5 × PyTorch autograd of its transcription
GEMM_FRACTION_TARGET = 0.6  # exact backward's rate (10·n²·d flops) over the in-run GEMM rate


def fmt(x, spec=".3g"):
    return "–" if x != x else format(x, spec)


def machine(c):
    """The device a run's costs hold for, as its context recorded it (the CPU's name since the suite records it)."""
    cpu = c.get("attnlab_cpu") or "CPU model not recorded by this run"
    return f"{cpu}, {c.get('num_cpus', '?')} CPUs at {c.get('mhz_per_cpu', '?')} MHz"


def table(both, contexts):
    c = next(iter(contexts.values()))
    tunables = ", ".join(sorted(set(both.glibc_tunables.fillna("")) - {""})) or "(unset: glibc defaults, as users run)"
    lines = [f"Machine: {machine(c)}; "
             "OpenBLAS core type (PyTorch and the fast build): "
             f"{', '.join(sorted(set(both.openblas_coretype.dropna())))}; "
             f"allocator for all: GLIBC_TUNABLES={tunables}; "
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
             "| dtype | method | n | attnlab (s) | with tunables (s) | ratio | PyTorch (s) | with tunables (s) "
             "| ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in a.sort_values(["dtype", "method", "n"]).itertuples():
        if r.n not in (4096, 16384):
            continue
        lines.append(f"| {r.dtype} | {r.method} | {r.n} | {fmt(r.attnlab_s, '.4g')} | "
                     f"{fmt(r.attnlab_s_tunables, '.4g')} | {fmt(r.ratio, '.2f')} | {fmt(r.seconds, '.4g')} | "
                     f"{fmt(r.seconds_tunables, '.4g')} | {fmt(r.torch_ratio, '.2f')} |")
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


def backward_table(d, contexts):
    """The backward suite: per method at n = 4096 and 16384, attnlab's backward and training step (forward +
    backward) beside PyTorch autograd of the eager transcription, and exact's backward rate against the GEMM's."""
    builds = [b for b in BUILDS if b in contexts]
    c = next(iter(contexts.values()))
    lines = [f"Machine: {machine(c)}; OpenBLAS core type "
             f"(PyTorch and the fast build): {', '.join(sorted(set(d.openblas_coretype.dropna())))}; "
             f"GLIBC_TUNABLES unset (as users run); {c.get('attnlab_cost_context', '')}. Builds: "
             + "; ".join(f"{b}: -march={contexts[b].get('attnlab_arch', '?')}, products by "
                         f"{contexts[b].get('attnlab_products', '?')}" for b in builds) + ".", ""]
    for dtype in sorted(d.dtype.unique()):
        e = d[(d.method == "exact") & (d.dtype == dtype)]
        lines += [f"### {dtype}: exact attention's backward against the GEMM (target ≥ {GEMM_FRACTION_TARGET})", "",
                  "| build | n | backward (s) | GFLOP/s (10·n²·d) | best in-run GEMM GFLOP/s | fraction |",
                  "|---|---|---|---|---|---|"]
        for r in e.sort_values(["build", "n"]).itertuples():
            lines.append(f"| {r.build} | {r.n} | {fmt(r.backward_s, '.4g')} | {fmt(r.exact_gflops, '.1f')} | "
                         f"{fmt(r.gemm_best_gflops, '.1f')} | {fmt(r.gemm_fraction, '.2f')} |")
        lines += ["", f"### {dtype}: backward and step (forward + backward), attnlab against PyTorch autograd "
                  f"(target at n = 16384: PyTorch / attnlab ≥ {BACKWARD_TARGET})", "",
                  "| method | n | " + " | ".join(f"backward {b} (s)" for b in builds) + " | PyTorch backward (s) | "
                  + " | ".join(f"PyTorch / {b}" for b in builds) + " | "
                  + " | ".join(f"step {b} (s)" for b in builds) + " | PyTorch step (s) | "
                  + " | ".join(f"step PyTorch / {b}" for b in builds) + " |",
                  "|---|---|" + "---|" * (4 * len(builds) + 2)]
        g = d[(d.dtype == dtype) & (d.method != "gemm") & d.n.isin([4096, 16384])]
        for (m, n), r in g.groupby(["method", "n"]):
            by = {b: r[r.build == b].iloc[0] if (r.build == b).any() else None for b in builds}
            cell = lambda b, col, spec: fmt(by[b][col], spec) if by[b] is not None and col in by[b] else "–"  # noqa
            first = r.iloc[0]
            tb = first.get("torch_backward_s", float("nan"))
            ts = first.get("torch_step_s", float("nan"))
            cells = [cell(b, "backward_s", ".4g") for b in builds] + [fmt(tb, ".4g")]
            cells += [cell(b, "torch_over_attnlab_backward", ".2f") for b in builds]
            cells += [cell(b, "step_s", ".4g") for b in builds] + [fmt(ts, ".4g")]
            cells += [cell(b, "torch_over_attnlab_step", ".2f") for b in builds]
            lines.append(f"| {m} | {n} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def backward_figure(d, path):
    """float32, n = 16384: PyTorch autograd's time over attnlab's for the backward and for the step (bars, the
    target line), and exact's backward rate against n beside the GEMM's best rate."""
    d = d[d.dtype == "f32"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [2, 2, 1.3]})
    at = d[(d.n == 16384) & (d.method != "gemm") & d.torch_backward_s.notna()]
    methods = sorted(at.method.unique())
    builds = [b for b in ("default", "fast") if (at.build == b).any()]
    width = 0.8 / max(1, len(builds))
    for ax, col, what in ((axes[0], "torch_over_attnlab_backward", "backward"),
                          (axes[1], "torch_over_attnlab_step", "training step (forward + backward)")):
        for j, b in enumerate(builds):
            g = at[at.build == b].set_index("method").reindex(methods)
            ax.bar([i + (j - (len(builds) - 1) / 2) * width for i in range(len(methods))], g[col], width,
                   label=f"attnlab {b} build", color=f"C{j}")
        ax.axhline(BACKWARD_TARGET, color="k", ls="--", lw=1, label=f"target {BACKWARD_TARGET}×")
        ax.axhline(1, color="gray", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels(methods, rotation=35, ha="right")
        ax.set(ylabel="PyTorch autograd time / attnlab time", title=f"{what}, float32, n = 16384, d = 64")
        ax.legend(fontsize=8)
    e = d[d.method == "exact"]
    for j, b in enumerate(b for b in ("default", "fast") if (e.build == b).any()):
        g = e[e.build == b].sort_values("n")
        axes[2].semilogx(g.n, g.exact_gflops, "-o", color=f"C{j}", ms=4, label=f"exact backward, {b}")
        axes[2].axhline(g.gemm_best_gflops.iloc[0], color=f"C{j}", ls=":", lw=1, label=f"best GEMM, {b}")
    axes[2].set(xlabel="n", ylabel="GFLOP/s (backward: 10·n²·d flops)", title="exact backward against the GEMM")
    axes[2].set_ylim(bottom=0)
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    from figures.common import compact_png
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
    back, contexts = load_backward(a.dir)
    if back is not None:
        back.to_csv(os.path.join(a.dir, "backward_merged.csv"), index=False)
        with open(os.path.join(a.dir, "backward.md"), "w") as f:
            f.write(backward_table(back, contexts))
        backward_figure(back, os.path.join(a.dir, "backward.png"))
        print(os.path.join(a.dir, "backward.md"))


if __name__ == "__main__":
    main()
