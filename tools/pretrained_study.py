#!/usr/bin/env python3
"""The model-level studies on a real pretrained model trained by someone else: all-MiniLM-L6-v2 (sentence-transformers;
tools/pretrained.py runs it from its pinned wheel through the standard attention call), with attnlab.study — the
library functions a user runs on their own model.

Data: the docstrings of the committed stdlib snapshot (English prose about code), tokenized by the model's WordPiece.
A pair is a docstring's summary (its first paragraph, 5 to 60 tokens) and the passage of n = 256 tokens that follows
it in the docstring stream ([CLS] + 254 + [SEP]: the docstring's body, then the next docstrings'; the model was
trained on sequences up to 256). The summaries are the queries, encoded once by the exact model and held (they are
short: no approximation's budget is below their length); the passages are the documents, encoded by the model under
test; no two pairs' passages overlap. The first --pairs pairs are the evaluation set, the head-level study uses
its first --head-pairs, fine-tuning trains on pairs from the end of the corpus (disjoint).

The model-level measures:
  loss     the in-batch contrastive loss the model was trained with (sentence-transformers' MultipleNegativesRanking-
           Loss: cross-entropy over 20 × the cosine similarities of each summary to every passage of its batch of 8
           pairs; the right one is its own passage), per pair, in nats (exact: about 0.2, chance ln 8 = 2.08);
           dloss = loss − exact's, with the paired standard error over pairs;
  cos_mean, cos_min   the cosine between each passage's embedding (mean pooling, normalised) with the method swapped
           in and the exact model's, mean and minimum over the evaluated passages;
  recall10 retrieval agreement: for each summary, the share of the exact model's 10 best passages (among every
           evaluated passage) that the swapped model also ranks in its top 10; hit1: the share of summaries whose own
           passage the swapped model ranks first.
Scopes: `all` (every head of every layer) per family at the middle budget of attnlab.budget_families()'s grid (the
middle three for --three-budgets), plus `linear`; `head` (one head swapped, the others exact) for --head-specs on
--head-pairs pairs, with the head measures of attnlab.study (head_err, grad_lin, grad_bound with ∂L/∂O of the
contrastive loss, p_tv) and their rank correlation with the loss increase (attnlab.study.predictors: Spearman's ρ,
cluster bootstrap over heads).
Fine-tuning: attnlab.study.finetune for --finetune families at their default budgets against an exact control, float32,
AdamW at --lr, on --finetune-steps batches of 8 training pairs.

Precision (--only precision; issue "Reduced precision", item 4): every deployable family at the middle budget of its
grid, linear and exact, each swapped into every head with its attention in attnlab's emulated bfloat16 and float16
storage under the eager and careful policies (and in float64), on the same evaluation pairs: the model-level cost of
the format beside the approximation's, on a model trained elsewhere (tools/precision_model.py does the same on the
project's two models). A swap whose attention overflows is a `failed` row (attnlab.study: its non-finite output
reached the next layer), a method the emulation refuses a `refused` row with the reason. Only the attention is in the
format; the rest of the model stays float64.

Float64 for the drop-in rows (float32 for fine-tuning, as users train). Outputs (resumable: finished units are kept in
OUT.partial.jsonl files and a rerun continues): results/pretrained_dropin.csv.gz, results/pretrained_heads.csv.gz,
results/pretrained_predictors.csv.gz, results/pretrained_finetune.csv.gz, results/pretrained_precision.csv.gz, each
with a .config of its settings. Not part of the main job (774 s on 2 cores, and about 16 min for precision):
`tools/pretrained_study.py` regenerates them.
  tools/pretrained_study.py [--out-dir results] [--pairs 64] [--head-pairs 8]
                            [--only dropin,heads,finetune,precision]
"""
import argparse
import csv
import gzip
import json
import math
import os
import sys
import time
import warnings

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import trained_attention as ta  # noqa: E402  (pins torch's and OpenBLAS's kernels before torch is imported)
import pretrained  # noqa: E402
import resumable  # noqa: E402  (fmt: the cells as every result file writes them)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import attnlab  # noqa: E402
except ImportError:
    sys.path.insert(0, os.path.join(os.environ.get("ATTNLAB_BUILD", os.path.join(ROOT, "build")), "python"))
    import attnlab  # noqa: E402
import attnlab.study as study  # noqa: E402

N = 256            # tokens a passage
BATCH = 8          # pairs a batch (the in-batch negatives)
SCALE = 20.0       # MultipleNegativesRankingLoss's similarity scale
FINETUNE = ["nystrom", "local"]
HEAD_SPECS = ["nystrom:landmarks=16", "performer:features=32"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=os.path.join(ROOT, "results"))
    p.add_argument("--pairs", type=int, default=64, help="evaluation pairs (multiple of 8)")
    p.add_argument("--head-pairs", type=int, default=8, help="pairs of the one-head swaps (multiple of 8)")
    p.add_argument("--head-specs", default=",".join(HEAD_SPECS))
    p.add_argument("--finetune", default=",".join(FINETUNE), help="families fine-tuned at their default budget")
    p.add_argument("--finetune-steps", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--only", default="dropin,heads,finetune,precision")
    p.add_argument("--families", default="", help="drop-in families (default: every deployable one, and linear)")
    p.add_argument("--three-budgets", default="nystrom,nystrom_svd,linformer_pool",
                   help="families swept at the middle three budgets of their grid (the others: its middle one)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for name in ("pairs", "head_pairs"):
        v = getattr(a, name)
        if v < BATCH or v % BATCH:
            p.error(f"--{name.replace('_', '-')} must be a positive multiple of {BATCH}")
    return a


def pairs_of(model):
    """(summary, passage) pairs: a docstring's first paragraph (5 to 60 tokens) and the 256-token passage that follows
    it in the docstring stream (the docstring's body first, then the next docstrings'), for docstrings with at least
    40 tokens of body whose passage does not overlap the previous pair's. In corpus order."""
    tok = model.tokenizer
    stream, starts, summaries = [], [], []
    for _, doc in pretrained.docstrings():
        doc = doc.strip()
        summaries.append(doc.split("\n\n")[0].replace("\n", " "))
        starts.append(len(stream))
        stream += tok.encode(doc, special=False)
    starts.append(len(stream))
    out, free = [], 0   # passages never overlap: a batch's other passages are other text
    for j, summary in enumerate(summaries):
        ln = len(tok.encode(summary, special=False))
        begin = starts[j] + ln
        if 5 <= ln <= 60 and starts[j + 1] - begin >= 40 and begin >= free and begin + N - 2 <= len(stream):
            out.append((summary, [tok.cls] + stream[begin:begin + N - 2] + [tok.sep]))
            free = begin + N - 2
    return out


def batches_of(pairs, model):
    """[(the summaries' exact embeddings (8, hidden), passages (8, n))]: the queries are encoded once by the exact
    model (short: no approximation has a budget below their length) and held; the passages by the model under test."""
    out = []
    queries = model.encode([q for q, _ in pairs])
    for b in range(0, len(pairs), BATCH):
        out.append((queries[b:b + BATCH], torch.tensor([p for _, p in pairs[b:b + BATCH]])))
    return out


def step(model, batch):
    """The contrastive loss per pair (each summary against the batch's passages), and the passages' embeddings (for
    cosine and retrieval) as the extra."""
    queries, passages = batch
    ep = model.pool(model(passages))
    scores = SCALE * queries.to(ep.dtype) @ ep.T
    loss = F.cross_entropy(scores, torch.arange(len(passages)), reduction="none")
    return {"loss": loss, "extra": ep.detach()}


def embedding_measures(queries):
    """compare= for attnlab.study.dropin: cos_mean, cos_min of the passages' embeddings against the exact model's;
    recall10, the share of the exact model's 10 best passages for each summary (among every evaluated passage) that
    the swapped model also ranks in its top 10; hit1, the share of summaries whose own passage it ranks first."""
    def measure(extras, base):
        e, e0 = torch.cat(extras).double(), torch.cat(base).double()
        cos = (e * e0).sum(1) / (e.norm(dim=1) * e0.norm(dim=1))
        q = queries[:len(e)].double()
        k = min(10, len(e))
        a, b = (q @ e0.T).topk(k, dim=1).indices, (q @ e.T).topk(k, dim=1).indices
        recall = np.mean([len(set(a[i].tolist()) & set(b[i].tolist())) / k for i in range(len(q))])
        top1 = float(((q @ e.T).argmax(1) == torch.arange(len(q))).double().mean())
        return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "recall10": float(recall), "hit1": top1}
    return measure


def families(three=("nystrom", "nystrom_svd", "linformer_pool")):
    """(label, budget, spec) of every deployable family: the middle budget of its grid, and the middle three for
    the families in `three`."""
    fams = [f for f in attnlab.budget_families() if f["deployable"]]
    out = []
    for f in fams:
        mid = len(f["specs"]) // 2
        span = slice(mid - 1, mid + 2) if f["label"] in three else slice(mid, mid + 1)
        for b, s in list(zip(f["budgets"], f["specs"]))[span]:
            out.append((f["label"], b, s))
    out.append(("linear", "", "linear"))
    return out


def write(path, rows, columns, config):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(tmp, "wt", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if isinstance(v, float) and not math.isfinite(v) else resumable.fmt(v)
                        for k, v in r.items()})
    os.replace(tmp, path)
    with open(path + ".config", "w") as f:
        json.dump(config, f, indent=1, sort_keys=True, default=str)
    print(f"pretrained_study: wrote {os.path.relpath(path, ROOT)} ({len(rows)} rows)", file=sys.stderr)


DROPIN_COLUMNS = ["model", "scope", "family", "budget", "spec", "layer", "head", "pairs", "loss", "loss_se", "dloss",
                  "dloss_se", "cos_mean", "cos_min", "recall10", "hit1", "head_err", "grad_lin", "grad_bound", "p_tv",
                  "own_loss", "max_abs_own", "time_s"]


PRECISIONS = [("fp64", ""), ("bf16", "eager"), ("bf16", "careful"), ("fp16", "eager"), ("fp16", "careful")]
PRECISION_COLUMNS = ["model", "scope", "family", "budget", "spec", "precision", "policy", "status", "pairs", "loss",
                     "loss_se", "dloss", "dloss_se", "cos_mean", "cos_min", "recall10", "hit1", "finite", "time_s"]


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    only = set(a.only.split(","))
    t0 = time.time()
    model = pretrained.load(dtype=torch.float64)
    pairs = pairs_of(model)
    evaluation = batches_of(pairs[:a.pairs], model)
    queries = torch.cat([q for q, _ in evaluation])
    config = {"model": "all-MiniLM-L6-v2", "wheel_sha256": model.sha256, "n": N, "batch_pairs": BATCH,
              "scale": SCALE, "pairs": a.pairs, "head_pairs": a.head_pairs, "seed": a.seed,
              "attnlab": attnlab.__version__, "torch": torch.__version__, "kernels": ta.KERNELS,
              "pairs_available": len(pairs), "loss": "MultipleNegativesRankingLoss (in-batch contrastive: each summary "
              "against the 8 passages of its batch, scale 20), per pair, nats; queries encoded exactly and held"}
    out = a.out_dir
    tmp = os.path.join(out, ".pretrained_study")
    os.makedirs(tmp, exist_ok=True)
    if "dropin" in only:
        fams = [f for f in families(a.three_budgets.split(",")) if not a.families or f[0] in a.families.split(",")]
        rows = study.dropin(model, evaluation, step, [s for _, _, s in fams], scopes=("all",), measures=False,
                            seed=a.seed, compare=embedding_measures(queries),
                            partial=os.path.join(tmp, "dropin.partial.jsonl"))
        label = {attnlab.canonical(s): (f, b) for f, b, s in fams}
        for r in rows:
            r["family"], r["budget"] = label.get(r["spec"], ("exact", ""))
            r["model"], r["pairs"] = "all-MiniLM-L6-v2", a.pairs
        write(os.path.join(out, "pretrained_dropin.csv.gz"), rows, DROPIN_COLUMNS,
              dict(config, scopes=["all"], families=[(f, b) for f, b, _ in fams]))
    if "heads" in only:
        specs = a.head_specs.split(",")
        rows = study.dropin(model, evaluation[:a.head_pairs // BATCH], step, specs, scopes=("head",), seed=a.seed,
                            compare=embedding_measures(queries), partial=os.path.join(tmp, "heads.partial.jsonl"))
        for r in rows:
            r["family"], r["budget"] = (r["spec"].split(":")[0], "") if r["scope"] != "exact" else ("exact", "")
            r["model"], r["pairs"] = "all-MiniLM-L6-v2", a.head_pairs
        write(os.path.join(out, "pretrained_heads.csv.gz"), rows, DROPIN_COLUMNS, dict(config, specs=specs))
        pred = study.predictors(rows)
        for fam in sorted({r["family"] for r in rows if r["scope"] == "head"}):
            for p in study.predictors([r for r in rows if r["family"] == fam]):
                pred.append(dict(p, family=fam))
        for p in pred:
            p.setdefault("family", "all families")
        write(os.path.join(out, "pretrained_predictors.csv.gz"), pred,
              ["family", "measure", "pairs", "heads", "rho", "lo", "hi"], dict(config, specs=specs))
    if "precision" in only:
        fams = [("exact", "", "exact")] + families(three=())
        if a.families:
            fams = [f for f in fams if f[0] in a.families.split(",") or f[0] == "exact"]
        swaps = [(f, b, s if fmt == "fp64" else f"{s}@{fmt}-{pol}", fmt, pol)
                 for f, b, s in fams for fmt, pol in PRECISIONS]
        runnable, refused = [], []
        for u in swaps:
            try:
                attnlab.canonical(u[2])   # a method the emulation does not cover: a `refused` row, before any work
                runnable.append(u)
            except ValueError as e:
                refused.append(u + (str(e).splitlines()[0][:200],))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # a failing attention's warning: its row says it
            rows = study.dropin(model, evaluation, step, [u[2] for u in runnable if u[2] != "exact"], scopes=("all",),
                                measures=False, seed=a.seed, compare=embedding_measures(queries),
                                partial=os.path.join(tmp, "precision.partial.jsonl"))
        unit = {attnlab.canonical(u[2]): u for u in runnable}
        out_rows = []
        for r in rows:
            f, b, _, fmt, pol = unit.get(r["spec"], ("exact", "", "", "fp64", ""))
            out_rows.append(dict(r, family=f, budget=b, precision=fmt, policy=pol, model="all-MiniLM-L6-v2",
                                 pairs=a.pairs, scope="all" if r["scope"] != "exact" else "exact"))
        for f, b, s, fmt, pol, why in refused:
            out_rows.append(dict(model="all-MiniLM-L6-v2", scope="all", family=f, budget=b, spec=s, precision=fmt,
                                 policy=pol, pairs=a.pairs, status="refused: " + why))
        write(os.path.join(out, "pretrained_precision.csv.gz"), out_rows, PRECISION_COLUMNS,
              dict(config, precisions=PRECISIONS, families=[(f, b) for f, b, _ in fams],
                   emulation="attnlab's CPU emulation of the storage format (round to nearest even, float32 "
                             "accumulation): the same values on every x86-64 CPU"))
    if "finetune" in only:
        by_label = {f["label"]: f for f in attnlab.budget_families()}
        model32 = pretrained.load(dtype=torch.float32)
        train = batches_of(pairs[-a.finetune_steps * BATCH:], model32)
        held = batches_of(pairs[:a.pairs], model32)
        fams = a.finetune.split(",")
        specs = [by_label[f]["spec"] if f in by_label else f for f in fams]
        rows = study.finetune(model32, specs, train, held, step, steps=a.finetune_steps, lr=a.lr, evals=4,
                              seed=a.seed)
        family = {attnlab.canonical(s): f for f, s in zip(fams, specs)}
        for r in rows:
            r["family"] = family.get(r["spec"], "exact")
        write(os.path.join(out, "pretrained_finetune.csv.gz"), rows,
              ["family", "arm", "spec", "step", "loss", "loss_se", "gap", "gap_se", "gap_closed", "train_loss",
               "time_per_step_s", "status", "control_loss"],
              dict(config, dtype="float32", steps=a.finetune_steps, lr=a.lr, train_pairs=a.finetune_steps * BATCH))
    print(f"pretrained_study: done in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
