"""Nyströmformer's iterative pseudo-inverse: residuals, iterations against the condition number, Nyström's error."""
import matplotlib.pyplot as plt

from .common import load, panels, finish


def plot_pinv(results, out):
    df = load(results, "pinv")
    saved = []
    # Residual histories per landmark count, one panel per source.
    sources = sorted(df["family"].unique())
    fig, axes = panels(len(sources))
    for ax, src in zip(axes, sources):
        d = df[(df.family == src) & (df.metric == "residual")]
        for (variant, spec), g in d.groupby(["variant", "spec"]):
            g = g.groupby("step")["value"].median()
            ax.semilogy(g.index, g.values, "-" if variant == "order3" else "--",
                        label=f"{variant}, {spec.replace('landmarks=', 'm=')}")
        ax.axhline(1e-6, color="gray", lw=0.8)
        ax.axvline(6, color="red", lw=0.8, ls=":")
        heads = d["source"].nunique()
        ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""), xlabel="iteration k",
               ylabel="‖I − A Z_k‖_F")
        ax.legend(fontsize=7)
    saved.append(finish(fig, out, "pinv_residuals",
           "Nyströmformer Lemma 1: iterative pseudo-inverse of softmax landmark matrices; red: the paper's 6 "
           "iterations; solid order-3, dashed Newton–Schulz."))
    # Iterations to 1e-6 against the condition number.
    fig, ax = plt.subplots(figsize=(5.5, 4))
    cond = df[df.metric == "cond"].set_index("point")["value"]
    for i, src in enumerate(sources):
        for variant, marker in (("order3", "o"), ("newton", "s")):
            d = df[(df.metric == "iterations_to_1e-6") & (df.variant == variant) & (df.family == src)]
            d = d.set_index("point")["value"]
            ax.semilogx(cond.loc[d.index], d.values, marker, color=f"C{2 * i}", mfc="none" if variant == "newton"
                        else None, label=f"{src} {variant}")
    ax.set(xlabel="condition number of A", ylabel="iterations to ‖I − AZ‖_F < 1e-6")
    ax.legend(fontsize=7)
    saved.append(finish(fig, out, "pinv_iterations_vs_cond",
           "Iterations needed against the landmark matrix's condition number (the paper uses 6)."))
    # Nyström's attention error against the iteration count, with the SVD pseudo-inverse.
    fig, axes = panels(len(sources))
    for ax, src in zip(axes, sources):
        d = df[(df.family == src) & (df.metric == "nystrom_out_rel_fro")]
        for spec, g in d[d.variant == "order3"].groupby("spec"):
            g = g.groupby("step")["value"].median()
            line, = ax.semilogy(g.index, g.values, "-o", ms=3, label=spec.replace("landmarks=", "m="))
            svd = d[(d.variant == "svd") & (d.spec == spec)]["value"].median()
            ax.axhline(svd, color=line.get_color(), ls=":", lw=1)
        ax.set(title=src, xlabel="order-3 iterations", ylabel="relative output error")
        ax.legend(fontsize=7)
    saved.append(finish(fig, out, "pinv_nystrom_error",
           "Does an unconverged pseudo-inverse help? Nyström's output error against the iteration count; "
           "dotted: the SVD pseudo-inverse; model sources: median over heads."))
    return saved
