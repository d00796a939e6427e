"""Performer Fig. 4 and Fig. 2: kernel and output MSE against M; Lemma 2's MSE ratio."""
import numpy as np

from .common import finish, log_ticks, plt
from .data import load

# Colour: the feature map; line: iid (dashed, squares) or orthogonal (solid, circles) features; Lemma 2's closed
# form for iid features dotted in the feature map's colour.
FEATURE_COLOURS = {"positive": "#d62728", "trig": "#1f77b4", "hyperbolic": "#2ca02c"}


def style(variant):
    draw, feat = variant.split("/", 1)
    return dict(color=FEATURE_COLOURS.get(feat, "0.4"), ls="--" if draw == "iid" else "-",
                marker="s" if draw == "iid" else "o", ms=4, label=f"{feat}, {draw}")


def plot_performer_mse(results, out):
    df = load(results, "performer_mse")
    saved = []
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.2))
    feats = [v for v in sorted(df[df.metric == "kernel_mse"]["variant"].unique(), key=lambda v: (v.split("/")[1], v))]
    for ax, metric, label in ((axes[0], "kernel_mse", "kernel MSE"), (axes[1], "output_mse", "output MSE")):
        for variant in feats:
            g = df[(df.metric == metric) & (df.variant == variant)].groupby("step")["value"].mean()
            if len(g):
                ax.loglog(g.index, g.values, **style(variant))
        if metric == "kernel_mse":
            lemma = df[(df.metric == "kernel_mse_lemma2_iid") & df.variant.str.startswith("iid")]
            for variant, g in lemma.groupby("variant"):
                g = g.groupby("step")["value"].mean()
                ax.loglog(g.index, g.values, ":", lw=1.5, color=style(variant)["color"], label="_nolegend_")
        ax.set(xlabel="number of random features M", ylabel=label)
        log_ticks(ax, df[df.metric == metric]["step"].dropna().unique())
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    k = df[df.metric == "kernel_mse"]
    shape = (int(k.n.iloc[0]), int(k.d.iloc[0])) if len(k) else ("?", "?")
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="0.3", ls=":", lw=1.5))
    labels.append("Lemma 2, iid (closed form)")
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.835, 0.55), frameon=False)
    saved.append(finish(fig, out, "performer_mse",
           "Performer Fig. 4: MSE of the softmax-kernel estimate and of the outputs against the number of features "
           f"M (n = {shape[0]}, d = {shape[1]}); colour: feature map; dashed: iid features, solid: orthogonal; "
           "dotted: Lemma 2's closed form for iid features in the same colour.", right=0.83))
    g = df[df.metric == "mse_ratio_trig_over_positive"]
    if len(g):
        table = g.pivot_table(index="variant", columns="step", values="value")
        with np.errstate(divide="ignore"):
            z = np.log10(table.values)
        z = np.ma.masked_invalid(np.where(np.isfinite(z), z, np.nan))  # θ = 0 (ratio 0) and 180° (MSE_+ = 0)
        fig, ax = plt.subplots(figsize=(7, 4))
        lengths = [float(v.split("=")[1]) for v in table.index]
        mesh = ax.pcolormesh(table.columns, lengths, z, cmap="magma", shading="nearest", vmin=-2, vmax=min(10, z.max()))
        ax.set(xlabel="angle between x and y (degrees)", ylabel="length ‖x‖ = ‖y‖")
        fig.colorbar(mesh, ax=ax, label="log₁₀(MSE trig / MSE positive)")
        saved.append(finish(fig, out, "performer_mse_ratio",
               "Performer Fig. 2: the ratio of the trig to the positive estimator's MSE (Lemma 2) explodes where the "
               "kernel is small (antipodal x, y); blank: undefined (a zero MSE); clipped at 10¹⁰."))
    return saved
