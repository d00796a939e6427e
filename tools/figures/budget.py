"""Every method's error against its budget, and against its measured cost (Pareto fronts)."""
import pandas as pd

from .common import load, panels, finish


def plot_error_vs_budget(results, out):
    df = load(results, "error_vs_budget")
    saved = []
    for metric, label in (("P_rel_fro", "‖P − P̃‖_F / ‖P‖_F"), ("out_rel_fro", "‖O − Õ‖_F / ‖O‖_F")):
        sources = sorted(df["family"].unique())
        fig, axes = panels(len(sources), 5.5, 4.5)
        for ax, src in zip(axes, sources):
            d = df[(df.family == src) & (df.metric == metric)]
            heads = d["source"].nunique()
            for variant, g in d.groupby("variant"):
                g = g.groupby("step")["value"].median()
                style = dict(color="black", lw=2.5) if variant == "svd" else {}
                ax.loglog(g.index, g.values, "-o", ms=3, label=variant, **style)
            ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""),
                   xlabel="budget (rank, landmarks, k, features, codes, window, chunk, factor)", ylabel=label)
            ax.legend(fontsize=6, ncol=2)
        if metric == "P_rel_fro":
            text = ("Error of P̃ against budget; black: the Eckart–Young floor, the best rank-R approximation of P: no "
                    "method whose P̃ has rank ≤ R can beat it (sparse methods are not rank-limited and may).")
        else:
            text = ("Error of the outputs O = P̃V against budget; black: the rank-R SVD of P applied to V — a reference, "
                    "not a floor: the best approximation of O is not the best of P, and methods can go below it.")
        saved.append(finish(fig, out, f"error_vs_budget_{metric}",
               text))
    saved += plot_error_vs_cost(df, out)
    return saved


def pareto(points):
    """The non-dominated (cost, error) points, sorted by cost: no other point is both cheaper and more accurate."""
    front, best = [], float("inf")
    for cost, err in sorted(points):
        if err < best:
            front.append((cost, err))
            best = err
    return front


def plot_error_vs_cost(df, out):
    """Error of the outputs against measured cost (float32 time per call, peak memory), per source: every method
    family over its budgets, its own Pareto frontier drawn solid, the frontier over all methods in black."""
    saved = []
    if "cost_time_s" not in set(df["metric"]):
        return saved
    for cost_metric, scale, xlabel, name in (
            ("cost_time_s", 1e3, "time per call, float32 (ms, best of repeats)", "error_vs_cost_time"),
            ("cost_peak_memory_bytes", 1 / 2**20, "peak memory above the inputs (MiB, lower bound)",
             "error_vs_cost_memory")):
        sources = sorted(df["family"].unique())
        fig, axes = panels(len(sources), 5.5, 4.5)
        for ax, src in zip(axes, sources):
            d = df[df.family == src]
            err = d[d.metric == "out_rel_fro"].groupby(["variant", "step"])["value"].median()
            cost = d[d.metric == cost_metric].groupby(["variant", "step"])["value"].median() * scale
            both = pd.concat({"err": err, "cost": cost}, axis=1).dropna()
            both = both[(both.cost > 0) & (both.err > 0)]
            everything = []
            for variant, g in both.groupby(level=0):
                if variant == "svd":
                    continue   # a reference computed by dense SVD, not a method one would run for speed
                pts = list(zip(g.cost, g.err))
                everything += pts
                line, = ax.loglog(g.cost, g.err, "o", ms=3, alpha=0.5)
                front = pareto(pts)
                ax.loglog([c for c, _ in front], [e for _, e in front], "-o", ms=3, color=line.get_color(),
                          label=variant)
            front = pareto(everything)
            if front:
                ax.step([c for c, _ in front], [e for _, e in front], where="post", color="black", lw=1.5,
                        label="frontier (all)")
            if cost_metric == "cost_time_s":
                speed = d[d.metric == "cost_speedup_vs_exact"].set_index(["variant", "step", "source"])["value"]
                t = d[d.metric == "cost_time_s"].set_index(["variant", "step", "source"])["value"]
                exact_ms = (t * speed).median() * scale
                if exact_ms == exact_ms:
                    ax.axvline(exact_ms, color="gray", ls="--", lw=1, label="exact (streaming)")
            heads = d["source"].nunique()
            lo = both.err.min() if not both.empty else 1e-3
            ax.set_ylim(lo / 2, 10)   # methods that explode (CUR, Nyström with the SVD pseudo-inverse) leave the top
            ax.set(title=src + (f" (median of {heads} heads)" if heads > 1 else ""), xlabel=xlabel,
                   ylabel="‖O − Õ‖_F / ‖O‖_F")
            ax.legend(fontsize=6, ncol=2)
        saved.append(finish(fig, out, name,
               "Output error against measured cost per method and budget: faint dots, every budget; solid, each "
               "method's Pareto frontier; black, the frontier over all methods; errors above 10 are off the chart" +
               ("; dashed, exact attention's time." if cost_metric == "cost_time_s" else ".")))
    return saved
