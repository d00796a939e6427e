"""The drop-in experiment (tools/dropin.py): what each approximation costs the trained models, and whether the
per-head criterion predicts it. The analysis the findings and the notebook quote (load_dropin(), correlations()) is
dropin_stats.py's, without matplotlib; it is imported here for the figures and the notebook."""
import math

import numpy as np

from .common import family_colour, family_label, family_marker, finish, plt, tidy_log_axis
from .dropin_stats import PREDICTORS, correlations, load_dropin  # noqa: F401  (notebooks/dropin.ipynb)

MODELS = {"mlm": "masked-LM model (bidirectional)", "causal": "causal LM (next byte)"}
# Two panels per model, a few families each: the low-rank and kernel families, and the sparse and clustered ones.
GROUPS = [("low-rank and kernel", ["nystrom", "nystrom_svd", "linformer_pool", "linformer_gaussian", "performer",
                                   "linear"]),
          ("sparse and clustered", ["local", "reformer", "probsparse", "vq", "scatterbrain"])]
def _symlog_axis(ax, values, se):
    lin = max(float(np.nanmedian(se)) if len(se) else 1e-4, 1e-5)
    ax.set_yscale("symlog", linthresh=lin)
    ax.axhline(0, color="grey", lw=0.6)
    ax.axhspan(-lin, lin, color="0.93", zorder=0)
    return lin


def plot_budget(df, out):
    allx = df[df.scope == "all"]
    models = [m for m in MODELS if m in set(allx.model)]
    fig, axes = plt.subplots(len(models), 2, figsize=(10, 3.4 * len(models)), squeeze=False)
    for i, m in enumerate(models):
        dm = allx[allx.model == m]
        exact = df[(df.model == m) & (df.scope == "exact")]
        for j, (gname, fams) in enumerate(GROUPS):
            ax = axes[i][j]
            shown = [f for f in fams if f in set(dm.family)]
            for f in shown:
                d = dm[dm.family == f].sort_values("budget")
                if f == "linear":   # no budget: one value, drawn across the panel
                    ax.axhline(d.dloss.iloc[0], color=family_colour(f), ls="--", lw=1.2,
                               label=f"{family_label(f)} (no budget)")
                    continue
                ax.errorbar(d.budget, d.dloss, yerr=1.96 * d.dloss_se, color=family_colour(f),
                            marker=family_marker(f), ms=4, capsize=2, lw=1.3, label=family_label(f))
            if not shown:
                ax.text(0.5, 0.5, "no causal method of this group", ha="center", va="center", transform=ax.transAxes)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget (landmarks, features, k, codes, window, buckets, factor)")
            ax.set_ylabel("loss increase over exact (nats/byte)")
            loss0 = float(exact.loss.iloc[0]) if len(exact) else math.nan
            ax.set_title(f"{MODELS[m]}: {gname}\nall layers swapped; exact loss {loss0:.3f} nats/byte", fontsize=9)
            ax.set_yscale("log")
            pos = dm[dm.family.isin(shown)].dloss
            if (pos > 0).any():
                lo = max(float(pos[pos > 0].min()) / 2, 1e-4)
                ax.set_ylim(lo, float(pos.max()) * 2)
            tidy_log_axis(ax)
            if shown:
                ax.legend(loc="best", fontsize=7)
    return finish(fig, out, "dropin_budget",
                  "Drop-in fidelity: the held-out loss increase of the trained models with every attention layer "
                  "replaced by the method (no fine-tuning), against the method's budget; bars: 95% intervals "
                  "(paired, over held-out windows). No paper figure: the peers measured one model and budget.")


def plot_heads(df, out):
    heads = df[df.scope == "head"]
    paths = []
    for m in [m for m in MODELS if m in set(heads.model)]:
        dm = heads[heads.model == m]
        fams = sorted(set(dm.family), key=lambda f: [g for _, fs in GROUPS for g in fs].index(f)
                      if f in [g for _, fs in GROUPS for g in fs] else 99)
        cols = min(4, len(fams))
        rows = math.ceil(len(fams) / cols)
        fig, grid_axes = plt.subplots(rows, cols + 1, figsize=(2.6 * cols + 1.2, 2.5 * rows), squeeze=False,
                                      gridspec_kw={"width_ratios": [1] * cols + [0.07]})
        axes = [row[:cols] for row in grid_axes]
        for row in grid_axes:   # the last column holds the colour bar (in the middle row), nothing else
            row[cols].axis("off")
        vmax = max(float(dm.dloss.abs().max()), 1e-6)
        lin = max(float(np.nanmedian(dm.dloss_se)), 1e-5)
        norm = matplotlib_symlog(lin, vmax)
        for idx, f in enumerate(fams):
            ax = axes[idx // cols][idx % cols]
            d = dm[dm.family == f]
            budgets = sorted(set(d.budget))
            d = d[d.budget == budgets[len(budgets) // 2]]   # one budget per family: the middle one swept per head
            L, H = int(d["layer"].max()) + 1, int(d["head"].max()) + 1
            grid = np.full((L, H), np.nan)
            for _, r in d.iterrows():
                grid[int(r["layer"]), int(r["head"])] = r["dloss"]
            im = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="equal")
            for (l, h), v in np.ndenumerate(grid):
                ax.text(h, l, f"{v:.2g}" if abs(v) >= 1e-3 else f"{v:.0e}", ha="center", va="center", fontsize=6,
                        color="white" if abs(v) > vmax / 3 else "black")
            budget = d.budget.iloc[0]
            ax.set_title(f"{family_label(f)}" + (f", budget {budget:g}" if budget else ""), fontsize=8)
            ax.set_xticks(range(H))
            ax.set_yticks(range(L))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
        for idx in range(len(fams), rows * cols):
            axes[idx // cols][idx % cols].axis("off")
        cax = grid_axes[rows // 2][cols]
        cax.axis("on")
        fig.colorbar(im, cax=cax, label="loss increase (nats/byte)")
        paths.append(finish(fig, out, f"dropin_heads_{m}",
                            f"Drop-in fidelity per head, {MODELS[m]}: the held-out loss increase when one head's "
                            "attention is the method's and every other head is exact (symmetric log colour scale; "
                            "negative: the swap lowered the loss)."))
    return paths


def matplotlib_symlog(lin, vmax):
    from matplotlib.colors import SymLogNorm
    return SymLogNorm(linthresh=lin, vmin=-vmax, vmax=vmax, base=10)


def plot_criterion(df, out):
    heads = df[df.scope == "head"]
    models = [m for m in MODELS if m in set(heads.model)]
    corr = correlations(df)
    fig, axes = plt.subplots(len(models), 2, figsize=(10, 3.5 * len(models)), squeeze=False)
    for i, m in enumerate(models):
        dm = heads[heads.model == m]
        for j, (gname, fams) in enumerate(GROUPS):
            ax = axes[i][j]
            shown = [f for f in fams if f in set(dm.family)]
            xmax = 10.0   # head errors beyond (Nyström with an SVD pseudo-inverse reaches 1e10) are counted, not drawn
            for f in shown:
                d = dm[dm.family == f]
                beyond = int((d.head_err > xmax).sum())
                d = d[d.head_err <= xmax]
                c = corr[(corr.model == m) & (corr.family == f) & (corr.predictor == "head_err")].iloc[0]
                label = f"{family_label(f)} (ρ = {c.rho:.2f})" if not math.isnan(c.rho) else family_label(f)
                if beyond:
                    label += f"; {beyond} beyond {xmax:g}"
                ax.scatter(d.head_err, d.dloss, s=14, color=family_colour(f), marker=family_marker(f), label=label)
            if not shown:
                ax.text(0.5, 0.5, "no causal method of this group", ha="center", va="center", transform=ax.transAxes)
                continue
            ax.set_xscale("log")
            lo = float(dm.head_err[dm.head_err > 0].min()) / 1.5
            ax.set_xlim(lo, xmax * 1.2)
            _symlog_axis(ax, dm.dloss, dm.dloss_se)
            ax.axvline(0.05, color="grey", ls=":", lw=1)
            ax.set_xlabel("head output error ‖Õ − O‖_F/‖O‖_F (one head)")
            ax.set_ylabel("model loss increase (nats/byte)")
            ax.set_title(f"{MODELS[m]}: {gname}\neach point: one head swapped alone", fontsize=9)
            ax.legend(loc="upper left", fontsize=7)
    return finish(fig, out, "dropin_criterion",
                  "Does the per-head criterion predict the model's loss? Each point is one head swapped alone: its "
                  "head-level output error (dotted: the report's 5% target) against the model's held-out loss "
                  "increase (symmetric log axis; shaded: within the median standard error of zero); ρ: Spearman's "
                  "rank correlation per family (every budget swept per head).")


def plot_dropin(results, out):
    df = load_dropin(results)
    if df is None:
        return []
    return [plot_budget(df, out)] + plot_heads(df, out) + [plot_criterion(df, out)]
