"""Every method's error against its budget, and against its measured cost (Pareto fronts).

Budgets come in different units (landmarks, features, codes, windows, ...), so no panel mixes units: the families
whose P̃ has a bounded rank are drawn against that rank bound (landmarks, columns, k, features, codes, ProbSparse's
active queries + 1), split over three panels of a few families each; the sparse ones against the keys each query
sees (measured). One row per source; the same family has the same colour in every panel and figure."""
import numpy as np
import pandas as pd

from .common import (family_colour, family_label, family_marker, finish, log_range, note_clipped, plain_log_ticks,
                     plot_clipped, plt, tidy_log_axis)
from .data import HEAD, cost_device, load, n_heads

# (panel title, x label, families): at most five families a panel, each panel one budget unit.
GROUPS = [
    ("Nyström and CUR", "rank bound r (landmarks, columns)", ["svd", "nystrom", "nystrom_svd", "cur"]),
    ("projections and features", "rank bound r (Linformer k, features)",
     ["svd", "linformer_pool", "linformer_gaussian", "performer"]),
    ("codes and active queries", "rank bound r (codes; ProbSparse u + 1)", ["svd", "vq", "probsparse"]),
    ("sparse patterns", "keys per query (measured)", ["local", "reformer", "scatterbrain"]),
]
RANK_GROUPS = 3   # the first three share the unit (rank bound) and so the x range
PAGE = 4096       # the memory measurement's resolution (one page): below it a value is not resolved



def log_error_axes(ax, outside, lo, hi):
    """Log-log axes on the error's useful range [lo, hi], plain tick labels, the points beyond it counted."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    plain_log_ticks(ax, "x")
    tidy_log_axis(ax, "y")
    note_clipped(ax, outside, lo, hi)

def groups_for(families):
    """GROUPS restricted to the families present, plus panels for families no group knows (their own budgets,
    at most five a panel), so that a new family is drawn rather than dropped."""
    out = [(t, x, [f for f in fams if f in families]) for t, x, fams in GROUPS]
    out = [g for g in out if any(f != "svd" for f in g[2])]
    known = {f for _, _, fams in GROUPS for f in fams}
    rest = sorted(f for f in families if f not in known)
    for i in range(0, len(rest), 5):
        out.append(("other families", "budget (each family's own parameter)", rest[i:i + 5]))
    return out


def budget_x(d, family):
    """{step: x} for a family's points on one source, and a legend suffix when the panel's unit is not available
    for it (then its own budget is used and the legend says so)."""
    steps = sorted(d[d.variant == family]["step"].dropna().unique())

    def measured(metric, variant, offset=0.0):
        m = d[(d.metric == metric) & (d.variant == variant)].groupby("step")["value"].median()
        return {s: m[s] + offset for s in steps if s in m.index}

    if family == "probsparse":   # the lazy queries share one row (the mean): rank P̃ ≤ u + 1
        x = measured("selected_queries", "probsparse", 1.0)
        return (x, "") if len(x) == len(steps) else ({s: s for s in steps}, " (factor c)")
    if family in ("local", "reformer"):
        x = measured("keys_per_query", family)
        return (x, "") if len(x) == len(steps) else ({s: s for s in steps}, " (budget)")
    if family == "scatterbrain":   # its sparse part is the local band of the same window
        x = measured("keys_per_query", "local")
        return (x, " (band)") if len(x) == len(steps) else ({s: s for s in steps}, " (window)")
    return {s: s for s in steps}, ""


def row_title(df_src, src):
    heads = n_heads(df_src)
    return src + (f", median of {heads} heads" if heads > 1 else "")


def grid(sources, groups, width=3.6, height=2.6):
    fig, axes = plt.subplots(len(sources), len(groups), figsize=(width * len(groups), height * len(sources) + 1.4),
                             squeeze=False)
    return fig, axes


def column_legends(axes, groups, extra=()):
    """One legend per column, above its top panel (outside the data): the column's families, then extra
    (handle, label) pairs shared by every column (reference lines)."""
    for c, (title, _, fams) in enumerate(groups):
        handles = [plt.Line2D([], [], color=family_colour(f), marker=family_marker(f), ms=4,
                              lw=2.5 if f == "svd" else 1.5)
                   for f in fams]
        labels = [family_label(f) for f in fams]
        for h, lab in extra:
            handles.append(h)
            labels.append(lab)
        axes[0][c].legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.09), ncol=2, fontsize=7.5,
                          title=title, title_fontsize=8.5, frameon=False)


def plot_error_vs_budget(results, out):
    df = load(results, "error_vs_budget")
    saved = []
    sources = sorted(df["source"].unique())
    groups = groups_for(set(df["variant"]))
    for metric, label in (("P_rel_fro", "‖P − P̃‖_F / ‖P‖_F"), ("out_rel_fro", "‖O − Õ‖_F / ‖O‖_F")):
        fig, axes = grid(sources, groups)
        xs_rank = []
        for r, src in enumerate(sources):
            d = df[df.source == src]
            e = d[d.metric == metric]
            med = e.groupby(["variant", "step"])["value"].median()   # what is drawn: the range is its range
            shown = {f for _, _, fs in groups for f in fs}
            lo, hi = log_range(med[[v in shown for v in med.index.get_level_values(0)]])
            for c, (title, xlabel, fams) in enumerate(groups):
                ax = axes[r][c]
                outside = []
                for fam in fams:
                    if fam not in med.index.get_level_values(0):
                        continue
                    g = med.loc[fam]
                    xmap, suffix = budget_x(d, fam)
                    x = [xmap.get(s, np.nan) for s in g.index]
                    if c < RANK_GROUPS:
                        xs_rank += x
                    style = dict(lw=2.5) if fam == "svd" else {}
                    outside += plot_clipped(ax, x, g.values, lo, hi, family_colour(fam), marker=family_marker(fam),
                                            label=family_label(fam) + suffix, **style)
                log_error_axes(ax, outside, lo, hi)
                if r == len(sources) - 1:
                    ax.set_xlabel(xlabel)
                if c == 0:
                    ax.set_ylabel(f"{row_title(d, src)}\n{label}")
                else:
                    ax.tick_params(labelleft=True)
                ax.grid(True, which="major", lw=0.3, alpha=0.5)
        if xs_rank:   # the rank-bound panels share their unit, so their range too
            xs = [x for x in xs_rank if x == x and x > 0]
            for row in axes:
                for ax in row[:RANK_GROUPS]:
                    ax.set_xlim(min(xs) / 1.4, max(xs) * 1.4)
        column_legends(axes, groups)
        if metric == "P_rel_fro":
            text = ("Error of P̃ against budget, one row per source, one budget unit per panel. Black: the "
                    "Eckart–Young floor, the best rank-R approximation of P, which no method whose P̃ has rank ≤ R "
                    "can beat (the sparse patterns are not rank-limited and may).")
        else:
            text = ("Error of the outputs O = P̃V against budget, one row per source, one budget unit per panel. "
                    "Black: the rank-R SVD of P applied to V — a reference, not a floor: the best approximation of O "
                    "is not the best of P, and methods can go below it.")
        text += (" Rank bound: landmarks, columns, Linformer's k, features, codes, or ProbSparse's active queries "
                 "u + 1 (the lazy queries share one row); sparse patterns at the keys each query sees "
                 "(Scatterbrain at its band's, plus 64 features). ▲/▼: points beyond the axis, counted in the "
                 "panel; model sources: median over heads.")
        saved.append(finish(fig, out, f"error_vs_budget_{metric}", text))
    saved += plot_error_vs_cost(df, out, cost_device(results, "error_vs_budget"))
    return saved


def pareto(points):
    """The non-dominated (cost, error) points, sorted by cost: no other point is both cheaper and more accurate."""
    front, best = [], float("inf")
    for cost, err in sorted(points):
        if err < best:
            front.append((cost, err))
            best = err
    return front


def plot_error_vs_cost(df, out, device="this CPU"):
    """Error of the outputs against measured cost (float32 time per call, peak memory), one row per source and
    the families in the same panels as the budget figures: every budget a point, each family's own Pareto frontier
    drawn through its points, the frontier over all methods (black) in every panel of the row."""
    saved = []
    if "cost_time_s" not in set(df["metric"]):
        return saved
    sources = sorted(df["source"].unique())
    groups = [(t, x, [f for f in fams if f != "svd"]) for t, x, fams in groups_for(set(df["variant"]))]
    has_median = "cost_time_median_s" in set(df["metric"])
    for cost_metric, name in (("cost_time_s", "error_vs_cost_time"),
                              ("cost_peak_memory_bytes", "error_vs_cost_memory")):
        memory = cost_metric == "cost_peak_memory_bytes"
        scale = 1 / 2**20 if memory else 1e3
        unresolved_x = PAGE / 2 * scale   # where a value below one page is drawn (open markers)
        fig, axes = grid(sources, groups)
        all_costs, any_unresolved = [], False
        for r, src in enumerate(sources):
            d = df[df.source == src]
            err = d[d.metric == "out_rel_fro"].groupby(["variant", "step"])["value"].median()
            raw = d[d.metric == cost_metric].groupby(["variant", "step"])["value"].median()
            cost = raw * scale
            unresolved = raw < PAGE if memory else raw < 0
            if memory:
                cost = cost.where(~unresolved, unresolved_x)
            spread = None
            if not memory and has_median:
                spread = d[d.metric == "cost_time_median_s"].groupby(["variant", "step"])["value"].median() * scale
            both = pd.concat({"err": err, "cost": cost, "unres": unresolved}, axis=1).dropna(subset=["err", "cost"])
            both = both[both.index.get_level_values(0) != "svd"]   # a dense-SVD reference, not a method to run
            lo, hi = log_range(both["err"])
            everything = [(c, e) for c, e in zip(both.cost, both.err) if c > 0]
            all_costs += [c for c, _ in everything]
            front_all = pareto(everything)
            if front_all and everything:   # carried to the costliest point: a one-point frontier is a line too
                front_all.append((max(c for c, _ in everything), front_all[-1][1]))
            exact_ms = None
            if not memory:
                speed = d[d.metric == "cost_speedup_vs_exact"].set_index(["variant", "step", *HEAD])["value"]
                t = d[d.metric == "cost_time_s"].set_index(["variant", "step", *HEAD])["value"]
                exact_ms = (t * speed).median() * scale
            for c, (title, xlabel, fams) in enumerate(groups):
                ax = axes[r][c]
                outside = []
                shown = [p for p in front_all if p[1] <= hi]   # its points above the axis are the families' ▲
                if shown:
                    ax.step([p[0] for p in shown], [max(p[1], lo) for p in shown], where="post", color="black",
                            lw=1.2, label="_frontier", zorder=1)
                if exact_ms is not None and exact_ms == exact_ms:
                    ax.axvline(exact_ms, color="0.5", ls="--", lw=1, label="_exact", zorder=1)
                for fam in fams:
                    if fam not in both.index.get_level_values(0):
                        continue
                    g = both.loc[fam]
                    g = g[g.cost > 0]
                    col = family_colour(fam)
                    front = pareto(list(zip(g.cost, g.err)))
                    outside += plot_clipped(ax, [p[0] for p in front], [p[1] for p in front], lo, hi, col,
                                            marker=family_marker(fam), label=family_label(fam))
                    off = g[~g.index.isin([s for s in g.index if (g.cost[s], g.err[s]) in front])]
                    for sel, marker, ms in ((off.err.between(lo, hi), family_marker(fam), 3.5),
                                            (off.err > hi, "^", 6), (off.err < lo, "v", 6)):
                        if sel.any():   # faint: budgets off the family's frontier; beyond the axis at its edge
                            ax.plot(off.cost[sel], np.clip(off.err[sel], lo, hi), marker, ms=ms, color=col,
                                    alpha=0.45, label="_nolegend_", zorder=2, clip_on=False)
                    outside += [(c0, e0) for c0, e0 in zip(off.cost, off.err) if not lo <= e0 <= hi]
                    unres = g[g.unres.astype(bool)]
                    if len(unres):   # below one page: drawn open at the left edge
                        any_unresolved = True
                        ax.plot(unres.cost, np.clip(unres.err, lo, hi), "o", ms=6, mfc="white", mec=col, mew=1.2,
                                label="_nolegend_", zorder=4)
                    if spread is not None:   # fastest (the point) to median of the repeats
                        med = spread.reindex(pd.MultiIndex.from_product([[fam], g.index]))
                        for (s, c0), m in zip(g.cost.items(), med.values):
                            if m == m and m > c0:
                                y = min(max(g.err[s], lo), hi)
                                ax.plot([c0, m], [y, y], "-", color=col, lw=0.8, alpha=0.7, label="_nolegend_")
                log_error_axes(ax, outside, lo, hi)
                if memory:
                    ax.axvline(PAGE * scale, color="0.6", ls=":", lw=0.8, label="_page", zorder=1)
                if r == len(sources) - 1:
                    ax.set_xlabel("time per call, float32, this CPU (ms)" if not memory else
                                  "peak memory above the inputs (MiB)")
                if c == 0:
                    ax.set_ylabel(f"{row_title(d, src)}\n‖O − Õ‖_F / ‖O‖_F")
                ax.grid(True, which="major", lw=0.3, alpha=0.5)
        if all_costs:
            left = unresolved_x / 1.6 if memory and any_unresolved else min(all_costs) / 1.4
            for row in axes:
                for ax in row:
                    ax.set_xlim(left, max(all_costs) * 1.4)
        extra = [(plt.Line2D([], [], color="black", lw=1.2), "frontier, all methods")]
        if not memory:
            extra.append((plt.Line2D([], [], color="0.5", ls="--"), "exact (streaming)"))
        else:
            extra.append((plt.Line2D([], [], ls="none", marker="o", mfc="white", mec="0.3"), "< 1 page, not resolved"))
        column_legends(axes, groups, extra)
        if memory:
            text = ("Output error against peak memory above the inputs (MiB; measured in a separate untimed call from "
                    "the resident set: a lower bound, resolution one 4 KiB page, dotted). Open markers at the left: "
                    "below one page, not resolved (the method allocates less than a page beyond its inputs and "
                    "output, or reuses memory).")
        else:
            text = (f"Output error against time per call (ms, float32 on {device}, fastest of the repeats after a "
                    "warm-up" +
                    ("; the thin line runs to the median" if has_median else "") + "); dashed: exact streaming "
                    "attention's time on the same inputs.")
        text += (" Dots: every budget; solid: each family's Pareto frontier; black: the frontier over all methods "
                 "(the same in every panel of a row). ▲/▼: errors beyond the axis. SVD is a dense reference and "
                 "not drawn; model sources: median over heads.")
        saved.append(finish(fig, out, name, text))
    return saved
