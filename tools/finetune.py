#!/usr/bin/env python3
"""The fine-tuning experiment: swap each efficient attention into every head of every layer of the project's trained
transformers and train on, through attnlab's backward, for a fixed number of steps: how much of the drop-in loss
(tools/dropin.py) does training win back, and what does a training step cost against exact attention's?

Why: the papers did not use their approximations as drop-ins. Linformer and Nyströmformer were pretrained with
their attention (Nyströmformer's reference code can also start from RoBERTa's weights: mlpen/Nystromformer,
reorganized_code/RoBERT/run_pretrain.py, "roberta_path"); Performer's "backwards compatibility" experiment fine-tunes
a Transformer's weights with FAVOR+ swapped in; Hedgehog and LoLCATs train after swapping. The drop-in loss is where
such a run starts, not where it ends.

Models: the committed byte-level transformers (tools/trained_attention.py; 4 layers × 4 heads, windows of 512 bytes,
rotary positions): `mlm` (bidirectional, every deployable family) and `causal` (the causal-capable ones). Each
family at its method's default budget (the spec of attnlab.budget_families() with no budget given: e.g. `nystrom`
is 64 landmarks, `performer` 256 features; the canonical spec is in the rows), plus two controls trained the same
way: `exact` (attnlab's exact attention: continued training moves the loss too, so recovery is measured against
exact's loss at the same step) and `torch` (the model's own softmax attention through PyTorch's autograd: the same
numbers as `exact` to float32 rounding, and the time per step a user has today).
Training: from the committed weights, float32 (what users train in; the drop-in experiment runs in float64: step 0
here equals its loss to float32 rounding where the method is well conditioned and makes no discrete choice — buckets,
codes and selected queries can flip), the SAME seeded sequence of training batches for every family (the
train split, drawn and masked as trained_attention.make_batch draws them, from a seed other than pretraining's),
AdamW as in pretraining (betas 0.9, 0.98, weight decay 0.01, gradients clipped at 1) at peak learning rate 1e-3
with linear warm-up over the first 10% of the steps and cosine decay to 0. Why 1e-3: a fifth of pretraining's
peak (5e-3), the rate its cosine schedule had 70% of the way through: large enough to move in a few dozen steps.
It is not free: pretraining ended at a rate of zero, and the exact control's loss rises by a few hundredths of a
nat in the quick preset's 24 steps of 2 sequences (measured at 3e-4 and 1e-4 too, by less) — which is why recovery
is measured against the control at the same step, not against the committed model. The warm-up because a fresh
AdamW moves every weight by about the learning rate in its first step. Random methods keep their draw
(seed + layer) for the whole run: features, projections, rotations and samples are held fixed, the gradient
flowing through them (implementations of Performer redraw its features during training: lucidrains'
performer-pytorch by default every 1000 steps, more than either preset runs). A non-finite training loss or
gradient stops the run: `status` says so and the later held-out losses stay empty (an outcome, not a crash).
Held-out loss: the drop-in experiment's windows and scored positions (dropin.Model: evenly spaced held-out windows,
the same seeded BERT masks), cross-entropy pooled over the scored bytes in nats/byte, standard errors with the
windows as the independent units, at step 0 (the drop-in loss) and at evenly spaced steps to the end.

Columns, one row per model × family × evaluated step:
  code_version, model, objective, family, spec (canonical), budget, step, steps, lr, batch (sequences per step),
  windows, tokens (scored held-out bytes), status (ok | diverged at step s | error at step s: …),
  heldout_loss, heldout_loss_se     the held-out loss at this step (nats/byte) and its standard error;
  train_loss                        mean training-batch loss over the steps since the previous evaluation;
  exact_loss_step0, exact_loss_same_step   the exact control's held-out loss before training and at this step;
  dropin_loss, dropin_dloss         this family's loss at step 0 and its excess over exact there;
  gap, gap_se                       heldout_loss − exact_loss_same_step, with the paired standard error (the same
                                    windows and masks);
  gap_closed                        (dropin_loss − heldout_loss) / (dropin_loss − exact_loss_same_step): the share
                                    of the way from the drop-in loss to the exact control's that training covered
                                    (1: all of it; < 0: worse than the drop-in); empty when the drop-in loss is
                                    within two paired standard errors of exact's (nothing to close) and for the
                                    controls;
  time_per_step_s                   median wall time of an optimizer step (forward, backward, clipping, update) of
                                    this family; time_per_step_exact_s, time_per_step_torch_s: the controls' in the
                                    same run; time_ratio_exact, time_ratio_torch: this one's over theirs;
  time_unit_s                       the whole unit's wall time (training and evaluations);
  time_load_avg                     the machine's 1-minute load average when the unit ended: above the cores the
                                    run uses (jobs × torch_threads in the .config), other jobs shared the machine
                                    and the unit's times are inflated (with --jobs N, each unit's times are one
                                    process's of --threads threads, the other workers training beside it: the main
                                    job's, 2 processes of 1 thread, time one thread with the other core busy,
                                    except the last unit or two, which may finish alone and then time lower);
  window_loss_sums                  the per-window sums of the scored bytes' losses (';'-separated): paired
                                    comparisons between any two rows of a model.
Timing columns vary between runs and machines (the controls are timed in the same run, so their ratios are the
quotable number); every other value is reproducible on one machine (float32 training is bitwise deterministic given
the CPU's kernels, which tools/trained_attention.py pins).

Output: results/finetune.csv.gz, resumable (finished (model, family) units are appended to OUT.partial; a rerun with
the same settings continues there) with OUT.config (settings, and the exact-vs-torch check of step 0).
  tools/finetune.py [--preset quick|paper] [--out results/finetune.csv.gz] [--models mlm,causal] [--families F,…]
                    [--steps S] [--evals E] [--windows W] [--batch B] [--lr LR] [--jobs N] [--threads T] ...
--jobs N trains the units in N spawned processes (the rows are those one process gives, but the times: see
time_load_avg); --threads: torch's and attnlab's threads in each (default 1 with --jobs above 1, else min(2, CPUs)).
"""
import argparse
import functools
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dropin  # noqa: E402  (pins the kernels, finds the attnlab module; the held-out windows and masks)
import resumable  # noqa: E402
from dropin import attnlab, study, ta, torch  # noqa: E402

PRESETS = {
    # quick: the main job's budget (about 2 minutes for both models on 2 cores); paper: a real fine-tune.
    "quick": {"steps": 24, "evals": 4, "windows": 8, "batch": 2, "micro_batch": 2},
    "paper": {"steps": 300, "evals": 12, "windows": 32, "batch": 8, "micro_batch": 2},
}
CONTROLS = ("exact", "torch")   # attnlab's exact attention; the model's own (PyTorch) attention
BATCH_SEED = 2024   # not pretraining's seed 0: its first batches are the ones the model saw first
COLUMNS = ["code_version", "model", "objective", "family", "spec", "budget", "step", "steps", "lr", "batch", "windows",
           "tokens", "status", "heldout_loss", "heldout_loss_se", "train_loss", "exact_loss_step0",
           "exact_loss_same_step", "dropin_loss", "dropin_dloss", "gap", "gap_se", "gap_closed", "time_per_step_s",
           "time_per_step_exact_s", "time_per_step_torch_s", "time_ratio_exact", "time_ratio_torch",
           "time_unit_s", "time_load_avg", "window_loss_sums"]


def parse_args(argv):
    p = dropin.model_options(__doc__, PRESETS, "results/finetune.csv.gz")
    p.add_argument("--families", default="", help="budget families (error_vs_budget's labels) plus 'linear'; default: "
                                                   "every deployable one the model's mask allows. The controls (exact, "
                                                   "torch) always run: the gap and the time ratios need them")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (preset: quick 24, paper 300)")
    p.add_argument("--evals", type=int, default=None,
                   help="held-out evaluations after step 0, evenly spaced, the last at the end (quick 4, paper 12)")
    p.add_argument("--windows", type=int, default=None, help="held-out windows per model (quick 8, paper 32)")
    p.add_argument("--batch", type=int, default=None, help="sequences per optimizer step (quick 2, paper 8)")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per forward pass (gradients accumulate)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (see the module docstring for why)")
    dropin.run_options(p)
    a = dropin.resolve(p, p.parse_args(argv), PRESETS)
    for name, low in (("steps", 1), ("evals", 1), ("windows", 2), ("batch", 1), ("micro_batch", 1), ("threads", 1)):
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}" +
                    (" (the standard errors need two)" if name == "windows" else ""))
    if a.evals > a.steps:
        p.error(f"--evals {a.evals} is more than --steps {a.steps}")
    if a.batch % a.micro_batch:
        p.error(f"--batch {a.batch} is not a multiple of --micro-batch {a.micro_batch}")
    if not (0 < a.lr < 1) or not math.isfinite(a.lr):
        p.error("--lr must be in (0, 1)")
    return a


def eval_steps(steps, evals):
    """Step 0 and `evals` evenly spaced steps, the last one `steps`."""
    return sorted({0} | {round(steps * i / evals) for i in range(1, evals + 1)})


def units_for(objective, wanted):
    """[(family, spec, budget)]: the controls, then every family the model's mask allows at its default budget."""
    names = [w for w in wanted.split(",") if w]
    others = ",".join(w for w in names if w not in CONTROLS)
    fams = dropin.families_for(objective, others, prog="finetune") if others or not names else []
    out = [(c, c, "") for c in CONTROLS]
    for f in fams:
        # canonical with a held codebook template kept as given (a causal vq: dropin.fair_causal)
        base, _, held = f["spec"].partition(",codebook=")
        spec = attnlab.canonical(base).replace("codebook=window", f"codebook={held}") if held else \
            attnlab.canonical(f["spec"])
        params = dict(kv.split("=", 1) for kv in spec.partition(":")[2].split(",") if "=" in kv)
        out.append((f["label"], spec, params.get(f.get("param", ""), "")))
    return out


@functools.lru_cache(maxsize=1)
def train_bytes():
    """The corpus's training split (read once a process: the tests build several runs)."""
    return ta.split_corpus(ta.read_corpus("snapshot")[1])[0]


class Run:
    """One model's fine-tuning runs: its committed weights, held-out windows (dropin.Model's) and the training
    batches every family sees. The training and the held-out losses are attnlab.study.finetune's (the library entry
    point a user runs on their own model); this supplies the model, the batches and the loss."""

    def __init__(self, objective, a):
        self.objective, self.a = objective, a
        self.ck = ta.safe_load(ta.committed(objective, "weights"))
        self.cfg = argparse.Namespace(**self.ck["config"])
        self.held = dropin.Model(objective, a.windows)   # windows, masks, scored positions (its float64 net unused)
        self.tokens = self.held.tokens
        self.n_w = self.held.scored.sum(1).double()
        train = train_bytes()
        gen = torch.Generator().manual_seed(BATCH_SEED)
        parts = a.batch // a.micro_batch
        self.batches = [[ta.make_batch(train, self.cfg, gen, a.micro_batch) for _ in range(parts)]
                        for _ in range(a.steps)]
        h, mb = self.held, a.micro_batch
        self.eval_batches = [(h.x[i:i + mb], h.target[i:i + mb], h.scored[i:i + mb]) for i in range(0, len(h.x), mb)]

    def model(self):
        """The committed model in float32 (what users train in), its attention through the standard call."""
        net = ta.ByteTransformer(self.cfg)
        net.load_state_dict(self.ck["state_dict"])
        return net

    def finetune(self, spec):
        """Trains the model with `spec` swapped in (the controls: "exact", attnlab's exact attention; "torch", the
        model's own through torch's autograd); returns ({step: (window sums, train loss)} of the steps evaluated,
        [the median step time], status)."""
        a = self.a
        kw = dict(steps=a.steps, lr=a.lr, evals=a.evals, weight_decay=0.01, clip=1.0, seed=a.seed,
                  accumulate=a.batch // a.micro_batch, objective=ta.loss_of, progress=False)
        train = [mb for step in self.batches for mb in step]
        if spec in CONTROLS:
            rows = study.finetune(self.model(), [], train, self.eval_batches, dropin.step,
                                  controls=("exact" if spec == "exact" else "own",), **kw)
        else:
            rows = study.finetune(self.model(), [dropin.spec_for(spec)], train, self.eval_batches, dropin.step,
                                  controls=(), **kw)
        evals = {r["step"]: (torch.tensor(r["sums"], dtype=torch.float64), r["train_loss"]) for r in rows
                 if "sums" in r}
        t = rows[0].get("time_per_step_s", math.nan)
        return evals, [] if math.isnan(t) else [t], rows[0]["status"]


def rows_of(run, family, spec, budget, evals, times, status, took):
    """The unit's rows: its own measures (relative_to_controls adds those against the controls)."""
    a = run.a
    out = []
    for step in eval_steps(a.steps, a.evals):
        sums, train = evals.get(step, (None, math.nan))
        r = dict(code_version=attnlab.__version__, model=run.objective,
                 objective="masked-LM" if run.objective == "mlm" else "next-byte", family=family, spec=spec,
                 budget=budget, step=step, steps=a.steps, lr=a.lr, batch=a.batch, windows=a.windows,
                 tokens=run.tokens, status=status, time_per_step_s=statistics.median(times) if times else "",
                 time_unit_s=round(took, 2), time_load_avg=round(os.getloadavg()[0], 2))
        if sums is not None:
            r["heldout_loss"], r["heldout_loss_se"] = dropin.pooled_windows(sums, run.n_w)
            r["window_loss_sums"] = ";".join(resumable.fmt(float(s)) for s in sums)
            if step:
                r["train_loss"] = train
        out.append(r)
    return out


def number(v):
    return float(v) if v not in (None, "") else math.nan


def relative_to_controls(rows, n_w):
    """Every row's measures against its model's controls at the same step (rows: formatted dicts of one model; n_w:
    the scored bytes per held-out window): the exact control's losses, the drop-in loss and gap, the gap with its
    paired standard error, gap_closed, and the time ratios. Run over the whole table, so resumed units get them."""
    ctrl = {(r["family"], r["step"]): r for r in rows if r["family"] in CONTROLS}
    start = {r["family"]: r for r in rows if r["step"] == "0"}

    def sums(r):
        return torch.tensor([float(x) for x in r["window_loss_sums"].split(";")], dtype=torch.float64) \
            if r and r.get("window_loss_sums") else None

    def gap(r, e):
        mine, theirs = sums(r), sums(e)
        return dropin.pooled_windows(mine - theirs, n_w) if mine is not None and theirs is not None else (math.nan,) * 2

    for r in rows:
        e, e0, r0 = ctrl.get(("exact", r["step"])), ctrl.get(("exact", "0")), start.get(r["family"])
        new = dict(exact_loss_step0=number(e0 and e0["heldout_loss"]),
                   exact_loss_same_step=number(e and e["heldout_loss"]), dropin_loss=number(r0 and r0["heldout_loss"]))
        new["gap"], new["gap_se"] = gap(r, e)
        d0, d0_se = gap(r0, e0)
        new["dropin_dloss"] = d0
        denom = new["dropin_loss"] - new["exact_loss_same_step"]
        # A share of the drop-in gap only where there is one beyond its noise (two paired standard errors).
        if r["family"] not in CONTROLS and denom > 2 * d0_se:
            new["gap_closed"] = (new["dropin_loss"] - number(r["heldout_loss"])) / denom
        for c in CONTROLS:
            mine, theirs = number(r["time_per_step_s"]), number(ctrl.get((c, "0"), {}).get("time_per_step_s"))
            new[f"time_per_step_{c}_s"], new[f"time_ratio_{c}"] = theirs, mine / theirs
        r.update({k: resumable.fmt(v) if isinstance(v, float) and math.isfinite(v) else "" for k, v in new.items()})


def complete(rows, n_evals):
    """The rows of the (model, family) units finished whole, and those units."""
    units = {}
    for r in rows:
        if None in r or any(v is None for v in r.values()):
            continue
        units.setdefault((r["model"], r["family"]), []).append(r)
    keep, done = [], set()
    for key, rs in units.items():
        if len(rs) == n_evals:
            keep += rs
            done.add(key)
    return keep, done


# One process's runs (a worker's, or this process's when --jobs is 1): each model's Run built once, kept.
_WORK = {}


def start_work(a):
    """A worker's (or this process's) settings: the parsed options; torch's and attnlab's threads."""
    torch.set_num_threads(a.threads)
    attnlab.set_threads(a.threads)
    _WORK.update(a=a, runs={})


def work_unit(task):
    """One (model, family) unit trained: its rows."""
    m, (family, spec, budget) = task
    if m not in _WORK["runs"]:
        _WORK["runs"][m] = Run(m, _WORK["a"])
    run = _WORK["runs"][m]
    t = time.time()
    evals, times, status = run.finetune(spec)
    return rows_of(run, family, spec, budget, evals, times, status, time.time() - t)


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    units = {m: units_for(m, a.families) for m in a.models}   # bad names fail here, before any work
    os.makedirs(os.path.dirname(os.path.abspath(a.out)) or ".", exist_ok=True)
    config = {"preset": a.preset, "steps": a.steps, "evals": eval_steps(a.steps, a.evals), "windows": a.windows,
              "batch": a.batch, "micro_batch": a.micro_batch, "lr": a.lr, "schedule": "warm-up 10%, cosine to 0",
              "optimizer": "AdamW(betas=(0.9, 0.98), weight_decay=0.01), clip 1.0", "dtype": "float32",
              "batch_seed": BATCH_SEED, "seed": a.seed, "mask_seed": dropin.MASK_SEED, "models": a.models,
              "families": a.families, "attnlab": attnlab.__version__, "attnlab_threads": a.threads,
              "torch": torch.__version__, "torch_threads": a.threads, "kernels": ta.KERNELS,
              "train_keys": {m: ta.safe_load(ta.committed(m, "weights"))["train_key"] for m in a.models}}
    config, key = resumable.settings_key(config, [os.path.abspath(__file__), dropin.__file__, ta.__file__,
                                                  study.__file__])
    n_evals = len(eval_steps(a.steps, a.evals))
    part = resumable.Partial(a.out, "finetune", key, COLUMNS, lambda rows: complete(rows, n_evals))
    checks, t_start = {}, time.time()
    tasks, total = [], {}
    for m in a.models:
        todo = [u for u in units[m] if (m, u[0]) not in part.done]
        if todo and not a.quiet:
            print(f"finetune: {m}: {len(units[m])} units ({len(units[m]) - len(todo)} done), {a.steps} steps of "
                  f"{a.batch} sequences, {a.windows} held-out windows", file=sys.stderr)
        for spec in dict.fromkeys(u[1] for u in todo):   # the held vq codebooks the causal units name (fitted here,
            dropin.vq_codebooks(spec)                     # before any worker reads them)
        tasks += [(m, u) for u in todo]
        total[m] = len(todo)
    if tasks and not a.quiet and a.jobs > 1:
        print(f"finetune: {len(tasks)} units on {min(a.jobs, len(tasks))} processes of {a.threads} thread(s): each "
              "unit's step times are one process's, beside the others", file=sys.stderr)
    finished = {m: 0 for m in a.models}
    for (m, (family, spec, budget)), rows in resumable.pool(tasks, work_unit, a.jobs, start_work, (a,)):
        part.append(rows)
        finished[m] += 1
        if not a.quiet:
            first, last, el = rows[0], rows[-1], time.time() - t_start
            i, n = sum(finished.values()), len(tasks)
            print(f"finetune: {m} {finished[m]}/{total[m]} {family:18s} held-out loss "
                  f"{first.get('heldout_loss', math.nan):.3f} -> {last.get('heldout_loss', math.nan):.3f}, "
                  f"{number(last.get('time_per_step_s')):.3f} s/step; {last['status']} ({rows[0]['time_unit_s']} s; "
                  f"elapsed {el:.0f} s, ~{el / i * (n - i):.0f} s left)", file=sys.stderr)
    for m in a.models:
        # attnlab's exact attention against the model's own at step 0 (float32; the drop-in run checks float64)
        ex = {r["family"]: r for r in part.rows if r["model"] == m and r["step"] == "0" and r["family"] in CONTROLS}
        if all(c in ex and ex[c]["heldout_loss"] != "" for c in CONTROLS):
            checks[m] = {"step0_exact_minus_torch": float(ex["exact"]["heldout_loss"]) -
                         float(ex["torch"]["heldout_loss"]), "scored_tokens": int(ex["exact"]["tokens"])}
    for m in a.models:
        relative_to_controls([r for r in part.rows if r["model"] == m],
                             dropin.Model(m, a.windows).scored.sum(1).double())
    order = {(m, f): (i, j) for i, m in enumerate(a.models) for j, (f, _, _) in enumerate(units[m])}
    part.rows.sort(key=lambda r: (order[r["model"], r["family"]], int(r["step"])))
    part.finish(a.out, dict(config, checks=checks, jobs=a.jobs, seconds=round(time.time() - t_start, 1),
                            command="tools/finetune.py " + " ".join(argv)), "finetune", t_start)
    return 0


if __name__ == "__main__":
    resumable.command(main, "finetune")
