"""Low-rank vs sparse vs sparse + low-rank against the entropy (Scatterbrain Fig. 1)."""
from .common import load, panels, finish, is_head


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
