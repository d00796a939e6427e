"""Informer's sparsity measure: top-u recall and error, and the distribution of M."""
import matplotlib.pyplot as plt

from .common import finish, source_colour
from .data import load, n_heads

# Recall: M̄ over all keys vs sampled keys by colour; the length by the line style (solid: the smallest n).
ESTIMATOR_COLOURS = {"full M̄": "#1f77b4", "sampled M̄": "#ff7f0e"}
N_STYLES = ["-", "--", ":", "-."]


def plot_probsparse(results, out):
    df = load(results, "probsparse")
    saved = []
    rec = df[df.metric == "top_u_recall"]
    err = df[(df.metric == "out_rel_fro") & (df.variant == "method")]
    sources = sorted(set(rec["source"]) | set(err["source"]))
    ns = sorted(df["n"].dropna().unique())
    ns = [n for n in ns if n > 0]
    # One column per source: recall of the top-u queries (top), ProbSparse's output error (bottom).
    fig, axes = plt.subplots(2, len(sources), figsize=(3.1 * len(sources) + 2.6, 6.2), squeeze=False,
                             sharex=True)
    for c, src in enumerate(sources):
        ax = axes[0][c]
        for (variant, n), g in rec[rec.source == src].groupby(["variant", "n"]):
            g = g.groupby("step")["value"].median()
            ax.plot(g.index / 100, g.values, N_STYLES[ns.index(n) % 4], marker="o", ms=3,
                    color=ESTIMATOR_COLOURS.get(variant, "0.4"))
        heads = n_heads(rec[rec.source == src])
        ax.set(title=src + (f" ({heads} heads, median)" if heads > 1 else ""), ylim=(0, 1.03))
        ax.grid(True, lw=0.3, alpha=0.5)
        if c == 0:
            ax.set_ylabel("recall of the true top-u queries")
        ax = axes[1][c]
        for n, g in err[err.source == src].groupby("n"):
            g = g.groupby("step")["value"].median()
            ax.plot(g.index / 100, g.values, N_STYLES[ns.index(n) % 4], marker="o", ms=3, color="#e377c2")
        ax.set(xlabel="sampling factor c", ylim=(0, max(1.05, err["value"].max() * 1.05)))
        ax.grid(True, lw=0.3, alpha=0.5)
        if c == 0:
            ax.set_ylabel("ProbSparse ‖O − Õ‖_F / ‖O‖_F")
    handles = [plt.Line2D([], [], color=col, marker="o", ms=3) for col in ESTIMATOR_COLOURS.values()]
    labels = [r"recall, $\bar{M}$ over all keys", r"recall, $\bar{M}$ over U = c·ln n keys"]
    handles += [plt.Line2D([], [], color="#e377c2", marker="o", ms=3)]
    labels += ["output error"]
    handles += [plt.Line2D([], [], color="0.3", ls=N_STYLES[i % 4]) for i in range(len(ns))]
    labels += [f"n = {int(n)}" for n in ns]
    right = 1 - 2.6 / fig.get_size_inches()[0]
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.005, 0.55), frameon=False)
    saved.append(finish(fig, out, "probsparse_recall_error",
           "Informer: recall of the true top-u queries (by the sparsity measure M) when ranked by its estimate "
           "$\\bar{M}$ over all keys, or over U = c·ln n sampled keys as the paper does, and ProbSparse's output "
           "error against the sampling factor c; "
           "model sources: median over heads.", right=right))
    q = df[df.metric == "M_quantile"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    handles, labels = [], []
    for (src, n), g in q.groupby(["source", "n"]):
        heads = g.groupby(["layer", "head"], dropna=False)   # one line per head: the mean over its sequences
        ls = N_STYLES[ns.index(n) % 4] if n in ns else "-"
        for j, (_, h) in enumerate(heads):   # model sources: one thin line per head
            h = h.groupby("step")["value"].mean()
            line, = ax.plot(h.index, h.values, ls, marker="o" if len(heads) == 1 else None, ms=3,
                            lw=1.5 if len(heads) == 1 else 0.8, color=source_colour(src),
                            alpha=1 if len(heads) == 1 else 0.7)
            if j == 0:
                handles.append(line)
                labels.append(f"{src}, n = {int(n)}" + (f" ({len(heads)} heads)" if len(heads) > 1 else ""))
    ax.set(xlabel="percentile of queries", ylabel="sparsity measure M = LSE − mean (nats)", yscale="log")
    ax.grid(True, which="major", lw=0.3, alpha=0.5)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.74, 0.55), frameon=False)
    saved.append(finish(fig, out, "probsparse_measure_quantiles",
           "The distribution of Informer's M over queries (quantiles): the long tail ProbSparse relies on; model "
           "sources: one line per head.", right=0.73))
    return saved
