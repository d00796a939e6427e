#!/usr/bin/env python3
"""Render the figures of attnlab's experiments from their tidy CSVs (results/*.csv.gz or *.csv) as PNGs
(results/figures/).

    tools/plot.py [--results results] [--out results/figures] [experiment ...]

Each figure names the paper figure it redraws in its caption line. Needs Debian's python3-matplotlib and
python3-pandas (tools/setup.sh --python-stack installs them); run it with /usr/bin/python3 or ATTNLAB_PYTHON.
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.get_cmap("tab20").colors)  # > 10 methods per panel

SCHEMA_VERSION = 1


def csv_path(results, name):
    """results/NAME.csv.gz (the default, compact) or results/NAME.csv; None when neither exists."""
    for ext in (".csv.gz", ".csv"):
        p = os.path.join(results, name + ext)
        if os.path.exists(p):
            return p
    return None


def load(results, name):
    path = csv_path(results, name)
    if path is None:
        sys.exit(f"no {name}.csv.gz or {name}.csv in {results}")
    df = pd.read_csv(path, keep_default_na=False)
    versions = set(df["schema_version"])
    if versions != {SCHEMA_VERSION}:
        sys.exit(f"{path}: schema version {versions}, this script reads {SCHEMA_VERSION}")
    df = df[df["metric"] != "point_done"].copy()
    df["value"] = pd.to_numeric(df["value"], errors="raise")
    df["step"] = pd.to_numeric(df["step"], errors="coerce")  # empty: no step
    for col in ("n", "d", "seed"):  # numbers, not strings (matplotlib would make them categories)
        df[col] = pd.to_numeric(df[col], errors="coerce")
    # "trained/L1H2", "files/head0" -> "trained", "files": the panels aggregate heads (median) by family
    df["family"] = df["source"].str.split("/").str[0]
    return df


def is_head(variant):
    """Model-source spectra name heads "L{layer}H{head}" in the variant column."""
    return isinstance(variant, str) and len(variant) >= 4 and variant[0] == "L" and "H" in variant


def head_of(variant):
    """"L{layer}H{head}" -> (layer, head)."""
    layer, head = variant[1:].split("H")
    return int(layer), int(head)


def panels(k, width=5, height=4):
    """k panels, at most 3 to a row; unused cells hidden. Returns (fig, list of k axes)."""
    cols = min(k, 3)
    rows = (k + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.3), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[k:]:
        ax.set_visible(False)
    return fig, flat[:k]


def caption(fig, text):
    fig.text(0.01, 0.005, text, fontsize=8, style="italic", ha="left", va="bottom")


def finish(fig, out, name, text, bottom=0.04):
    """Every figure ends the same way: its caption (the paper figure it redraws) along the bottom, the layout
    above it, the PNG saved (compact, deterministic) as OUT/NAME.png. Returns the path."""
    caption(fig, text)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return save(fig, out, name)


def plot_pinv(results, out):
    df = load(results, "pinv")
    saved = []
    # Residual histories per landmark count, one panel per source.
    sources = sorted(df["family"].unique())
    fig, axes = panels(len(sources))
    for ax, src in zip(axes, sources):
        d = df[(df.family == src) & (df.metric == "residual")]
        for (variant, spec), g in d.groupby(["variant", "spec"]):
            g = g.groupby("step")["value"].median()
            ax.semilogy(g.index, g.values, "-" if variant == "order3" else "--",
                        label=f"{variant}, {spec.replace('landmarks=', 'm=')}")
        ax.axhline(1e-6, color="gray", lw=0.8)
        ax.axvline(6, color="red", lw=0.8, ls=":")
        heads = d["source"].nunique()
        ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""), xlabel="iteration k",
               ylabel="‖I − A Z_k‖_F")
        ax.legend(fontsize=7)
    saved.append(finish(fig, out, "pinv_residuals",
           "Nyströmformer Lemma 1: iterative pseudo-inverse of softmax landmark matrices; red: the paper's 6 "
           "iterations; solid order-3, dashed Newton–Schulz."))
    # Iterations to 1e-6 against the condition number.
    fig, ax = plt.subplots(figsize=(5.5, 4))
    cond = df[df.metric == "cond"].set_index("point")["value"]
    for i, src in enumerate(sources):
        for variant, marker in (("order3", "o"), ("newton", "s")):
            d = df[(df.metric == "iterations_to_1e-6") & (df.variant == variant) & (df.family == src)]
            d = d.set_index("point")["value"]
            ax.semilogx(cond.loc[d.index], d.values, marker, color=f"C{2 * i}", mfc="none" if variant == "newton"
                        else None, label=f"{src} {variant}")
    ax.set(xlabel="condition number of A", ylabel="iterations to ‖I − AZ‖_F < 1e-6")
    ax.legend(fontsize=7)
    saved.append(finish(fig, out, "pinv_iterations_vs_cond",
           "Iterations needed against the landmark matrix's condition number (the paper uses 6)."))
    # Nyström's attention error against the iteration count, with the SVD pseudo-inverse.
    fig, axes = panels(len(sources))
    for ax, src in zip(axes, sources):
        d = df[(df.family == src) & (df.metric == "nystrom_out_rel_fro")]
        for spec, g in d[d.variant == "order3"].groupby("spec"):
            g = g.groupby("step")["value"].median()
            line, = ax.semilogy(g.index, g.values, "-o", ms=3, label=spec.replace("landmarks=", "m="))
            svd = d[(d.variant == "svd") & (d.spec == spec)]["value"].median()
            ax.axhline(svd, color=line.get_color(), ls=":", lw=1)
        ax.set(title=src, xlabel="order-3 iterations", ylabel="relative output error")
        ax.legend(fontsize=7)
    saved.append(finish(fig, out, "pinv_nystrom_error",
           "Does an unconverged pseudo-inverse help? Nyström's output error against the iteration count; "
           "dotted: the SVD pseudo-inverse; model sources: median over heads."))
    return saved


def plot_error_vs_budget(results, out):
    df = load(results, "error_vs_budget")
    saved = []
    for metric, label in (("P_rel_fro", "‖P − P̃‖_F / ‖P‖_F"), ("out_rel_fro", "‖O − Õ‖_F / ‖O‖_F")):
        sources = sorted(df["family"].unique())
        fig, axes = panels(len(sources), 5.5, 4.5)
        for ax, src in zip(axes, sources):
            d = df[(df.family == src) & (df.metric == metric)]
            heads = d["source"].nunique()
            for variant, g in d.groupby("variant"):
                g = g.groupby("step")["value"].median()
                style = dict(color="black", lw=2.5) if variant == "svd" else {}
                ax.loglog(g.index, g.values, "-o", ms=3, label=variant, **style)
            ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""),
                   xlabel="budget (rank, landmarks, k, features, codes, window, chunk, factor)", ylabel=label)
            ax.legend(fontsize=6, ncol=2)
        if metric == "P_rel_fro":
            text = ("Error of P̃ against budget; black: the Eckart–Young floor, the best rank-R approximation of P: no "
                    "method whose P̃ has rank ≤ R can beat it (sparse methods are not rank-limited and may).")
        else:
            text = ("Error of the outputs O = P̃V against budget; black: the rank-R SVD of P applied to V — a reference, "
                    "not a floor: the best approximation of O is not the best of P, and methods can go below it.")
        saved.append(finish(fig, out, f"error_vs_budget_{metric}",
               text))
    saved += plot_error_vs_cost(df, out)
    return saved


def pareto(points):
    """The non-dominated (cost, error) points, sorted by cost: no other point is both cheaper and more accurate."""
    front, best = [], float("inf")
    for cost, err in sorted(points):
        if err < best:
            front.append((cost, err))
            best = err
    return front


def plot_error_vs_cost(df, out):
    """Error of the outputs against measured cost (float32 time per call, peak memory), per source: every method
    family over its budgets, its own Pareto frontier drawn solid, the frontier over all methods in black."""
    saved = []
    if "cost_time_s" not in set(df["metric"]):
        return saved
    for cost_metric, scale, xlabel, name in (
            ("cost_time_s", 1e3, "time per call, float32 (ms, best of repeats)", "error_vs_cost_time"),
            ("cost_peak_memory_bytes", 1 / 2**20, "peak memory above the inputs (MiB, lower bound)",
             "error_vs_cost_memory")):
        sources = sorted(df["family"].unique())
        fig, axes = panels(len(sources), 5.5, 4.5)
        for ax, src in zip(axes, sources):
            d = df[df.family == src]
            err = d[d.metric == "out_rel_fro"].groupby(["variant", "step"])["value"].median()
            cost = d[d.metric == cost_metric].groupby(["variant", "step"])["value"].median() * scale
            both = pd.concat({"err": err, "cost": cost}, axis=1).dropna()
            both = both[(both.cost > 0) & (both.err > 0)]
            everything = []
            for variant, g in both.groupby(level=0):
                if variant == "svd":
                    continue   # a reference computed by dense SVD, not a method one would run for speed
                pts = list(zip(g.cost, g.err))
                everything += pts
                line, = ax.loglog(g.cost, g.err, "o", ms=3, alpha=0.5)
                front = pareto(pts)
                ax.loglog([c for c, _ in front], [e for _, e in front], "-o", ms=3, color=line.get_color(),
                          label=variant)
            front = pareto(everything)
            if front:
                ax.step([c for c, _ in front], [e for _, e in front], where="post", color="black", lw=1.5,
                        label="frontier (all)")
            if cost_metric == "cost_time_s":
                speed = d[d.metric == "cost_speedup_vs_exact"].set_index(["variant", "step", "source"])["value"]
                t = d[d.metric == "cost_time_s"].set_index(["variant", "step", "source"])["value"]
                exact_ms = (t * speed).median() * scale
                if exact_ms == exact_ms:
                    ax.axvline(exact_ms, color="gray", ls="--", lw=1, label="exact (streaming)")
            heads = d["source"].nunique()
            lo = both.err.min() if not both.empty else 1e-3
            ax.set_ylim(lo / 2, 10)   # methods that explode (CUR, Nyström with the SVD pseudo-inverse) leave the top
            ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""), xlabel=xlabel,
                   ylabel="‖O − Õ‖_F / ‖O‖_F")
            ax.legend(fontsize=6, ncol=2)
        saved.append(finish(fig, out, name,
               "Output error against measured cost per method and budget: faint dots, every budget; solid, each "
               "method's Pareto frontier; black, the frontier over all methods; errors above 10 are off the chart" +
               ("; dashed, exact attention's time." if cost_metric == "cost_time_s" else ".")))
    return saved


def plot_spectrum(results, out):
    df = load(results, "spectrum")
    saved = []
    d = df[df.metric == "cumulative"]
    groups = sorted(d["source"].unique())
    fig, axes = panels(len(groups))
    for ax, src in zip(axes, groups):
        dd = d[d.source == src]
        heads = sorted(v for v in dd["variant"].unique() if is_head(v))
        layers = sorted({head_of(v)[0] for v in heads})
        for variant, g in dd.groupby("variant"):
            g = g.groupby("step")["value"].mean()   # mean over seeds / held-out sequences
            if is_head(variant):   # Linformer Fig. 1 (left): one line per head, coloured by layer
                layer = head_of(variant)[0]
                first = variant == next(v for v in heads if v.startswith(f"L{layer}H"))
                ax.plot(g.index, g.values, lw=0.9, color=plt.get_cmap("viridis")(layer / max(1, len(layers) - 1)),
                        label=f"layer {layer}" if first else None)
            else:
                ax.plot(g.index, g.values, label=variant)
        ax.axvline(128, color="gray", lw=0.8, ls=":")
        ax.set(title=src, xlabel="singular value index", ylabel="normalized cumulative singular value", ylim=(0, 1.02))
        ax.legend(fontsize=7)
    saved.append(finish(fig, out, "spectrum_cumulative",
           "Linformer Fig. 1: normalized cumulative singular values of P (n = 512; model sources: one line per "
           "head, mean over held-out sequences); dotted: index 128."))
    at = df[df.metric == "cumulative_at_128"]
    gen = at[~at["variant"].map(is_head)]
    if len(gen):
        table = gen.pivot_table(index="source", columns="variant", values="value")
        fig, ax = plt.subplots(figsize=(1.2 * len(table.columns) + 2.5, 0.5 * len(table) + 1.8))
        im = ax.imshow(table.values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(table.columns)), table.columns, rotation=30, fontsize=8)
        ax.set_yticks(range(len(table.index)), table.index, fontsize=8)
        for (i, j), v in pd.DataFrame(table.values).stack().items():
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
        fig.colorbar(im, ax=ax)
        saved.append(finish(fig, out, "spectrum_at_128",
               "Cumulative singular value at index 128 per generated source and temperature (n = 512).", bottom=0.06))
    heads = at[at["variant"].map(is_head)].copy()
    if len(heads):   # Linformer Fig. 1 (right): layer x head heatmap of the value at index 128, per model
        heads["layer"] = heads["variant"].map(lambda v: head_of(v)[0])
        heads["head"] = heads["variant"].map(lambda v: head_of(v)[1])
        models = sorted(heads["source"].unique(), key=lambda m: m != "trained")
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models) + 1, 3.8), squeeze=False)
        for ax, model in zip(axes[0], models):
            table = heads[heads.source == model].pivot_table(index="layer", columns="head", values="value")
            im = ax.imshow(table.values, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
            ax.set_xticks(range(len(table.columns)), table.columns)
            ax.set_yticks(range(len(table.index)), table.index)
            for (i, j), v in pd.DataFrame(table.values).stack().items():
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v < 0.6 else "black")
            ax.set(title=f"{model} (n = {int(heads.n.iloc[0])})", xlabel="head", ylabel="layer")
        fig.subplots_adjust(left=0.08, right=0.86, bottom=0.2, wspace=0.3)
        fig.colorbar(im, cax=fig.add_axes([0.89, 0.2, 0.02, 0.68]))
        caption(fig, "Linformer Fig. 1 (right): cumulative singular value at index 128 per layer and head, trained vs "
                     "initialised (mean over held-out sequences).")
        saved.append(save(fig, out, "spectrum_heads_at_128"))
    top = df[df.metric == "top_singular_value"]
    if len(top):
        # One solver per line: the block solver when present (a Lanczos run of the same points gives the same values).
        solver = "block" if (top.spec == "block").any() else top.spec.iloc[0]
        top = top[top.spec == solver]
        fig, ax = plt.subplots(figsize=(6, 4))
        for (src, variant, n), g in top.groupby(["source", "variant", "n"]):
            g = g.groupby("step")["value"].mean()
            ax.semilogy(g.index, g.values / g.values[0], label=f"{src} {variant} n={n}")
        ax.set(xlabel="index", ylabel="σ_i / σ_1")
        ax.legend(fontsize=6, ncol=2)
        saved.append(finish(fig, out, "spectrum_topk",
               f"Top singular values at large n, matrix-free on the exact attention operator ({solver} solver; "
               "mean over seeds)."))
    return saved


def lines_per_source(d, x, xlabel, ylabel, width=5, legend_size=6):
    """A panel per source, a log-log line per variant (mean over seeds) against column x; svd* in bold black."""
    sources = sorted(d["source"].unique())
    fig, axes = panels(len(sources), width, 4)
    for ax, src in zip(axes, sources):
        for variant, g in d[d.source == src].groupby("variant"):
            g = g.groupby(x)["value"].mean()
            style = dict(color="black", lw=2.5) if variant.startswith("svd") else {}
            ax.loglog(g.index, g.values, "-o", ms=3, label=variant, **style)
        ax.set(title=src, xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize=legend_size)
    return fig


def plot_error_vs_length(results, out):
    df = load(results, "error_vs_length")
    fig = lines_per_source(df[df.metric == "P_rel_fro"], "n", "sequence length n", "‖P − P̃‖_F / ‖P‖_F")
    return [finish(fig, out, "error_vs_length",
           "Error against n at a fixed budget (64): can Linformer's k and Nyström's m stay constant as n grows?")]


def plot_performer_mse(results, out):
    df = load(results, "performer_mse")
    saved = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, label in ((axes[0], "kernel_mse", "kernel MSE"), (axes[1], "output_mse", "output MSE")):
        for variant, g in df[df.metric == metric].groupby("variant"):
            g = g.groupby("step")["value"].mean()
            ax.loglog(g.index, g.values, "-o" if variant.startswith("orth") else "--s", ms=3, label=variant)
        if metric == "kernel_mse":
            for variant, g in df[(df.metric == "kernel_mse_lemma2_iid") & df.variant.str.startswith("iid")].groupby("variant"):
                g = g.groupby("step")["value"].mean()
                ax.loglog(g.index, g.values, ":", color="gray")
        ax.set(xlabel="number of random features M", ylabel=label)
        ax.legend(fontsize=7)
    saved.append(finish(fig, out, "performer_mse",
           "Performer Fig. 4: MSE against M (L, d = 16); dotted gray: Lemma 2's closed forms (iid)."))
    g = df[df.metric == "mse_ratio_trig_over_positive"]
    if len(g):
        table = g.pivot_table(index="variant", columns="step", values="value")
        import numpy as np
        with np.errstate(divide="ignore"):
            z = np.log10(table.values)
        z = np.ma.masked_invalid(np.where(np.isfinite(z), z, np.nan))  # θ = 0 (ratio 0) and 180° (MSE_+ = 0)
        fig, ax = plt.subplots(figsize=(7, 4))
        lengths = [float(v.split("=")[1]) for v in table.index]
        mesh = ax.pcolormesh(table.columns, lengths, z, cmap="magma", shading="nearest", vmin=-2, vmax=min(10, z.max()))
        ax.set(xlabel="angle between x and y (degrees)", ylabel="length ‖x‖ = ‖y‖")
        fig.colorbar(mesh, ax=ax, label="log10(MSE_trig / MSE_+)")
        saved.append(finish(fig, out, "performer_mse_ratio",
               "Performer Fig. 2: the trig/positive MSE ratio (Lemma 2) explodes where the kernel is small."))
    return saved


def plot_vq(results, out):
    df = load(results, "vq")
    fig = lines_per_source(df[df.metric == "out_rel_fro"], "step", "codes (Performer: features)",
                           "‖O − Õ‖_F / ‖O‖_F", width=5.5, legend_size=7)
    return [finish(fig, out, "vq",
           "Transformer-VQ (seed 002): error against codebook size; soft assignment over T; Q and K both "
           "quantized (mean-field); Performer read as a soft VQ at equal size.")]


def plot_regimes(results, out):
    df = load(results, "regimes")
    ent = df[df.metric == "entropy"].set_index(["source", "variant", "seed"])["value"]
    d = df[df.metric == "out_rel_fro"].copy()
    d["entropy"] = [ent.loc[(s, v, sd)] for s, v, sd in zip(d.source, d.variant, d.seed)]
    sources = sorted(d["source"].unique())
    fig, axes = panels(len(sources), 5.5, 4)
    for ax, src in zip(axes, sources):
        heads = d[d.source == src]["variant"].map(is_head).any()
        for i, (method, g) in enumerate(d[d.source == src].groupby("method")):
            g = g.groupby("entropy")["value"].mean()
            style = dict(color="black", lw=2.5) if method == "svd" else {}
            # model sources: one point per head at its own entropy (no temperature sweep to connect)
            ax.semilogy(g.index, g.values, "osD^v<>"[i % 7] if heads else "-o", ms=5 if heads else 3,
                        mfc="none" if heads else None, label=method, **style)
        ax.set(title=src + (" (one point per head)" if heads else ""), xlabel="mean row entropy of P (nats)",
               ylabel="‖O − Õ‖_F / ‖O‖_F")
        ax.legend(fontsize=7)
    return [finish(fig, out, "regimes",
           "Scatterbrain Fig. 1: low-rank (performer, svd), sparse (reformer, local) and sparse + low-rank "
           "(scatterbrain) against the attention's entropy (temperature sweep; trained heads at their own entropy).")]


def plot_probsparse(results, out):
    df = load(results, "probsparse")
    saved = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rec = df[df.metric == "top_u_recall"]
    for (src, variant, n), g in rec.groupby(["family", "variant", "n"]):
        g = g.groupby("step")["value"].median()
        axes[0].plot(g.index / 100, g.values, "-o" if variant.startswith("full") else "--s", ms=3,
                     label=f"{src} n={int(n)} {variant}")
    axes[0].set(xlabel="sampling factor c", ylabel="recall of the true top-u queries (by M)", ylim=(0, 1.02))
    axes[0].legend(fontsize=6, ncol=2)
    err = df[(df.metric == "out_rel_fro") & (df.variant == "method")]
    for (src, n), g in err.groupby(["family", "n"]):
        g = g.groupby("step")["value"].median()
        axes[1].plot(g.index / 100, g.values, "-o", ms=3, label=f"{src} n={int(n)}")
    axes[1].set(xlabel="sampling factor c", ylabel="‖O − Õ‖_F / ‖O‖_F")
    axes[1].legend(fontsize=7)
    saved.append(finish(fig, out, "probsparse_recall_error",
           "Informer: recall of the top-u queries ranked by M̄ (all keys, or U = c·ln n sampled) and ProbSparse's "
           "output error against c; model sources: median over heads."))
    q = df[df.metric == "M_quantile"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, ((src, n), g) in enumerate(q.groupby(["family", "n"])):
        heads = g.groupby("source")
        for j, (_, h) in enumerate(heads):   # model sources: one thin line per head
            h = h.groupby("step")["value"].mean()
            ax.plot(h.index, h.values, "-o" if len(heads) == 1 else "-", ms=3, lw=1.5 if len(heads) == 1 else 0.7,
                    color=f"C{2 * i}", label=f"{src} n={int(n)}" + (f" ({len(heads)} heads)" if len(heads) > 1 else "")
                    if j == 0 else None)
    ax.set(xlabel="percentile of queries", ylabel="sparsity measure M = LSE − mean", yscale="symlog")
    ax.legend(fontsize=7)
    saved.append(finish(fig, out, "probsparse_measure_quantiles",
           "The distribution of Informer's M over queries (quantiles): the long tail ProbSparse relies on."))
    return saved


def plot_scaling(results, out):
    import numpy as np
    df = load(results, "scaling")
    t = df[df.metric == "time_s"].pivot_table(index="n", columns="variant", values="value")
    m = df[df.metric == "peak_memory_bytes"].pivot_table(index="n", columns="variant", values="value") / 2 ** 20
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for col in t.columns:
        x, y = t.index.values.astype(float), t[col].values
        ok = np.isfinite(y) & (y > 0)
        slope = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0] if ok.sum() >= 2 else float("nan")
        axes[0].loglog(x, y * 1e3, "-o", ms=3, label=f"{col} (slope {slope:.2f})")
    axes[0].set(xlabel="n", ylabel="time (ms), compute + output")
    axes[0].legend(fontsize=6)
    for col in m.columns:
        axes[1].loglog(m.index, m[col].clip(lower=1e-2), "-o", ms=3, label=col)
    axes[1].set(xlabel="n", ylabel="peak memory above inputs (MiB, lower bound)")
    axes[1].legend(fontsize=6)
    return [finish(fig, out, "scaling",
           "Nyströmformer Table 1 / Linformer Table 3 analogues (float32, d = 64, 2 cores): time and peak memory "
           "against n, with fitted log-log slopes.")]


def save(fig, out, name):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    compact_png(path)
    return path


def compact_png(path):
    """Re-save as a 256-colour palette PNG: line plots need no more, and the committed figures shrink ~3x
    (results/ has a 5 MB budget). Deterministic: the same figure gives the same bytes."""
    try:
        from PIL import Image
    except ImportError:   # matplotlib's own dependency on Debian; without it the RGBA file stays
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


PLOTS = {"spectrum": plot_spectrum, "pinv": plot_pinv, "error_vs_budget": plot_error_vs_budget,
         "error_vs_length": plot_error_vs_length, "performer_mse": plot_performer_mse, "vq": plot_vq,
         "regimes": plot_regimes, "probsparse": plot_probsparse, "scaling": plot_scaling}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", help=f"which (default: all of {', '.join(PLOTS)} with a CSV)")
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=None, help="default: RESULTS/figures")
    a = ap.parse_args()
    out = a.out or os.path.join(a.results, "figures")
    names = a.experiments or [n for n in PLOTS if csv_path(a.results, n)]
    for n in names:
        if n not in PLOTS:
            sys.exit(f"no plot for '{n}'; known: {', '.join(PLOTS)}")
        for p in PLOTS[n](a.results, out):
            print(p)


if __name__ == "__main__":
    main()
