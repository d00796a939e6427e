"""The drop-in experiment's analysis (tools/dropin.py writes results/dropin.csv.gz): reading the CSV, and whether a
head-level quantity predicts a one-head swap's loss increase (Spearman's rho with a cluster bootstrap over heads).
No matplotlib: tools/findings.py quotes these numbers; figures/dropin.py draws them and the notebook imports them
from there."""
import math
import os

import numpy as np
import pandas as pd

# The head-level quantities tested as predictors of a head's model-level loss increase.
PREDICTORS = {
    "head_err": "head output error ‖Õ − O‖_F/‖O‖_F",
    "resid_err": "error in the residual stream ‖(Õ − O)W_oᵀ‖_F/‖x‖_F",
    "grad_bound": "sensitivity-weighted error ‖∂L/∂O‖_F·‖Õ − O‖_F",
    "grad_lin": "first-order loss change ⟨∂L/∂O, Õ − O⟩",
    "p_tv": "attention-row total variation",
}


def load_dropin(results):
    path = os.path.join(results, "dropin.csv.gz")
    if not os.path.exists(path):
        return None
    df = pd.read_csv(path, keep_default_na=False)
    for c in ("budget", "layer", "head", "loss", "loss_se", "dloss", "dloss_se", "kl", "top1", "head_err",
              "resid_err", "grad_lin", "grad_bound", "p_tv"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


BOOTSTRAP = 2000


def _rank(a):
    """Average ranks (ties share the mean of their positions), in numpy: the bootstrap calls this 10⁵ times."""
    order = np.argsort(a, kind="mergesort")
    s = a[order]
    group = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1
    counts = np.bincount(group)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    r = np.empty(len(a))
    r[order] = (starts + (counts - 1) / 2.0)[group] + 1
    return r


def _rho(x, y):
    rx, ry = _rank(x), _rank(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman(x, y, clusters, seed=0, interval=True):
    """Spearman's ρ and a 95% percentile interval from a cluster bootstrap: the rows of one head (a layer, head
    pair: the same head under several families or budgets) are not independent, so heads are resampled with
    replacement, not rows (2000 resamples, seeded). NaN when fewer than 5 pairs or 3 heads, or a constant
    series."""
    x, y, g = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(clusters)
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y, g = x[ok], y[ok], g[ok]
    heads = np.unique(g)
    n = len(x)
    rho = _rho(x, y) if n >= 5 and len(heads) >= 3 else math.nan
    if math.isnan(rho) or not interval:
        return n, rho, math.nan, math.nan
    rows = {h: np.flatnonzero(g == h) for h in heads}
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(BOOTSTRAP):
        idx = np.concatenate([rows[h] for h in rng.choice(heads, len(heads))])
        r = _rho(x[idx], y[idx])
        if not math.isnan(r):
            boot.append(r)
    lo, hi = np.percentile(boot, [2.5, 97.5]) if boot else (math.nan, math.nan)
    return n, rho, float(lo), float(hi)


def correlations(df, intervals="all families"):
    """Per model and family (and over all families): Spearman's ρ between each head-level predictor and the
    measured loss increase of the one-head swaps, with a cluster-bootstrap interval over heads for the groups named
    by `intervals` ("all families", "every" group, or None; NaN elsewhere: the bootstrap takes seconds a group).
    Rows: model, family, predictor, n (swaps), heads, rho, lo, hi."""
    heads = df[df.scope == "head"]
    out = []
    for model, dm in heads.groupby("model", sort=False):
        groups = [(f, d) for f, d in dm.groupby("family", sort=True)] + [("all families", dm)]
        for fam, d in groups:
            g = d["layer"].astype(int) * 1000 + d["head"].astype(int)
            for p in PREDICTORS:
                n, rho, lo, hi = spearman(d[p], d["dloss"], g, interval=intervals == "every" or fam == intervals)
                out.append(dict(model=model, family=fam, predictor=p, n=n, heads=g.nunique(), rho=rho, lo=lo,
                                hi=hi))
    return pd.DataFrame(out)
