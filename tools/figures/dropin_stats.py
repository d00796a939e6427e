"""The drop-in experiment's analysis (tools/dropin.py writes results/dropin.csv.gz): reading the CSV, and whether a
head-level quantity predicts a one-head swap's loss increase (Spearman's rho with a cluster bootstrap over heads).
No matplotlib: tools/findings.py quotes these numbers; figures/dropin.py draws them and the notebook imports them
from there."""
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


def _stats():
    """python/attnlab/stats.py (plain numpy), loaded by path: the findings run without attnlab's compiled module."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "attnlab", "stats.py")
    spec = importlib.util.spec_from_file_location("attnlab_stats", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stats = _stats()
spearman = stats.spearman   # Spearman's ρ with a cluster bootstrap over heads (the studies' own, attnlab.stats)


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
