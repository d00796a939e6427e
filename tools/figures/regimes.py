"""Low-rank vs sparse vs sparse + low-rank against the entropy (Scatterbrain Fig. 1)."""
import pandas as pd

from .common import family_style, finish, panels, plt
from .data import HEAD, is_model_head, load


def plot_regimes(results, out):
    df = load(results, "regimes")
    # Each row's point: the source, the temperature (variant) and seed, or the model head (-1: not a head).
    key = ["source", "variant", "seed", *HEAD]
    keys = df[key].fillna({c: -1 for c in HEAD})
    ent = df[df.metric == "entropy"]["value"].set_axis(pd.MultiIndex.from_frame(keys[df.metric == "entropy"]))
    d = df[df.metric == "out_rel_fro"].copy()
    d["entropy"] = [ent.loc[k] for k in keys[df.metric == "out_rel_fro"].itertuples(index=False, name=None)]
    sources = sorted(d["source"].unique())
    methods = sorted(d["method"].unique(), key=lambda m: (m != "svd", m))
    fig, axes = panels(len(sources), 4.6, 3.8)
    for ax, src in zip(axes, sources):
        heads = is_model_head(d[d.source == src]).any()
        for method in methods:
            g = d[(d.source == src) & (d.method == method)].groupby("entropy")["value"].mean()
            if g.empty:
                continue
            st = family_style(method)
            st.setdefault("lw", 1.5)
            if heads:   # model sources: one point per head at its own entropy (no temperature sweep to connect)
                ax.semilogy(g.index, g.values, ls="none", marker=st["marker"], ms=6, mfc="none", mec=st["color"],
                            mew=1.3 if method != "svd" else 1.8, label=st["label"])
            else:
                ax.semilogy(g.index, g.values, ls="-", ms=4, **st)
        ax.set(title=src + (" (one point per head)" if heads else " (temperature sweep)"),
               xlabel="mean row entropy of P (nats)", ylabel="‖O − Õ‖_F / ‖O‖_F")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles = [plt.Line2D([], [], marker=family_style(m)["marker"], color=family_style(m)["color"],
                          lw=family_style(m).get("lw", 1.5), ms=5) for m in methods]
    labels = [family_style(m)["label"] for m in methods]
    w, h = fig.get_size_inches()
    fig.set_size_inches(w + 1.8, h)
    right = w / (w + 1.8)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.005, 0.55), frameon=False)
    return [finish(fig, out, "regimes",
           "Scatterbrain Fig. 1: low-rank (Performer; the SVD as the best rank-64 reference), sparse (Reformer, "
           "local window) and sparse + low-rank (Scatterbrain) output error against the attention's entropy: "
           "generated inputs over a temperature sweep; trained heads at their own entropy.", right=right)]
