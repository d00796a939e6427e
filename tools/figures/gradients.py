"""How far each method's gradients are from exact attention's, beside its output error (the `gradients` experiment)."""
import numpy as np

from .common import family_key, family_label, family_style, finish, panels, plt  # noqa: F401
from .data import is_model_head, load

GRADS = (("dq", "dQ"), ("dk", "dK"), ("dv", "dV"))


def budget_family(d):
    """A row's family as its spec names it (linformer's projection apart), for the colours and the legend."""
    return d["spec"].map(family_key)


def plot_gradients(results, out):
    df = load(results, "gradients")
    df = df.assign(family=budget_family(df))
    return [_versus_output(df, out), _versus_budget(df, out)]


def _versus_output(df, out):
    """Gradient error against output error, one point per method, budget and problem: under the diagonal a method's
    gradients are closer than its output, above it worse than its output suggests."""
    wide = df[df.metric.str.endswith("_rel_fro")].pivot_table(
        index=["source", "variant", "seed", "layer", "head", "spec", "family"], columns="metric", values="value",
        dropna=False).reset_index().dropna(subset=["output_rel_fro"])
    model = wide["layer"].notna()
    fig, axes = panels(3, 4.2, 3.9)
    families = sorted(wide.family.unique())
    lo = max(1e-4, np.nanmin(wide[["output_rel_fro", "dq_rel_fro", "dk_rel_fro", "dv_rel_fro"]].values) / 1.5)
    hi = min(10.0, np.nanmax(wide[["output_rel_fro", "dq_rel_fro", "dk_rel_fro", "dv_rel_fro"]].values) * 1.5)
    for ax, (g, label) in zip(axes, GRADS):
        for fam in families:
            st = family_style(fam)
            for mask, fill in ((~model, st["color"]), (model, "none")):
                w = wide[(wide.family == fam) & mask]
                ax.loglog(w["output_rel_fro"], w[f"{g}_rel_fro"], ls="none", marker=st["marker"], ms=4.5,
                          mfc=fill, mec=st["color"], mew=1.0, alpha=0.8)
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8, ls="--")
        ax.set(xlim=(lo, hi), ylim=(lo, hi), title=f"{label}: gradient error against output error",
               xlabel="output error ‖Õ − O‖_F / ‖O‖_F",
               ylabel=f"{label} error ‖{label}(method) − {label}‖_F / ‖{label}‖_F")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles = [plt.Line2D([], [], ls="none", marker=family_style(f)["marker"], color=family_style(f)["color"], ms=5)
               for f in families]
    handles += [plt.Line2D([], [], ls="none", marker="o", color="0.3", ms=5),
                plt.Line2D([], [], ls="none", marker="o", mfc="none", mec="0.3", ms=5)]
    labels = [family_label(f) for f in families] + ["generated Q, K, V", "trained models' heads"]
    w, h = fig.get_size_inches()
    fig.set_size_inches(w + 1.9, h)
    right = w / (w + 1.9)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.005, 0.55), frameon=False)
    return finish(fig, out, "gradients",
                  "Gradients of L = ⟨dO, O⟩ against exact attention's, per method, budget and problem (generated "
                  "sources, Gaussian dO: filled; the trained models' heads with their own held-out-loss dO: open), "
                  "n = 512; above the dashed diagonal a method's gradient is further from exact than its output "
                  "(axes end at 10: Nyström with the SVD pseudo-inverse and Gaussian Linformer have points beyond).",
                  right=right)


# The budget figure's two rows: low-rank and kernel methods; sparse, sampled and clustering methods (≤ 5 series a
# panel).
LOW_RANK = ("nystrom", "nystrom_svd", "linformer_pool", "linformer_gaussian", "performer")


def _versus_budget(df, out):
    """Per family, the error against the budget on the trained bidirectional model's heads with the model's own dO
    (median over heads): output, dQ, dK, dV in one column each; low-rank families above, sparse ones below."""
    d = df[(df.source == "trained") & (df.variant == "dO=model") & df.step.notna() & (df.step >= 0)]
    if d.empty:   # an export without upstream gradients: the Gaussian dO instead
        d = df[(df.source == "trained") & df.step.notna() & (df.step >= 0)]
    fig, grid = plt.subplots(2, 4, figsize=(14.4, 6.6), sharey="row")
    top = 100.0   # Nyström with the SVD pseudo-inverse and Gaussian Linformer go far beyond: clipped, said below
    metrics = [("output_rel_fro", "output O")] + [(f"{g}_rel_fro", l) for g, l in GRADS]
    all_families = sorted(d.family.unique())
    rows = ([f for f in all_families if f in LOW_RANK], [f for f in all_families if f not in LOW_RANK])
    for axes, families, what in zip(grid, rows, ("low-rank and kernel", "sparse, sampled, clustered")):
        for ax, (metric, label) in zip(axes, metrics):
            for fam in families:
                g = d[(d.family == fam) & (d.metric == metric)].groupby("step")["value"].median()
                if not g.empty:
                    ax.loglog(g.index, g.values.clip(max=top), ms=4, **family_style(fam))
            ax.set(title=f"{label} — {what}", ylim=(None, top * 1.3),
                   xlabel="budget (landmarks, features, k, window, …)",
                   ylabel="relative error, median over heads" if metric == "output_rel_fro" else "")
            ax.title.set_fontsize(9)
            ax.grid(True, which="major", lw=0.3, alpha=0.5)
        axes[-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False, fontsize=8)
    return finish(fig, out, "gradients_budget",
                  "Output and gradient error against each family's budget on the trained masked-LM's heads, with the "
                  "model's own upstream gradient of its held-out loss (median over heads), n = 512; errors above 100 "
                  "drawn at 100 (Nyström with the SVD pseudo-inverse reaches 1e9).")
