"""Statistics the model-level studies share: pooled means with cluster standard errors, and Spearman's ρ with a
cluster bootstrap. Plain numpy (no attnlab module): tools/figures/dropin_stats.py loads this file by path.
"""
import math

import numpy as np

BOOTSTRAP = 2000


def pooled(sums, counts):
    """The pooled mean Σ s_c / Σ n_c of per-cluster sums s_c over n_c scored units and its standard error with the
    clusters (sequences, windows) as the independent units (a ratio estimate: √(C/(C−1)·Σ (s_c − mean·n_c)²) / Σ n_c).
    NaN for the error with fewer than two clusters."""
    s, n = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    total = n.sum()
    mean = s.sum() / total
    C = len(n)
    se = math.sqrt(C / (C - 1) * ((s - mean * n) ** 2).sum()) / total if C > 1 else math.nan
    return float(mean), float(se)


def rank(a):
    """Average ranks (ties share the mean of their positions), in numpy: the bootstrap calls this 10⁵ times."""
    order = np.argsort(a, kind="mergesort")
    s = a[order]
    group = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1
    counts = np.bincount(group)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    r = np.empty(len(a))
    r[order] = (starts + (counts - 1) / 2.0)[group] + 1
    return r


def rho(x, y):
    """Spearman's ρ of two series (NaN for a constant one)."""
    rx, ry = rank(x), rank(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman(x, y, clusters, seed=0, interval=True):
    """Spearman's ρ and a 95% percentile interval from a cluster bootstrap: the rows of one head (a layer, head
    pair: the same head under several families or budgets) are not independent, so heads are resampled with
    replacement, not rows (2000 resamples, seeded). NaN when fewer than 5 pairs or 3 heads, or a constant
    series. Returns (pairs, rho, lo, hi)."""
    x, y, g = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(clusters)
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y, g = x[ok], y[ok], g[ok]
    heads = np.unique(g)
    n = len(x)
    r = rho(x, y) if n >= 5 and len(heads) >= 3 else math.nan
    if math.isnan(r) or not interval:
        return n, r, math.nan, math.nan
    rows = {h: np.flatnonzero(g == h) for h in heads}
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(BOOTSTRAP):
        idx = np.concatenate([rows[h] for h in rng.choice(heads, len(heads))])
        b = rho(x[idx], y[idx])
        if not math.isnan(b):
            boot.append(b)
    lo, hi = np.percentile(boot, [2.5, 97.5]) if boot else (math.nan, math.nan)
    return n, r, float(lo), float(hi)
