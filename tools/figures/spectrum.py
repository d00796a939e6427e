"""The low-rank claim: singular-value spectra of P (Linformer Fig. 1)."""
import matplotlib.pyplot as plt
import pandas as pd

from .common import caption, finish, panels, save
from .data import is_model_head, load

# Temperatures in one sequential hue (light: cold), so that the order reads off the colour; heads by layer (viridis).
TEMPS = plt.get_cmap("plasma")


def t_colour(variant, variants):
    """The colour of 'T=x' among the variants' temperatures."""
    ts = sorted({float(v.split("=")[1]) for v in variants if v.startswith("T=")})
    t = float(variant.split("=")[1])
    return TEMPS(0.85 * ts.index(t) / max(1, len(ts) - 1))


def by_temperature(variants):
    return sorted(variants, key=lambda v: float(v.split("=")[1]) if v.startswith("T=") else float("inf"))


def labelled(df):
    """The rows with a line label: the variant (T=x), or for the user's files (a head, no layer) "head=h"; a model
    head's lines are named by its layer and head columns."""
    files = df["head"].notna() & ~is_model_head(df)
    return df.assign(label=df["variant"].where(~files, "head=" + df["head"].fillna(0).astype(int).astype(str)))


def lines(d):
    """The lines of one source's labelled rows, in drawing order: (kind, name, rows) — ("T", "T=x", ...) per
    temperature (by temperature), then ("head", (layer, head), ...) per model head and ("other", label, ...) for the
    rest (the user's files: "head=h"), in the rows' order."""
    temps = d[d.label.str.startswith("T=")]
    out = [("T", v, temps[temps.label == v]) for v in by_temperature(temps["label"].unique())]
    rest = d[~d.label.str.startswith("T=")]
    for (layer, head), g in rest[is_model_head(rest)].groupby(["layer", "head"], sort=False):
        out.append(("head", (int(layer), int(head)), g))
    other = rest[~is_model_head(rest)]
    for label in other["label"].unique():
        out.append(("other", label, other[other.label == label]))
    return out


def plot_spectrum(results, out):
    df = labelled(load(results, "spectrum"))
    saved = []
    d = df[df.metric == "cumulative"]
    groups = sorted(d["source"].unique())
    fig, axes = panels(len(groups))
    for ax, src in zip(axes, groups):
        dd = d[d.source == src]
        heads = dd[is_model_head(dd)][["layer", "head"]].drop_duplicates().astype(int)
        layers = sorted(heads["layer"].unique())
        for kind, name, rows in lines(dd):
            g = rows.groupby("step")["value"].mean()   # mean over seeds / held-out sequences
            if kind == "head":   # Linformer Fig. 1 (left): one line per head, coloured by layer
                layer, head = name
                first = head == sorted(heads[heads.layer == layer]["head"])[0]
                # not the last yellow: unreadable on white
                colour = plt.get_cmap("viridis")(0.85 * layer / max(1, len(layers) - 1))
                ax.plot(g.index, g.values, lw=0.9, color=colour,
                        label=f"layer {layer}" if first else None)
            elif kind == "T":
                ax.plot(g.index, g.values, lw=1.6, color=t_colour(name, dd["label"].unique()),
                        label=name.replace("=", " = "))
            else:
                ax.plot(g.index, g.values, lw=1.6, label=name)
        ax.axvline(128, color="gray", lw=0.8, ls=":")
        ax.set(title=src, xlabel="singular value index", ylabel="normalized cumulative singular value", ylim=(0, 1.02))
        ax.grid(True, lw=0.3, alpha=0.5)
        ax.legend(loc="lower right")   # the curves rise to 1 at the left: the lower right is empty
    saved.append(finish(fig, out, "spectrum_cumulative",
           "Linformer Fig. 1: normalized cumulative singular values of P (n = 512; model sources: one line per "
           "head, mean over held-out sequences); dotted: index 128."))
    at = df[df.metric == "cumulative_at_128"]
    gen = at[~is_model_head(at)]
    if len(gen):
        table = gen.pivot_table(index="source", columns="label", values="value")
        fig, ax = plt.subplots(figsize=(1.2 * len(table.columns) + 2.5, 0.5 * len(table) + 1.8))
        im = ax.imshow(table.values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(table.columns)), table.columns, rotation=30, fontsize=8)
        ax.set_yticks(range(len(table.index)), table.index, fontsize=8)
        for (i, j), v in pd.DataFrame(table.values).stack().items():
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
        fig.colorbar(im, ax=ax)
        saved.append(finish(fig, out, "spectrum_at_128",
               "Cumulative singular value at index 128 per generated source and temperature (n = 512).", bottom=0.06))
    heads = at[is_model_head(at)].astype({"layer": int, "head": int})
    if len(heads):   # Linformer Fig. 1 (right): layer x head heatmap of the value at index 128, per model
        order = {"trained": 0, "initialized": 1, "pretrained": 2}
        models = sorted(heads["source"].unique(), key=lambda m: order.get(m, 3))
        widths = [heads[heads.source == m]["head"].nunique() + 2 for m in models]   # a panel's width: its heads
        fig, axes = plt.subplots(1, len(models), figsize=(0.55 * sum(widths) + 2, 3.8), squeeze=False,
                                 gridspec_kw={"width_ratios": widths})
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
        caption(fig, "Linformer Fig. 1 (right): cumulative singular value at index 128 per layer and head — the "
                     "project's trained and initialised byte-level models, and the pretrained all-MiniLM-L6-v2 "
                     "(mean over held-out sequences).")
        saved.append(save(fig, out, "spectrum_heads_at_128"))
    top = df[df.metric == "top_singular_value"]
    if len(top):
        # One solver per line: the block solver when present (a Lanczos run of the same points gives the same values).
        solver = "block" if (top.spec == "block").any() else top.spec.iloc[0]
        top = top[top.spec == solver]
        srcs = sorted(top["source"].unique())
        fig, axes = plt.subplots(1, len(srcs), figsize=(4.2 * len(srcs), 3.6), squeeze=False, sharey=True)
        for ax, src in zip(axes[0], srcs):   # one panel per source: a line per temperature (and length)
            t = top[top.source == src]
            lengths = sorted(t["n"].unique())
            for variant in by_temperature(t["label"].unique()):
                for j, n in enumerate(lengths):
                    g = t[(t.label == variant) & (t.n == n)].groupby("step")["value"].mean()
                    if g.empty:
                        continue
                    colour = t_colour(variant, t["label"].unique()) if variant.startswith("T=") else None
                    ax.semilogy(g.index + 1, g.values / g.values[0], ["-", "--", ":"][j % 3], lw=1.6,
                                color=colour, label=variant.replace("=", " = ") +
                                (f", n = {int(n)}" if len(lengths) > 1 else ""))
            ax.set(title=f"{src} (n = {', '.join(str(int(n)) for n in lengths)})", xlabel="index i")
            ax.grid(True, which="major", lw=0.3, alpha=0.5)
            ax.legend(loc="lower left")
        axes[0][0].set_ylabel("σᵢ / σ₁")
        saved.append(finish(fig, out, "spectrum_topk",
               f"Top singular values of P at large n, computed matrix-free on the exact attention operator ({solver} "
               "solver; mean over seeds), relative to the largest."))
    return saved
