"""Informer's sparsity measure: top-u recall and error, and the distribution of M."""
import matplotlib.pyplot as plt

from .common import load, finish


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
