#!/usr/bin/env python3
"""The side-by-side benchmark's table and figure from results/bench/attnlab.json and attnlab_fast.json (Google
Benchmark: the default and the fast build, tools/bench.sh) and peers.csv (tools/bench_peers.py): time against n per
method, attnlab beside PyTorch eager, and the ratios that matter (each method against exact streaming attention and
against its PyTorch transcription, all measured in the same job).

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


BUILDS = {"default": "attnlab.json", "fast": "attnlab_fast.json"}


def read_suite(path, build):
    bm = json.load(open(path))
    rows = []
    for b in bm["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        name, dtype, n = b["name"].split("/")[:3]
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        rows.append({"build": build, "method": name, "dtype": dtype, "n": int(n.split(":")[1]),
                     "attnlab_s": b["real_time"] * unit})
    return pd.DataFrame(rows), bm.get("context", {})


def load(dirname):
    """One row per (build, method, dtype, n): attnlab's time, PyTorch's, their ratio, the speed-up over exact
    attention in the same build and run."""
    frames, contexts = [], {}
    for build, fname in BUILDS.items():
        if os.path.exists(os.path.join(dirname, fname)):
            f, contexts[build] = read_suite(os.path.join(dirname, fname), build)
            frames.append(f)
    ours = pd.concat(frames, ignore_index=True)
    peers = pd.read_csv(os.path.join(dirname, "peers.csv")).rename(columns={"seconds": "torch_s"})
    if "glibc_tunables" not in peers:
        peers["glibc_tunables"] = ""
    both = ours.merge(peers[["method", "dtype", "n", "torch_s", "openblas_coretype", "glibc_tunables"]],
                      on=["method", "dtype", "n"], how="left")
    exact = ours[ours.method == "exact"].set_index(["build", "dtype", "n"])["attnlab_s"]
    both["speedup_vs_exact"] = [exact.get((r.build, r.dtype, r.n), float("nan")) / r.attnlab_s
                                for r in both.itertuples()]
    both["torch_over_attnlab"] = both.torch_s / both.attnlab_s
    for build, c in contexts.items():
        both.loc[both.build == build, "arch"] = c.get("attnlab_arch", "")
        both.loc[both.build == build, "products"] = c.get("attnlab_products", "")
    return both, contexts


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


def allocator_frame(dirname):
    """(frame, context): per (method, dtype, n) the default build's time without and with GLIBC_TUNABLES (attnlab_s,
    attnlab_s_tunables, ratio) and PyTorch's (seconds, seconds_tunables, torch_ratio); (None, {}) without those runs."""
    pairs = [("attnlab.json", "attnlab_tunables.json"), ("peers.csv", "peers_tunables.csv")]
    if not all(os.path.exists(os.path.join(dirname, f)) for p in pairs for f in p):
        return None, {}
    plain, _ = read_suite(os.path.join(dirname, "attnlab.json"), "default")
    tuned, ctx = read_suite(os.path.join(dirname, "attnlab_tunables.json"), "default")
    a = plain.merge(tuned, on=["method", "dtype", "n"], suffixes=("", "_tunables"))
    tp = pd.read_csv(os.path.join(dirname, "peers.csv")).merge(pd.read_csv(os.path.join(dirname, "peers_tunables.csv")),
                                                               on=["method", "dtype", "n"], suffixes=("", "_tunables"))
    a = a.merge(tp[["method", "dtype", "n", "seconds", "seconds_tunables"]], on=["method", "dtype", "n"], how="left")
    a["ratio"] = a.attnlab_s / a.attnlab_s_tunables
    a["torch_ratio"] = a.seconds / a.seconds_tunables
    return a, ctx


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
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


if __name__ == "__main__":
    main()
