"""Performer Fig. 4 and Fig. 2: kernel and output MSE against M; Lemma 2's MSE ratio."""
import matplotlib.pyplot as plt

from .common import load, finish


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
