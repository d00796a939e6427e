#!/usr/bin/env python3
"""Checks tools/trained_attention.py in tiny mode (2 layers, 2 heads, n = 64, 30 steps: seconds) and the model
sources `trained`/`initialized` of the experiments:
  - the committed weights: their export takes seconds, does not train, and equals the committed checksum bit for
    bit, also under torch's AVX-512 and generic kernel settings; the corpus snapshot's hash is the weights';
  - the export's layout and shapes; deterministic (a forced rerun is bitwise identical); cached (a rerun with the
    same key writes nothing); --weights reuses a checkpoint of the same training key only; the trained model differs
    from the initialised one and its held-out loss is lower;
  - the model's own attention equals softmax(Q Kᵀ/√d_head) recomputed by numpy from the exported Q, K, and attnlab's
    exact P agrees with it (the spectrum experiment's max_abs_diff_vs_model rows), for the bidirectional and the
    causal objective (the causal mask is applied exactly when the model is causal);
  - spectrum on the model sources: singular values equal numpy's SVD of P computed in float64;
  - error_vs_budget on the model sources: svd:rank=R's error equals numpy's Eckart–Young value, rank = n is exact;
  - probsparse, pinv and regimes accept the model sources;
  - missing data, a causal export given to a non-causal experiment, a bad --model-heads and bad script options
    fail with one clear message and a non-zero exit.
"""
import csv
import glob
import json
import os
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import Checks, path, run  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "trained_attention.py")


def script(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600)


def rows(csv_path):
    with open(csv_path, newline="") as f:
        return [r for r in csv.DictReader(f) if r["metric"] != "point_done"]


def softmax_rows(logits):
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


c = Checks()
try:
    import torch
except ImportError:
    sys.exit(f"{sys.executable} has no torch: tools/setup.sh --python-stack installs Debian's python3-torch")

# ---------------------------------------------------------------------------------------------- export, cache
a, b, causal_dir = path("model_a"), path("model_b"), path("model_causal")
r = script("--tiny", "--out", a)
c.check(r.returncode == 0, f"tiny training runs: {r.stderr[-500:]}")
meta = json.load(open(os.path.join(a, "meta.json")))
c.check(meta["bidirectional"] and meta["config"]["layers"] == 2 and meta["config"]["heads"] == 2, "meta.json")
loss = meta["held_out_loss_nats"]
c.check(loss["trained"] < loss["initialized"] - 0.5, f"training lowers the held-out loss: {loss}")
for model in ("trained", "initialized"):
    for s in range(2):
        for layer in range(2):
            for what in "qkv":
                f = os.path.join(a, model, f"seq{s}_layer{layer}_{what}.npy")
                x = np.load(f) if os.path.exists(f) else None
                c.check(x is not None and x.shape == (2, 64, 16) and x.dtype == np.float32, f"{f}: shape/dtype")
    c.check(np.load(os.path.join(a, model, "seq0_layer1_attn.npy")).shape == (2, 64, 64), f"{model} attn shape")
c.check(not np.array_equal(np.load(os.path.join(a, "trained", "seq0_layer0_q.npy")),
                           np.load(os.path.join(a, "initialized", "seq0_layer0_q.npy"))), "trained != initialized")

mtime = os.path.getmtime(os.path.join(a, "trained", "seq0_layer0_q.npy"))
r = script("--tiny", "--out", a)
c.check(r.returncode == 0 and "up to date" in r.stdout and
        os.path.getmtime(os.path.join(a, "trained", "seq0_layer0_q.npy")) == mtime, "cached: a rerun writes nothing")
r = script("--tiny", "--out", b)
same = r.returncode == 0 and all(
    np.array_equal(np.load(f), np.load(f.replace(a, b)))
    for f in sorted(glob.glob(os.path.join(a, "*", "*.npy"))))
c.check(same, "deterministic: a second training from scratch is bitwise identical")
c.check(json.load(open(os.path.join(b, "meta.json")))["key"] == meta["key"], "same configuration, same key")
# --weights: the first run trains and writes the checkpoint, the second loads it and exports the same arrays.
w, wa, wb = path("weights.pt"), path("model_wa"), path("model_wb")
r1, r2 = script("--tiny", "--out", wa, "--weights", w), script("--tiny", "--out", wb, "--weights", w)
loaded = json.load(open(os.path.join(wb, "meta.json")))["weights"] == w if r2.returncode == 0 else False
c.check(r1.returncode == 0 and loaded and all(np.array_equal(np.load(f), np.load(f.replace(wa, wb)))
                                              for f in glob.glob(os.path.join(wa, "*", "*.npy"))),
        "--weights: a reused checkpoint exports exactly what training gave")
c.check(all(np.array_equal(np.load(f), np.load(f.replace(wa, a))) for f in glob.glob(os.path.join(wa, "*", "*.npy"))),
        "--weights: the checkpoint's training equals the plain run's")
r3 = script("--tiny", "--steps", "31", "--out", path("model_wc"), "--weights", w)
c.check(r3.returncode == 0 and "not used" in r3.stdout and "setting steps: checkpoint 30, asked 31" in r3.stdout,
        f"--weights: a checkpoint of other settings is not used, and the message names the setting: {r3.stdout[-300:]}")

# ------------------------------------------- the committed weights: no training, the committed bits, any machine
# The fresh-machine proof: the export from models/trained_attention.pt takes seconds (no training) and equals the
# committed checksum whatever this machine's stdlib is (the corpus is the committed snapshot) and whatever its CPU
# (torch and OpenBLAS are pinned to their AVX2 kernels; exported under forced AVX-512 and generic settings too).
# Both committed models: the bidirectional (masked-LM) one and the causal (next-byte) one.
for objective, weights, sums in (("mlm", "trained_attention.pt", "trained_attention.export.json"),
                                 ("causal", "trained_attention_causal.pt", "trained_attention_causal.export.json")):
    want = json.load(open(os.path.join(ROOT, "models", sums)))
    for env in ({}, {"ATEN_CPU_CAPABILITY": "avx512", "OPENBLAS_CORETYPE": "SkylakeX"},
                {"ATEN_CPU_CAPABILITY": "default", "OPENBLAS_CORETYPE": "Prescott"}):
        out = path(f"committed_{objective}_" + "_".join(env.values()))
        t0 = time.time()
        r = subprocess.run([sys.executable, SCRIPT, "--objective", objective, "--out", out, "--weights",
                            os.path.join(ROOT, "models", weights)],
                           capture_output=True, text=True, timeout=600, env={**os.environ, **env})
        took = time.time() - t0
        got = json.load(open(os.path.join(out, "meta.json"))) if r.returncode == 0 else {}
        c.check(r.returncode == 0 and "weights from" in r.stdout and "step " not in r.stderr,
                f"committed {objective} weights {env}: reused, no training: {r.stdout[-300:]} {r.stderr[-300:]}")
        c.check(got.get("checksum") == want["checksum"] and got.get("checksum_verified") is True,
                f"committed {objective} weights {env}: export = committed checksum "
                f"({got.get('checksum', '')[:16]} vs {want['checksum'][:16]})")
        bad = [f for f, h in want["files"].items() if got.get("files", {}).get(f) != h]
        c.check(not bad, f"committed {objective} weights {env}: every array's sha256 as committed (differ: {bad[:3]})")
        print(f"committed {objective} weights' export {env or 'default'}: {took:.1f} s")
# The snapshot is what the weights were trained on (its hash is a component of their key), read the same way as a
# directory: unpacked into a directory, it gives the same corpus hash.
snap = os.path.join(ROOT, "models", "stdlib_corpus.tar.xz")
unpacked = path("corpus_dir")
with tarfile.open(snap) as tar:
    tar.extractall(unpacked)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import trained_attention as ta  # noqa: E402
h_snap = ta.split_corpus(ta.read_corpus("snapshot")[1])[3]
h_dir = ta.split_corpus(ta.read_corpus(os.path.join(unpacked, "stdlib"))[1])[3]
want_hash = ta.safe_load(os.path.join(ROOT, "models", "trained_attention.pt"))["key_components"]["corpus_sha256"]
c.check(h_snap == h_dir == want_hash, "snapshot hash = directory hash = the weights' corpus")
ta.write_snapshot(ta.read_corpus(os.path.join(unpacked, "stdlib"))[1], path("again.tar.xz"))
c.check(open(path("again.tar.xz"), "rb").read() == open(snap, "rb").read(),
        "--snapshot-corpus is deterministic: the same files give the committed archive's bytes")

# ------------------------------------------------------------ the model's attention, numpy, attnlab (both masks)
r = script("--tiny", "--objective", "causal", "--out", causal_dir)
c.check(r.returncode == 0, f"causal tiny training runs: {r.stderr[-300:]}")
for d, causal in ((a, False), (causal_dir, True)):
    for model in ("trained", "initialized"):
        q = np.load(os.path.join(d, model, "seq0_layer1_q.npy")).astype(np.float64)
        k = np.load(os.path.join(d, model, "seq0_layer1_k.npy")).astype(np.float64)
        p_model = np.load(os.path.join(d, model, "seq0_layer1_attn.npy"))
        for h in range(2):
            logits = q[h] @ k[h].T / np.sqrt(16)
            if causal:
                logits[np.triu_indices(64, 1)] = -np.inf
            err = np.abs(softmax_rows(logits) - p_model[h]).max()
            c.check(err < 1e-5, f"{d} {model} head {h}: model attention = numpy softmax(QKᵀ/√d) (max diff {err:.2g})")
    out = path(f"spectrum_{os.path.basename(d)}.csv")
    r = run("run", "spectrum", "--sources", "trained,initialized", "--model-data", d, "--out", out)
    c.check(r.returncode == 0, f"spectrum on model sources ({d}): {r.stderr[-300:]}")
    diffs = [float(x["value"]) for x in rows(out) if x["metric"] == "max_abs_diff_vs_model"]
    c.check(len(diffs) == 8 and max(diffs) < 1e-5, f"attnlab's P = the model's ({'causal' if causal else 'bidir.'}): "
                                                   f"{max(diffs) if diffs else None:.2g}")

# -------------------------------------------------------------------- spectrum vs numpy's SVD (float64)
sp = rows(path("spectrum_model_a.csv"))
for model, seq, layer, head in (("trained", 1, 0, 1), ("initialized", 0, 1, 0)):
    q = np.load(os.path.join(a, model, f"seq{seq}_layer{layer}_q.npy"))[head].astype(np.float64)
    k = np.load(os.path.join(a, model, f"seq{seq}_layer{layer}_k.npy"))[head].astype(np.float64)
    sv = np.linalg.svd(softmax_rows(q @ k.T / 4.0), compute_uv=False)
    got = sorted(((int(x["step"]), float(x["value"])) for x in sp
                  if x["source"] == model
                  and (x["sequence"], x["layer"], x["head"]) == (str(seq), str(layer), str(head))
                  and x["metric"] == "singular_value"))
    got = np.array([v for _, v in got])
    c.check(got.shape == sv.shape and np.abs(got - sv).max() < 1e-10 * sv[0],
            f"{model} seq {seq} L{layer}H{head}: singular values = numpy's")

# --------------------------------------------------- error_vs_budget, probsparse, pinv on the model sources
out = path("evb_model.csv")
r = run("run", "error_vs_budget", "--sources", "trained,initialized", "--model-data", a, "--model-heads", "1:0",
        "--model-seqs", "1", "--families", "svd,nystrom", "--out", out)
c.check(r.returncode == 0, f"error_vs_budget on model sources: {r.stderr[-300:]}")
ev = rows(out)
c.check({(x["source"], x["sequence"], x["layer"], x["head"], x["seed"]) for x in ev} ==
        {("trained", "0", "1", "0", "0"), ("initialized", "0", "1", "0", "0")},
        "error_vs_budget: the model's name in the source column; sequence, layer, head in theirs; seed = sequence")
for model in ("trained", "initialized"):
    q = np.load(os.path.join(a, model, "seq0_layer1_q.npy"))[0].astype(np.float64)
    k = np.load(os.path.join(a, model, "seq0_layer1_k.npy"))[0].astype(np.float64)
    sv = np.linalg.svd(softmax_rows(q @ k.T / 4.0), compute_uv=False)
    for rank in (8, 16, 32, 64):
        want = np.sqrt((sv[rank:] ** 2).sum() / (sv ** 2).sum())
        got = [float(x["value"]) for x in ev if x["source"] == model and x["variant"] == "svd"
               and x["step"] == str(rank) and x["metric"] == "P_rel_fro"]
        c.check(len(got) == 1 and abs(got[0] - want) <= 1e-8 + 1e-6 * want,
                f"{model} svd rank {rank}: Eckart–Young {want:.3g} vs {got}")
# trained_causal: the causal model's export beside the bidirectional one (DIR_causal for --model-data DIR); only the
# causal-capable families run on it, with the causal mask: local with a window as long as the heads is exact.
if not os.path.exists(a + "_causal"):
    os.symlink(causal_dir, a + "_causal")
out = path("evb_causal.csv")
r = run("run", "error_vs_budget", "--sources", "trained_causal", "--model-data", a, "--model-heads", "1:0",
        "--model-seqs", "1", "--families", "local,nystrom", "--repeats", "0", "--out", out)
ev = rows(out) if r.returncode == 0 else []
c.check(r.returncode == 0 and {(x["source"], x["layer"], x["head"]) for x in ev} == {("trained_causal", "1", "0")} and
        {x["variant"] for x in ev} == {"local"}, f"error_vs_budget on trained_causal: local only, causal source label "
                                                 f"({r.stderr[-300:]})")
full = [float(x["value"]) for x in ev if x["step"] == "64" and x["metric"] == "out_rel_fro"]
part = [float(x["value"]) for x in ev if x["step"] == "4" and x["metric"] == "out_rel_fro"]
c.check(len(full) == 1 and full[0] <= 1e-12 and part and part[0] > 1e-3,
        f"trained_causal: causal local at window n is exact ({full}), at window 4 it is not ({part})")
r = run("run", "vq", "--sources", "trained_causal", "--model-data", a, "--out", path("vq_causal.csv"))
c.check(r.returncode != 0 and "causal" in r.stderr and "_causal" in r.stderr,
        f"a non-causal experiment refuses trained_causal, naming its directory: {r.stderr[-200:]}")
for name, extra in (("probsparse", []), ("pinv", ["--m", "8,16", "--iters", "10"]),
                    ("regimes", ["--methods", "svd:rank=8;local:window=8"])):
    out = path(f"{name}_model.csv")
    r = run("run", name, "--sources", "trained", "--model-data", a, "--model-heads", "0:1", "--model-seqs", "1",
            *extra, "--out", out)
    c.check(r.returncode == 0 and {(x["source"], x["sequence"], x["layer"], x["head"]) for x in rows(out)} ==
            {("trained", "0", "0", "1")},
            f"{name} on the trained source: {r.stderr[-300:]}")
reg = rows(path("regimes_model.csv"))
c.check({x["source"] for x in reg} == {"trained"} and {x["variant"] for x in reg} == {""} and
        any(x["metric"] == "entropy" for x in reg), "regimes: one point per head, layer and head in their columns")
lemma = [float(x["value"]) for x in rows(path("probsparse_model.csv")) if x["metric"].startswith("lemma1")]
c.check(lemma == [1.0, 1.0], f"probsparse: Lemma 1 holds on every query of the trained head: {lemma}")

# ---------------------------------------------------------------------------------------- bad input
for args, needle in (
        (["run", "spectrum", "--sources", "trained", "--model-data", path("nowhere")], "trained_attention.py"),
        (["run", "error_vs_budget", "--sources", "trained", "--model-data", causal_dir, "--families", "svd"], "causal"),
        (["run", "pinv", "--sources", "initialized", "--model-data", causal_dir], "causal"),
        (["run", "spectrum", "--sources", "trained", "--model-data", a, "--model-heads", "2:0"], "out of range"),
        (["run", "spectrum", "--sources", "trained", "--model-data", a, "--model-heads", "x"], "LAYER:HEAD")):
    r = run(*args, "--out", path("bad.csv"))
    lines = r.stderr.strip().splitlines()
    c.check(r.returncode != 0 and len(lines) == 1 and needle in lines[0] and not os.path.exists(path("bad.csv")),
            f"{' '.join(args[:2])} {args[-1]}: {r.returncode} {r.stderr.strip()[:200]}")
for args, needle in ((["--d-model", "30", "--heads", "4"], "multiple"), (["--steps", "0"], "at least 1"),
                     (["--corpus", path("nowhere")], "does not exist"),
                     (["--corpus", SCRIPT], "not a readable tar")):
    r = script(*args, "--out", path("bad_model"))
    c.check(r.returncode != 0 and needle in r.stderr and "Traceback" not in r.stderr,
            f"script {args}: {r.stderr[-200:]}")
c.finish()
