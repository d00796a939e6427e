#!/usr/bin/env python3
"""The drop-in experiment: swap each efficient attention into the project's trained transformers and measure what
the model loses, per model, per layer and per head; and whether the per-head criterion everyone uses
(‖Õ − O‖_F/‖O‖_F of one head) predicts it.

Models: the committed byte-level transformers of tools/trained_attention.py (4 layers x 4 heads, windows of 512
bytes — the causal model reads 511 and predicts the next byte at each — rotary positions), the bidirectional
masked LM (`mlm`: non-causal and causal methods alike) and the causal LM (`causal`: the causal-capable methods
only), in float64, on W evenly spaced held-out windows (text the models never saw).
Model-level measures, on the scored positions (mlm: BERT's 15% masked positions, the same seeded masks for every
method; causal: every next byte):
  loss     cross-entropy in nats/byte, pooled over the scored positions; dloss = loss − exact loss;
  kl       KL(p_exact ‖ p_method) of the predicted byte distributions, mean over scored positions;
  top1     fraction of scored positions where the method's most likely byte is the exact model's.
Standard errors treat windows as the independent units (a cluster-robust ratio estimate over windows); dloss_se is
the paired one (the same windows and masks with and without the method).
Scopes: `all` (every head of every layer swapped), `layer` (every head of one layer, the others exact) and `head`
(one head, the others exact). Head-level measures on the same windows, each head fed the exact model's Q, K, V:
  head_err   ‖Õ − O‖_F/‖O‖_F (the criterion of the figures and the report; on `layer` rows the layer's heads
             together, on `all` rows the root-mean-square over layers of that);
  resid_err  ‖(Õ − O) W_proj,hᵀ‖_F / ‖x_l‖_F: the head's error as it enters the residual stream (weighted by the
             head's out-projection), relative to the stream;
  grad_lin   ⟨∂L/∂O, Õ − O⟩: the first-order change of the loss (the rest of the model's sensitivity to the head,
             through every later layer, from one backward pass of the exact model with torch's attention);
             grad_bound = ‖∂L/∂O‖_F·‖Õ − O‖_F, its Cauchy–Schwarz bound;
  p_tv       mean over rows of the total variation ½‖p − p̃‖₁ of the attention rows (not the KL: the rows of
             Nyström's and Linformer's P̃ are not distributions — they have negative entries).
The measurements are attnlab.study's (Dropin: the library entry point a user runs on their own model); this tool
supplies the committed models, their held-out windows and masks, the loss, and resid_err (which needs the model's
out-projection). Every attention of the swaps, exact included, is computed by attnlab through the model's standard
call; ∂L/∂O comes from one backward of the exact model through attnlab's exact backward. The run checks first that
attnlab's exact attention reproduces the model's own loss (|Δ| is in the .config; tests/python/test_dropin.py holds
it to 1e-10).

Output: a tidy CSV (one row per model, scope, spec, layer, head), resumable: finished units are appended to
OUT.partial as they complete and a rerun with the same settings continues there; OUT.config records the settings.
  tools/dropin.py [--preset quick|paper] [--out results/dropin.csv.gz] [--models mlm,causal] [--windows W] ...
                  [--jobs N] [--threads T]
--jobs N computes the units in N spawned processes (each runs the models' baselines once; the rows are those one
process gives); --threads: torch's and attnlab's threads in each (default 1 with --jobs above 1, else min(2, CPUs)).
"""
import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import trained_attention as ta  # noqa: E402  (pins torch's and OpenBLAS's kernels before torch is imported)
import resumable  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

try:
    import attnlab  # noqa: E402
except ImportError:
    sys.path.insert(0, os.path.join(os.environ.get("ATTNLAB_BUILD", os.path.join(ROOT, "build")), "python"))
    try:
        import attnlab  # noqa: E402
    except ImportError as e:
        sys.exit(f"dropin: the attnlab Python module is not built ({e}); build it with "
                 "`cmake --build build --target attnlab_python` or set ATTNLAB_BUILD")
import attnlab.torch as at  # noqa: E402
import attnlab.study as study  # noqa: E402

PRESETS = {
    # quick: the main job's budget (about a minute per model on 2 cores); paper: every budget everywhere.
    "quick": {"windows": 8, "budgets_all": "middle3", "budgets_detail": "middle1"},
    "paper": {"windows": 32, "budgets_all": "every", "budgets_detail": "every"},
}
COLUMNS = ["code_version", "model", "objective", "scope", "family", "spec", "budget", "layer", "head", "windows",
           "tokens", "loss",
           "loss_se", "dloss", "dloss_se", "kl", "top1", "head_err", "resid_err", "grad_lin", "grad_bound", "p_tv",
           "time_s"]
MASK_SEED = 20261123


def model_options(doc, presets, out):
    """A parser with the options every experiment on the committed models starts with (dropin, finetune)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(presets), default="quick")
    p.add_argument("--out", default=out)
    p.add_argument("--models", default="mlm,causal", help="mlm, causal or both (comma list)")
    return p


def run_options(p):
    """The options they end with: the random methods' seed, threads and worker processes, --quiet."""
    p.add_argument("--seed", type=int, default=0, help="seed of the random methods (layer l draws with seed + l)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of torch and of attnlab in each process (default: 1 with --jobs above 1, else 2 or "
                        "the CPUs)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes computing units side by side (each builds the models' baselines once); on a few "
                        "cores, processes of one thread each use them better than one process of several")
    p.add_argument("--quiet", action="store_true")


def resolve(p, a, presets):
    """The preset's values for the options not given, and --models as a checked list."""
    for k, v in presets[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.jobs < 1 or (a.threads is not None and a.threads < 1):
        p.error(f"--jobs {a.jobs} / --threads {a.threads}: at least 1")
    if a.threads is None:
        a.threads = 1 if a.jobs > 1 else min(2, os.cpu_count() or 1)
    a.models = [m for m in a.models.split(",") if m]
    bad = [m for m in a.models if m not in ta.COMMITTED]
    if bad or not a.models:
        p.error(f"--models: {bad or 'none'}; valid: {', '.join(ta.COMMITTED)}")
    return a


def parse_args(argv):
    p = model_options(__doc__, PRESETS, "results/dropin.csv.gz")
    p.add_argument("--windows", type=int, default=None, help="held-out windows per model (preset: quick 8, paper 32)")
    p.add_argument("--families", default="", help="budget families (error_vs_budget's labels) plus 'linear'; "
                                                   "default: every deployable one the model's mask allows")
    p.add_argument("--budgets-all", default=None,
                   help="budgets of the all-layer swaps: every | middle3 | middle1 | comma list of indices")
    p.add_argument("--budgets-detail", default=None, help="budgets of the per-layer and per-head swaps (same forms)")
    run_options(p)
    a = resolve(p, p.parse_args(argv), PRESETS)
    if a.windows < 2:
        p.error("--windows must be at least 2 (the standard errors need two)")
    return a


def pick(budgets, how):
    if how == "every":
        return list(budgets)
    if how in ("middle3", "middle1"):
        k = 3 if how == "middle3" else 1
        mid = len(budgets) // 2
        lo = max(0, min(mid - k // 2, len(budgets) - k))
        return list(budgets[lo:lo + k])
    idx = [int(i) for i in how.split(",")]
    if any(i < 0 for i in idx):
        raise ValueError(f"budget indices must be ≥ 0, got {how}")
    # A family with fewer budgets (linear: one) takes those it has.
    return [budgets[i] for i in idx if i < len(budgets)]


def families_for(objective, wanted, prog="dropin"):
    """[(label, [(budget, spec)], detail budgets…)] of the families this model's mask allows (prog: the tool that
    names a bad family in its error)."""
    fams = [f for f in attnlab.budget_families() if f["deployable"]]
    fams.append({"label": "linear", "spec": "linear", "budgets": [0], "specs": ["linear"], "deployable": True,
                 "causal": True})
    if wanted:
        names = [w for w in wanted.split(",") if w]
        known = {f["label"] for f in fams}
        bad = [w for w in names if w not in known]
        if bad:
            sys.exit(f"{prog}: unknown famil{'ies' if len(bad) > 1 else 'y'} {bad}; valid: {', '.join(sorted(known))}")
        fams = [f for f in fams if f["label"] in names]
    if objective == "causal":
        fams = [fair_causal(f) for f in fams if f["causal"]]
    return fams


# ---------------------------------------------------------------------------------------------- fair causal VQ
# Transformer-VQ's codebook, fitted by k-means on the window it attends (vq's codebook=window), sees the window's later
# keys: in a causal model O_i would change when keys after i change. A trained Transformer-VQ holds its codebook
# fixed, so the causal studies fit one per layer and head on training windows (the exact model's keys, k-means as the
# method fits it) and hold it on the evaluated windows: codebook=FILE, one file a head (a spec template with {layer}
# and {head}, filled per head by per_head()). The window form stays for the bidirectional model, where it looks at
# nothing a non-causal attention does not.
VQ_WINDOWS, VQ_SEED = 8, 7   # training windows the codebooks are fitted on; their draw's seed
VQ_DIR = os.path.join("data", "vq_codebooks")


def fair_causal(fam):
    """A causal family as the causal studies run it: vq with a held codebook per head (the others as they are)."""
    if not fam["spec"].startswith("vq"):
        return fam
    fam = dict(fam)
    fam["specs"] = [f"{s},codebook={VQ_DIR}/causal/codes{b}/L{{layer}}H{{head}}.npy"
                    for b, s in zip(fam["budgets"], fam["specs"])]
    fam["spec"] = f"{fam['spec']},codebook={VQ_DIR}/causal/codes64/L{{layer}}H{{head}}.npy"
    return fam


def per_head(spec, layer, head):
    """A spec template's spec for one head ({layer}, {head} filled in; a relative codebook path made absolute)."""
    s = spec.replace("{layer}", str(layer)).replace("{head}", str(head))
    return s.replace(f"codebook={VQ_DIR}", f"codebook={os.path.join(ROOT, VQ_DIR)}")


def vq_codebooks(spec):
    """Fits (once: cached under data/vq_codebooks with the model's training key) the held codebooks a causal vq spec
    template names, on VQ_WINDOWS training windows of the committed causal model: per layer and head, k-means
    (attnlab.vq_codebook, the method's own, seeded) on the exact model's keys, rotated as attention sees them."""
    if "{head}" not in spec:
        return
    codes = int(spec.split("codes=")[1].split(",")[0]) if "codes=" in spec else 64
    where = os.path.join(ROOT, VQ_DIR, "causal", f"codes{codes}")
    ck = ta.safe_load(ta.committed("causal", "weights"))
    stamp = {"train_key": ck["train_key"], "windows": VQ_WINDOWS, "seed": VQ_SEED, "codes": codes,
             "attnlab": attnlab.__version__.split("+")[0]}
    meta = os.path.join(where, "meta.json")
    if os.path.exists(meta) and json.load(open(meta)) == stamp:
        return
    a = argparse.Namespace(**ck["config"])
    net = ta.ByteTransformer(a)
    net.load_state_dict(ck["state_dict"])
    net = net.double().eval()
    train = ta.split_corpus(ta.read_corpus("snapshot")[1])[0]
    x, _, _ = ta.make_batch(train, a, torch.Generator().manual_seed(VQ_SEED), VQ_WINDOWS)
    os.makedirs(where, exist_ok=True)
    with torch.no_grad():
        h = net.tok(x)
        for l, blk in enumerate(net.blocks):
            q, k, v = blk.heads(h)
            for head in range(k.shape[1]):
                cb = attnlab.vq_codebook(k[:, head].contiguous().numpy(), codes=codes, seed=0)
                np.save(os.path.join(where, f"L{l}H{head}.npy"), cb)
            h = blk.finish(h, blk.attention(q, k, v))
    with open(meta, "w") as f:
        json.dump(stamp, f)


# ---------------------------------------------------------------------------------------------- the model
class Model:
    """A committed trained model in float64 with its held-out windows and scored positions: the data the study
    runs on (attnlab.study measures)."""

    def __init__(self, objective, windows, shift=0.0):
        ck = ta.safe_load(ta.committed(objective, "weights"))
        self.a = argparse.Namespace(**ck["config"])
        self.objective, self.train_key = objective, ck["train_key"]
        self.net = ta.ByteTransformer(self.a)
        self.net.load_state_dict(ck["state_dict"])
        self.net = self.net.double().eval()
        self.causal = objective == "causal"
        files = ta.read_corpus("snapshot")[1]
        _, held, held_index, _ = ta.split_corpus(files)
        self.a.sequences = windows
        wins = ta.held_out_windows(held, held_index, self.a)
        if shift:   # other windows of the same text: each moved by a fraction of the spacing (disjoint at 0.5)
            step = int(shift * (len(held) - self.a.context) // max(1, windows - 1))
            wins = [(o + step, None, held[o + step:o + step + self.a.context]) for o, _, _ in wins
                    if o + step + self.a.context <= len(held)]
            if len(wins) < 2:
                raise ValueError(f"{windows} windows shifted by {shift}: fewer than 2 fit in the held-out text")
        tokens = torch.from_numpy(np.stack([w for _, _, w in wins]).astype(np.int64))
        self.starts = [int(o) for o, _, _ in wins]
        if self.causal:   # next byte: every position but the last is scored against the byte after it
            self.x, self.target = tokens[:, :-1], tokens[:, 1:]
            self.scored = torch.ones_like(self.target, dtype=torch.bool)
        else:             # BERT's masking (80% [MASK], 10% random, 10% kept) of 15%, seeded: the same for every method
            gen = torch.Generator().manual_seed(MASK_SEED)
            x, chosen = tokens.clone(), torch.rand(tokens.shape, generator=gen) < 0.15
            r = torch.rand(tokens.shape, generator=gen)
            x[chosen & (r < 0.8)] = ta.MASK
            rnd = chosen & (r >= 0.8) & (r < 0.9)
            x[rnd] = torch.randint(0, 256, (int(rnd.sum()),), generator=gen)
            self.x, self.target, self.scored = x, tokens, chosen
        self.L, self.H = len(self.net.blocks), self.a.heads
        self.tokens = int(self.scored.sum())
        self.batches = [(self.x, self.target, self.scored)]   # one batch: the windows are its rows (the clusters)

    def study(self, seed=0, measures=True):
        """attnlab.study's Dropin on these windows (the baseline run once), with resid_err as a head measure."""
        # reuse_layers: the blocks are functions of their input and weights (trained_attention.Block)
        return study.Dropin(self.net, self.batches, step, seed=seed, measures=measures,
                            head_extra=self.resid_err if measures else None, reuse_layers=True)

    def streams(self):
        """The residual stream entering each block in the exact run through attnlab (the resid_err denominator)."""
        if not hasattr(self, "_xs"):
            xs = []
            hooks = [blk.register_forward_pre_hook(lambda m, inp: xs.append(inp[0])) for blk in self.net.blocks]
            try:
                with torch.no_grad(), at.swap(self.net, "exact"):
                    self.net(self.x)
            finally:
                for h in hooks:
                    h.remove()
            self._xs = xs
        return self._xs

    def resid_err(self, layer, heads, deltas):
        """‖(Õ − O) W_proj,hᵀ‖_F / ‖x_l‖_F of these heads together: their error as it enters the residual stream,
        through their columns of the out-projection, relative to the stream."""
        (d,) = deltas   # one batch
        d = torch.from_numpy(d)
        B, h, n, dh = d.shape
        w = self.net.blocks[layer].proj.weight
        cols = torch.cat([w[:, i * dh:(i + 1) * dh] for i in heads], 1)
        return {"resid_err": float((d.transpose(1, 2).reshape(B, n, h * dh) @ cols.T).norm()
                                   / self.streams()[layer].norm())}

    @torch.no_grad()
    def torch_loss(self):
        """The model's own forward (torch's attention) on the same windows, per position."""
        return step(self.net, self.batches[0])["loss"]


def step(net, batch):
    """The study's step: per-position cross-entropy of the windows (nats), the scored positions, the logits."""
    x, target, scored = batch
    logits = net(x)
    ce = -torch.log_softmax(logits, -1).gather(-1, target[..., None])[..., 0]
    return {"loss": ce, "mask": scored, "logits": logits}


def pooled_windows(s_w, n_w):
    """The pooled mean Σ s_w / Σ n_w of per-window sums s_w over n_w scored positions and its standard error with
    the windows as the independent units (a ratio estimate: √(W/(W−1)·Σ (s_w − mean·n_w)²) / Σ n_w): finetune's
    rows, recomputed from the stored window sums."""
    total = n_w.sum()
    mean = s_w.sum() / total
    W = len(n_w)
    se = torch.sqrt(W / (W - 1) * ((s_w - mean * n_w) ** 2).sum()) / total
    return float(mean), float(se)


def spec_for(spec):
    """The spec the study runs: a held-codebook template's relative path made absolute ({layer}, {head} kept)."""
    return spec.replace(f"codebook={VQ_DIR}", f"codebook={os.path.join(ROOT, VQ_DIR)}")


def unit_rows(d, spec, scope):
    """The rows of one unit (scope exact: the baseline; all: one; layer: one a layer; head: one a head)."""
    if scope == "exact":
        return [dict(d.baseline)]
    return [d.unit(spec_for(spec), scope, l, h) for l, h in d.units(spec, scope)]


# ---------------------------------------------------------------------------------------------- the run
def complete_units(rows, shapes):
    """The rows of the units finished whole (exact and all: 1 row; layer: L; head: L·H), and those units' keys:
    a unit torn by an interrupt, or a malformed line, is dropped and computed again."""
    units = {}
    for r in rows:
        if None in r or any(v is None for v in r.values()) or r.get("model") not in shapes:
            continue
        units.setdefault((r["model"], r["spec"], r["scope"]), []).append(r)
    keep, done = [], set()
    for (model, spec, scope), rs in units.items():
        L, H = shapes[model]
        if len(rs) == {"exact": 1, "all": 1, "layer": L, "head": L * H}.get(scope, -1):
            keep += rs
            done.add((model, spec, scope))
    return keep, done


# One process's studies (a worker's, or this process's when --jobs is 1): each model's baseline run once, kept.
_WORK = {}


def start_work(threads, windows, seed):
    """A worker's (or this process's) settings: torch's and attnlab's threads, the windows, the random seed."""
    torch.set_num_threads(threads)
    attnlab.set_threads(threads)
    _WORK.update(windows=windows, seed=seed, studies={})


def study_of(model_name):
    """(Model, its Dropin, the check of attnlab's exact against the model's own forward), built once a process."""
    if model_name not in _WORK["studies"]:
        model = Model(model_name, _WORK["windows"])
        d = model.study(seed=_WORK["seed"])
        # attnlab's exact attention against the model's own forward, every position (scored or not)
        ce, native, m = d.base.tokens[0], d.own.tokens[0], model.scored
        check = {"exact_loss_attnlab": float(ce[m].sum() / model.tokens),
                 "exact_loss_torch": float(native[m].sum() / model.tokens),
                 "max_abs_token_ce_difference": float((ce - native).abs().max()),
                 "windows": _WORK["windows"], "scored_tokens": model.tokens,
                 "window_starts": model.starts, "train_key": model.train_key}
        _WORK["studies"][model_name] = (model, d, check)
    return _WORK["studies"][model_name]


def work_unit(task):
    """One unit's rows, annotated, its wall time and the model's check; unit None: the check only."""
    model_name, unit = task
    model, d, check = study_of(model_name)
    if unit is None:
        return [], 0.0, check
    label, budget, spec, scope = unit
    t = time.time()
    new = unit_rows(d, spec, scope)
    took = time.time() - t
    for r in new:
        r.update(code_version=attnlab.__version__, model=model_name,
                 objective="masked-LM" if model_name == "mlm" else "next-byte", family=label, spec=spec,
                 budget=budget, windows=_WORK["windows"], tokens=model.tokens, time_s=round(took / len(new), 3))
    return new, took, check


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    out = a.out
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    # The rows do not depend on --jobs (every unit is computed from its model's baseline alone); torch's threads
    # change a few in their last bits.
    config = {"preset": a.preset, "windows": a.windows, "models": a.models, "families": a.families,
              "budgets_all": a.budgets_all, "budgets_detail": a.budgets_detail, "seed": a.seed,
              "mask_seed": MASK_SEED, "attnlab": attnlab.__version__, "attnlab_threads": a.threads,
              "torch": torch.__version__, "torch_threads": a.threads, "kernels": ta.KERNELS}
    families = {m: families_for(m, a.families) for m in a.models}   # bad names fail here, before any work
    # What the rows depend on beyond the settings: the weights (their training keys) and this code.
    shapes = {}
    for m in a.models:
        ck = ta.safe_load(ta.committed(m, "weights"))
        shapes[m] = (ck["config"]["layers"], ck["config"]["heads"])
        config.setdefault("train_keys", {})[m] = ck["train_key"]
    config, key = resumable.settings_key(config, [os.path.abspath(__file__), ta.__file__, study.__file__])
    part = resumable.Partial(out, "dropin", key, COLUMNS, lambda rows: complete_units(rows, shapes))
    rows, done = part.rows, part.done
    tasks, total = [], {}
    for model_name in a.models:
        units = []
        for f in families[model_name]:
            budgets = list(zip(f["budgets"], f["specs"]))
            for b, s in pick(budgets, a.budgets_all):
                units.append((f["label"], b, s, "all"))
            for b, s in pick(budgets, a.budgets_detail):
                units += [(f["label"], b, s, "layer"), (f["label"], b, s, "head")]
        units.insert(0, ("exact", "", "exact", "exact"))
        todo = [u for u in units if (model_name, u[2], u[3]) not in done]
        for spec in dict.fromkeys(u[2] for u in todo):   # the held vq codebooks the causal units name (fitted here,
            vq_codebooks(spec)                            # before the workers read them)
        if not a.quiet:
            print(f"dropin: {model_name}: {len(units)} units ({len(units) - len(todo)} done), {a.windows} windows",
                  file=sys.stderr)
        # a model with every unit done still gives its check (the config's)
        tasks += [(model_name, u) for u in todo] or [(model_name, None)]
        total[model_name] = len(todo)
    checks, finished, t_start = {}, {m: 0 for m in a.models}, time.time()
    if not a.quiet and a.jobs > 1:
        print(f"dropin: {len(tasks)} units on {min(a.jobs, len(tasks))} processes of {a.threads} thread(s)",
              file=sys.stderr)
    for (model_name, unit), (new, took, check) in resumable.pool(tasks, work_unit, a.jobs, start_work,
                                                                   (a.threads, a.windows, a.seed)):
        if model_name not in checks:
            checks[model_name] = check
            if not a.quiet:
                print(f"dropin: {model_name}: {check['scored_tokens']} scored bytes; attnlab exact vs the model's own "
                      f"loss: |Δ| = {abs(check['exact_loss_attnlab'] - check['exact_loss_torch']):.1e}",
                      file=sys.stderr)
        if unit is None:
            continue
        part.append(new)
        finished[model_name] += 1
        if not a.quiet:
            el, i, n = time.time() - t_start, sum(finished.values()), sum(total.values())
            canonical = attnlab.canonical(per_head(unit[2], 0, 0)) if unit[2] != "exact" else "exact"
            print(f"dropin: {model_name} {finished[model_name]}/{total[model_name]} {unit[3]:5s} {canonical[:60]} "
                  f"({took:.1f} s; elapsed {el:.0f} s, ~{el / i * (n - i):.0f} s left)", file=sys.stderr)
    # The finished table, sorted, written atomically; then its settings.
    order = {c: i for i, c in enumerate(["exact", "all", "layer", "head"])}
    rows.sort(key=lambda r: (r["model"], order[r["scope"]], r["family"], float(r["budget"] or 0),
                             int(r["layer"] or -1), int(r["head"] or -1)))
    checks = {m: checks[m] for m in a.models}
    part.finish(out, dict(config, checks=checks, jobs=a.jobs, command="tools/dropin.py " + " ".join(argv)), "dropin",
                t_start)
    return 0


if __name__ == "__main__":
    resumable.command(main, "dropin")
