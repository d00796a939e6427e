"""attnlab.mix: the report's per-head choices checked on the model, and chosen under a model-level loss target.

`attnlab report` judges every head alone: the cheapest method whose output error ‖Õ − O‖_F/‖O‖_F is under a target.
A model runs all its heads together, and what a user decides on is the model's loss. This module reads a report's
candidates (report.csv) and, given a function that measures the model's loss increase for a mix of methods,
  - recommended(report): the report's own per-head recommendation as a mix, to measure as a whole;
  - choose_under_loss_target(...): per head the cheapest method that keeps the whole model within a loss target.
Mixes are dicts {(layer, head): spec}; heads not in a mix keep exact attention. No torch needed here: the model is
the caller's (attnlab.torch.check_report runs it on a PyTorch model with its loss; by hand:
swap(model, mix_to_swap_spec(mix, heads))).

How choose_under_loss_target chooses (greedy, on measured losses):
  1. candidates per head: the report's Pareto-optimal methods (error against time at the report's cost length) that
     are faster than exact attention beyond the timing noise (speed-up > 1 + noise), cheapest first;
  2. heads in order of the time their cheapest candidate saves (largest first);
  3. for each head, its candidates from the cheapest: the first whose addition keeps the measured loss increase of
     the whole mix so far (every head chosen before it, plus this one) within the target is kept — within it with
     a margin: increase + z·(its standard error) ≤ target, z = 1.64 (one-sided 95%) by default, because the best of
     many noisy trials is optimistic (measured here: without the margin a mix chosen within 0.05 nats on 8 windows
     lost 0.08 on 8 others); a head none of whose candidates fits keeps exact attention.
Each step measures the model, so interactions between heads (errors that compound through layers) count; the
greedy order is not optimal (a knapsack), and the losses are measured on the caller's windows: check the mix on
held-out ones (tools/model_report.py does).
"""
import csv
import gzip
import os
import re

__all__ = ["read_report", "recommended", "choose_under_loss_target", "mix_to_swap_spec", "attention_speedup"]


def _layer_index(name):
    m = re.fullmatch(r"L?(\d+)", str(name))
    if not m:
        raise ValueError(f"report: layer {name!r} is not L<index> (a model export's layer)")
    return int(m.group(1))


def read_report(path):
    """A report (its directory, report.csv or report.csv.gz) as {(layer, head): {"exact_time_s": t,
    "candidates": [dict(spec, family, budget, error, time_s, speedup, pareto, recommended)]}} with layer as an integer
    index."""
    if os.path.isdir(path):
        plain = os.path.join(path, "report.csv")
        path = plain if os.path.exists(plain) or not os.path.exists(plain + ".gz") else plain + ".gz"
    if not os.path.exists(path):
        raise ValueError(f"report: {path} does not exist (make it with `attnlab report --model-dir ... --out DIR`)")
    heads = {}
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        for r in csv.DictReader(f):
            key = (_layer_index(r["layer"]), int(r["head"]))
            h = heads.setdefault(key, {"exact_time_s": None, "candidates": {}})
            metric, value = r["metric"], float(r["value"])
            if r["spec"] == "exact":
                if metric == "time_s":
                    h["exact_time_s"] = value
                continue
            if not r["family"] or r["family"] == "svd":
                continue
            c = h["candidates"].setdefault(r["spec"], {"spec": r["spec"], "family": r["family"],
                                                       "budget": float(r["budget"]) if r["budget"] else None})
            names = {"out_rel_fro": "error", "time_s": "time_s", "speedup_vs_exact": "speedup", "pareto": "pareto",
                     "recommended": "recommended"}
            if metric in names:
                c[names[metric]] = value
    if not heads:
        raise ValueError(f"report: {path} has no heads")
    out = {}
    for key, h in sorted(heads.items()):
        cands = [c for c in h["candidates"].values() if "time_s" in c and "error" in c]
        out[key] = {"exact_time_s": h["exact_time_s"], "candidates": cands}
    return out


def recommended(report):
    """The report's per-head recommendation as a mix {(layer, head): spec} (heads that keep exact are absent)."""
    return {key: c["spec"] for key, h in report.items() for c in h["candidates"] if c.get("recommended") == 1}


def attention_speedup(report, mix):
    """Σ exact time / Σ chosen time over the report's heads, at its cost length: the attention's speed-up."""
    exact = sum(h["exact_time_s"] for h in report.values())
    chosen = 0.0
    for key, h in report.items():
        spec = mix.get(key)
        t = next((c["time_s"] for c in h["candidates"] if c["spec"] == spec), None) if spec else None
        chosen += h["exact_time_s"] if t is None else t
    return exact / chosen


def choose_under_loss_target(report, loss_increase, target, noise=0.1, z=1.64, progress=None):
    """Per head the cheapest candidate keeping the whole model's loss increase within `target` (nats), greedily (see
    the module's docstring). loss_increase(mix) -> the measured increase of the model's loss with that mix, or
    (increase, standard error); a trial is kept when increase + z·se ≤ target.
    Returns (mix, steps): steps lists every trial (layer, head, spec, time_s, measured increase, se, kept)."""
    if not target > 0:
        raise ValueError(f"loss target must be > 0 nats, got {target}")
    cands = {}
    for key, h in report.items():
        ok = [c for c in h["candidates"] if c.get("pareto") == 1 and c.get("speedup", 0) > 1 + noise]
        cands[key] = sorted(ok, key=lambda c: (c["time_s"], c["error"]))
    order = sorted((k for k in cands if cands[k]),
                   key=lambda k: -(report[k]["exact_time_s"] - cands[k][0]["time_s"]))
    mix, steps = {}, []
    for i, key in enumerate(order):
        for c in cands[key]:
            trial = dict(mix)
            trial[key] = c["spec"]
            d = loss_increase(trial)
            d, se = (float(d[0]), float(d[1])) if isinstance(d, (tuple, list)) else (float(d), 0.0)
            kept = d + z * se <= target
            steps.append({"layer": key[0], "head": key[1], "spec": c["spec"], "time_s": c["time_s"],
                          "loss_increase": d, "se": se, "kept": kept})
            if progress:
                progress(f"mix: head {i + 1}/{len(order)} L{key[0]}H{key[1]} {c['spec'][:40]}: "
                         f"{d:+.4f} ± {se:.4f} nats {'kept' if kept else 'over the target'}")
            if kept:
                mix = trial
                break
    return mix, steps


def mix_to_swap_spec(mix, heads):
    """A mix {(layer, head): spec} as attnlab.torch.swap's spec: {layer: [spec or None (exact) per head]}, for
    layers of `heads` heads."""
    out = {}
    for (l, h), spec in mix.items():
        if not 0 <= h < heads:
            raise ValueError(f"mix: head {h} of layer {l} is not in 0..{heads - 1}")
        out.setdefault(l, [None] * heads)[h] = spec
    return out
