"""Nyströmformer's iterative pseudo-inverse: residuals, iterations against the condition number, Nyström's error."""
import matplotlib.pyplot as plt

from .common import finish, panels, source_colour, tidy_log_axis
from .data import load, n_heads

# The landmark count m in one sequential hue (light: few landmarks), the iteration by the line style; one legend
# for all panels, right of them.
M_COLOURS = plt.get_cmap("viridis")


def landmarks(spec):
    return int(spec.split("=")[1])


def m_colour(m, ms):
    return M_COLOURS(0.85 * ms.index(m) / max(1, len(ms) - 1))


def legend_right(fig, handles, labels, width_in=1.8):
    """Widen the figure by width_in for a legend right of the panels; returns the panels' share of the width."""
    w, h = fig.get_size_inches()
    fig.set_size_inches(w + width_in, h)
    right = w / (w + width_in)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.005, 0.55), frameon=False)
    return right


def plot_pinv(results, out):
    df = load(results, "pinv")
    saved = []
    sources = sorted(df["source"].unique())
    ms = sorted({landmarks(s) for s in df["spec"].unique() if s.startswith("landmarks=")})
    # Residual histories per landmark count, one panel per source.
    fig, axes = panels(len(sources), 4.6, 3.6)
    for ax, src in zip(axes, sources):
        d = df[(df.source == src) & (df.metric == "residual")]
        for (variant, spec), g in d.groupby(["variant", "spec"]):
            g = g.groupby("step")["value"].median()
            ax.semilogy(g.index, g.values, "-" if variant == "order3" else "--", color=m_colour(landmarks(spec), ms),
                        lw=1.4)
        ax.axhline(1e-6, color="gray", lw=0.8)
        ax.axvline(6, color="red", lw=0.8, ls=":")
        heads = n_heads(d)
        ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""), xlabel="iteration k",
               ylabel="‖I − A Z_k‖_F")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles = [plt.Line2D([], [], color=m_colour(m, ms), lw=2) for m in ms]
    handles += [plt.Line2D([], [], color="0.3", ls="-"), plt.Line2D([], [], color="0.3", ls="--")]
    labels = [f"m = {m} landmarks" for m in ms] + ["order 3 (the paper's)", "Newton–Schulz"]
    right = legend_right(fig, handles, labels)
    saved.append(finish(fig, out, "pinv_residuals",
           "Nyströmformer Lemma 1: iterative pseudo-inverse of softmax landmark matrices, residual against the "
           "iteration; colour: landmarks m; solid: order 3, dashed: Newton–Schulz; red dotted: the paper's 6 "
           "iterations; grey: 1e-6.", right=right))
    # Iterations to 1e-6 against the condition number.
    fig, ax = plt.subplots(figsize=(5.5, 4))
    cond = df[df.metric == "cond"].set_index("point")["value"]
    for src in sources:
        for variant, marker in (("order3", "o"), ("newton", "s")):
            d = df[(df.metric == "iterations_to_1e-6") & (df.variant == variant) & (df.source == src)]
            d = d.set_index("point")["value"]
            ax.semilogx(cond.loc[d.index], d.values, marker, color=source_colour(src), ms=5,
                        mfc="none" if variant == "newton" else None)
    ax.set(xlabel="condition number of A", ylabel="iterations to ‖I − AZ‖_F < 1e-6")
    ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles = [plt.Line2D([], [], ls="none", marker="o", color=source_colour(s)) for s in sources]
    handles += [plt.Line2D([], [], ls="none", marker="o", color="0.3"),
                plt.Line2D([], [], ls="none", marker="s", mfc="none", color="0.3")]
    right = legend_right(fig, handles, sources + ["order 3", "Newton–Schulz"], 1.6)
    saved.append(finish(fig, out, "pinv_iterations_vs_cond",
           "Iterations to reach 1e-6 against the landmark matrix's condition number (the paper uses 6); colour: "
           "source.", right=right))
    # Nyström's attention error against the iteration count, with the SVD pseudo-inverse.
    fig, axes = panels(len(sources), 4.6, 3.6)
    for ax, src in zip(axes, sources):
        d = df[(df.source == src) & (df.metric == "nystrom_out_rel_fro")]
        for spec, g in sorted(d[d.variant == "order3"].groupby("spec"), key=lambda x: landmarks(x[0])):
            g = g.groupby("step")["value"].median()
            colour = m_colour(landmarks(spec), ms)
            ax.semilogy(g.index, g.values, "-o", ms=3, color=colour)
            svd = d[(d.variant == "svd") & (d.spec == spec)]["value"].median()
            ax.axhline(svd, color=colour, ls=":", lw=1.2)
        heads = n_heads(d)
        ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""), xlabel="order-3 iterations",
               ylabel="‖O − Õ‖_F / ‖O‖_F")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
        tidy_log_axis(ax, "y")
    handles = [plt.Line2D([], [], color=m_colour(m, ms), marker="o", ms=3) for m in ms]
    handles.append(plt.Line2D([], [], color="0.3", ls=":"))
    right = legend_right(fig, handles, [f"m = {m} landmarks" for m in ms] + ["SVD pseudo-inverse"])
    saved.append(finish(fig, out, "pinv_nystrom_error",
           "Does an unconverged pseudo-inverse help? Nyström's output error against the number of order-3 "
           "iterations; dotted: the same with the SVD pseudo-inverse; model sources: median over heads.", right=right))
    return saved
