"""The low-rank claim: singular-value spectra of P (Linformer Fig. 1)."""
import matplotlib.pyplot as plt
import pandas as pd

from .common import load, is_head, head_of, panels, caption, finish, save


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
