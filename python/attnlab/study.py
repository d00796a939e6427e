"""attnlab.study: the model-level studies on your model, your batches and your loss.

    import attnlab.study as study
    def step(model, batch):                        # your forward and loss, per token (or per example)
        x, y = batch
        logits = model(x)
        return {"loss": F.cross_entropy(logits.transpose(1, 2), y, reduction="none"), "logits": logits}
    rows = study.dropin(model, batches, step, ["nystrom", "performer:features=128"], scopes=("all", "head"))
    study.predictors(rows)                         # which head measure predicts the model's loss increase
    study.finetune(model, "nystrom", train_batches, held_out, step, steps=50, lr=1e-4)

The model computes attention through nn.MultiheadAttention or torch.nn.functional.scaled_dot_product_attention (the
standard call; attnlab.sdpa on torch 1.13): attnlab.torch.swap's rules. Every attention of a study's forward runs
through attnlab, the unswapped heads by attnlab's exact attention, so that the only difference between a row and the
baseline is the method (the baseline's distance from the model's own forward is returned as a check). A unit reuses
the baseline's exact outputs where a call's inputs are the baseline's, bit for bit (the layers before the swapped one,
the unswapped heads of its layer): the same values, attention computed only where the swap changed something.

`step(model, batch)` returns the losses of one batch: a tensor (B,) per example or (B, T) per token, or a dict with
"loss" (that tensor), optionally "mask" (bool, like loss: the scored positions; default all) and "logits" (the
output distribution's logits, loss's shape + (V,): KL and top-1 agreement are then measured). Losses are pooled over
the scored units; standard errors treat the batch's examples (its rows) as the independent clusters, and the loss
increase's is paired (the same examples with and without the method). Float64 models give the cleanest comparisons.
"""
import copy
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

import attnlab
from . import stats
from . import torch as at

__all__ = ["Dropin", "dropin", "predictors", "finetune", "choose", "Run", "MEASURES"]

# The head-level measures (scope "head" rows) tested as predictors of a one-head swap's loss increase.
MEASURES = {
    "head_err": "head output error ‖Õ − O‖_F/‖O‖_F",
    "grad_bound": "sensitivity-weighted error ‖∂L/∂O‖_F·‖Õ − O‖_F",
    "grad_lin": "first-order loss change ⟨∂L/∂O, Õ − O⟩",
    "p_tv": "attention-row total variation ½‖p − p̃‖₁ (mean over rows)",
}


def _parts(out):
    """step()'s result as (loss (C, T) float64, mask (C, T) bool, logits or None): C clusters (examples)."""
    if isinstance(out, dict):
        loss, mask, logits = out.get("loss"), out.get("mask"), out.get("logits")
    else:
        loss, mask, logits = out, None, None
    if not isinstance(loss, torch.Tensor) or loss.dim() not in (1, 2):
        got = f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}"
        raise ValueError(f"study: step() must return a loss tensor (B,) or (B, T), or a dict with 'loss' (got {got})")
    if loss.dim() == 1:
        loss = loss[:, None]
        mask = None if mask is None else mask.reshape(-1, 1)
        logits = None if logits is None else logits[:, None]
    if mask is None:
        mask = torch.ones(loss.shape, dtype=torch.bool)
    if mask.shape != loss.shape:
        raise ValueError(f"study: mask {tuple(mask.shape)} is not the loss's shape {tuple(loss.shape)}")
    if logits is not None and tuple(logits.shape[:-1]) != tuple(loss.shape):
        raise ValueError(f"study: logits {tuple(logits.shape)} do not match the loss {tuple(loss.shape)} + (V,)")
    return loss, mask.bool(), logits


class _Outcome:
    """One configuration's losses over every batch: per-cluster sums and counts, per-token values, log-probs."""

    def __init__(self):
        self.sums, self.counts, self.tokens, self.masks, self.logp, self.extras = [], [], [], [], [], []
        self.finite = True

    def add(self, out):
        self.extras.append(out.get("extra") if isinstance(out, dict) else None)
        loss, mask, logits = _parts(out)
        loss = loss.detach().double()
        if not bool(torch.isfinite(loss[mask]).all()):
            self.finite = False
        self.sums.append((loss * mask).sum(1))
        self.counts.append(mask.sum(1).double())
        self.tokens.append(loss)
        self.masks.append(mask)
        self.logp.append(None if logits is None else torch.log_softmax(logits.detach().double(), -1))

    def mean(self):
        return stats.pooled(torch.cat(self.sums).numpy(), torch.cat(self.counts).numpy())


def _run(model, batches, step, spec, seed, memo=None):
    """The outcome of every batch with `spec` swapped in (swap's spec forms), under no_grad (memo: the baseline's
    exact outputs, reused where a call's inputs are the baseline's)."""
    out = _Outcome()
    with torch.no_grad(), at.swap(model, spec, seed=seed, memo=memo) as s:
        for b in batches:
            out.add(step(model, b))
        out.calls = list(s.calls)
    return out


def _compare(out, base):
    """Model-level measures of `out` against the baseline: loss, its SE, dloss and its paired SE, KL, top-1."""
    loss, loss_se = out.mean()
    counts = torch.cat(base.counts).numpy()
    dloss, dloss_se = stats.pooled(torch.cat(out.sums).numpy() - torch.cat(base.sums).numpy(), counts)
    r = dict(loss=loss, loss_se=loss_se, dloss=dloss, dloss_se=dloss_se, kl=math.nan, top1=math.nan,
             finite=out.finite)
    if all(p is not None for p in out.logp) and all(p is not None for p in base.logp):
        kl = top = total = 0.0
        for lp, lp0, m in zip(out.logp, base.logp, base.masks):
            kl += float(((lp0.exp() * (lp0 - lp)).sum(-1) * m).sum())
            top += float(((lp0.argmax(-1) == lp.argmax(-1)) & m).sum())
            total += float(m.sum())
        r["kl"], r["top1"] = kl / total, top / total
    return r


def _progress(progress, msg):
    if progress is True:
        print(f"study: {msg}", file=sys.stderr, flush=True)
    elif callable(progress):
        progress(msg)


class _Partial:
    """Finished units appended as JSON lines to PATH (None: kept in memory only); a rerun with the same settings
    (their key in the first line) continues where it stopped."""

    def __init__(self, path, settings):
        self.path, self.done = path, {}
        key = json.dumps(settings, sort_keys=True, default=str)
        if path and os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
            if lines and lines[0] == key:
                for line in lines[1:]:
                    try:
                        unit = json.loads(line)
                    except json.JSONDecodeError:
                        break   # a line torn by an interrupt: computed again
                    self.done[unit["unit"]] = unit["rows"]
        if path:
            with open(path, "w") as f:
                f.write(key + "\n")
                for unit, rows in self.done.items():
                    f.write(json.dumps({"unit": unit, "rows": rows}) + "\n")

    def add(self, unit, rows):
        self.done[unit] = rows
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps({"unit": unit, "rows": rows}) + "\n")


def _filled(spec):
    """A spec with {layer} and {head} in it (e.g. a held codebook a head: vq:codebook=dir/L{layer}H{head}.npy) as
    swap's callable (layer, head) -> spec; any other spec as it is."""
    if isinstance(spec, str) and ("{layer}" in spec or "{head}" in spec):
        return lambda l, h: spec.replace("{layer}", str(l)).replace("{head}", str(h))
    return spec


def _label(spec):
    """A row's spec: the canonical form of a plain spec; a {layer}/{head} template as given."""
    return spec if callable(_filled(spec)) else attnlab.canonical(spec)


def _head_data(model, batches, step, seed, total):
    """Exact attention's Q, K, V and ∂L/∂O of every call (the gradient of the pooled loss — total: the scored
    units over every batch — through the model, one backward per batch): [{layer, causal, q, k, v, do}] per
    batch."""
    per_batch = []
    for b in batches:
        with at.capture(model, "exact", seed=seed, grads=True) as cap:
            loss, mask, _ = _parts(step(model, b))
            ((loss * mask).sum() / total).backward()
        model.zero_grad(set_to_none=True)
        per_batch.append(cap.records)
    return per_batch


class Dropin:
    """The drop-in study of one model on one set of batches: the baseline (every attention by attnlab's exact) run
    once, then any number of units — unit(spec, scope, layer, head) — or arbitrary swaps — measure(swap_spec) —
    measured against it. dropin() is this with progress and resumption; tools/dropin.py uses it unit by unit.

    Head measures (measures=True) are taken with each head fed the exact model's Q, K, V: on "head" rows those of
    MEASURES; on "layer" rows head_err, grad_lin and grad_bound of the layer's heads together; on "all" rows
    head_err, the root-mean-square over layers of each layer's. head_extra(layer, heads, deltas) -> {column: value}
    adds measures of your own to "head" and "layer" rows: deltas holds, per batch, Õ − O of those heads
    (numpy, (B, len(heads), n, d_head)) — e.g. the error through the layer's out-projection.

    reuse_layers=True: a unit skips the layers before its swapped one (the elements of the model's outermost
    nn.ModuleLists), taking their outputs from the baseline's run where their inputs, parameters and buffers are
    the baseline's, bit for bit: the same rows, sooner (tools/dropin.py: a fifth of its time). Only for layers that
    are functions of those alone — no state kept between calls, no random draws, no forward hooks (a hook or a
    layer in training mode is refused; state the layer keeps elsewhere cannot be seen)."""

    def __init__(self, model, batches, step, *, measures=True, seed=0, compare=None, head_extra=None,
                 reuse_layers=False):
        self.model, self.batches, self.step = model, list(batches), step
        if not self.batches:
            raise ValueError("study.dropin: no batches")
        self.measures, self.seed, self.compare, self.head_extra = measures, seed, compare, head_extra
        t0 = time.time()
        self.own = _Outcome()
        with torch.no_grad():
            for b in self.batches:
                self.own.add(step(model, b))
        # The baseline's exact outputs, kept (up to 512 MiB): a unit's calls with the baseline's inputs — every layer
        # before the swapped one, the unswapped heads of its layer — reuse them (torch._ExactMemo: the same bits);
        # with reuse_layers, so do whole layers before the swapped one (put_block says when).
        self._memo = at._ExactMemo(budget=512 << 20, blocks=reuse_layers)
        self.base = _run(model, self.batches, step, "exact", seed, self._memo)
        self._memo.recording = False
        self.calls = self.base.calls
        self.H = {c["layer"]: c["heads"] for c in self.calls}
        self.max_abs_own = max(float((a - b)[m].abs().max()) if bool(m.any()) else 0.0
                               for a, b, m in zip(self.base.tokens, self.own.tokens, self.own.masks))
        self.baseline = dict(scope="exact", spec="exact", layer="", head="", status="ok",
                             own_loss=self.own.mean()[0],
                             max_abs_own=self.max_abs_own, **self._against(self.base),
                             time_s=round(time.time() - t0, 3))
        if measures:
            self.baseline["head_err"] = 0.0
        self._records, self._exact, self._spec_layer, self._p_layer = None, {}, {}, {}

    def _against(self, out):
        return {**_compare(out, self.base), **(self.compare(out.extras, self.base.extras) if self.compare else {})}

    def units(self, spec, scope):
        """The units of one spec and scope: [(layer, head)] ("" where not one)."""
        if scope == "all":
            return [("", "")]
        if scope == "layer":
            return [(l, "") for l in self.H]
        if scope == "head":
            return [(l, h) for l in self.H for h in range(self.H[l])]
        raise ValueError(f"study.dropin: scope {scope!r}; valid: all, layer, head")

    def swap_spec(self, spec, scope, layer="", head=""):
        """The swap spec of one unit: spec in every head (all), one layer's heads or one head, the rest exact."""
        filled = _filled(spec)
        if scope == "all":
            return filled
        exact = {c["layer"]: "exact" for c in self.calls}
        if scope == "layer":
            return {**exact, layer: filled}
        one = filled(layer, head) if callable(filled) else filled
        return {**exact, layer: ["exact"] * head + [one] + ["exact"] * (self.H[layer] - head - 1)}

    def measure(self, swap_spec):
        """The model-level measures of any swap (swap's spec forms) against the baseline: loss, loss_se, dloss,
        dloss_se (paired), kl, top1, finite, status and compare()'s columns. A swap that fails numerically is a row,
        not an exception — its failure is the finding (a method in a reduced precision, `spec@fp16-eager`,
        overflowing): status "failed: ..." with finite False and the losses NaN when an attention's non-finite
        output reached the next layer's (which refuses its inputs), or "failed: non-finite loss" when it reached
        the loss; "ok" otherwise. Any other error is raised."""
        try:
            r = self._against(_run(self.model, self.batches, self.step, swap_spec, self.seed, self._memo))
        except ValueError as e:
            if "NaN or infinite" not in str(e):
                raise
            nan = math.nan
            return dict(loss=nan, loss_se=nan, dloss=nan, dloss_se=nan, kl=nan, top1=nan, finite=False,
                        status="failed: an attention's non-finite output reached the next layer "
                               f"({str(e).splitlines()[0][:120]})")
        r["status"] = "ok" if r["finite"] else "failed: non-finite loss"
        return r

    def unit(self, spec, scope, layer="", head=""):
        """One row: the model-level measures of the unit's swap, and its head measures."""
        t = time.time()
        r = dict(scope=scope, spec=_label(spec), layer=layer, head=head,
                 **self.measure(self.swap_spec(spec, scope, layer, head)))
        if self.measures:
            r.update(self._head_measures(spec, scope, layer, head))
        r["time_s"] = round(time.time() - t, 3)
        return r

    # ---- head measures: each head fed the exact model's Q, K, V ------------------------------------------------
    def records(self):
        if self._records is None:
            total = float(torch.cat(self.base.counts).sum())
            self._records = _head_data(self.model, self.batches, self.step, self.seed, total)
        return self._records

    def _layer(self, layer):
        """This layer's records over every forward step() made (a batch may run the model more than once)."""
        return [r for recs in self.records() for r in recs if r["layer"] == layer]

    def _outputs(self, spec, layer, heads):
        """[(record, exact O, Õ)] of `heads` at `layer`, numpy (B, len(heads), n, d_head). The exact O is cached;
        Õ of a plain spec is computed for every head of the layer at once and kept for the layer's next unit (the
        one-head units of a layer run in a row): each (batch entry, head) is its own attention, so a head's slice
        has the same bits as the head computed alone."""
        filled = _filled(spec)
        key = (_label(spec), layer)
        if not callable(filled) and self._spec_layer.get("key") != key:
            self._spec_layer = {"key": key, "o": {}, "p": {}}
        out = []
        for i, r in enumerate(self._layer(layer)):
            if (layer, i) not in self._exact:
                q, k, v = (r[w] for w in "qkv")
                self._exact[(layer, i)] = _apply_heads("exact", q, k, v, r["causal"], None)
            o = self._exact[(layer, i)][:, heads]
            if callable(filled):
                q, k, v = (r[w][:, heads] for w in "qkv")
                o_t = np.concatenate([_apply_heads(filled(layer, h), q[:, j:j + 1], k[:, j:j + 1], v[:, j:j + 1],
                                                   r["causal"], self.seed + layer) for j, h in enumerate(heads)], 1)
            else:
                if i not in self._spec_layer["o"]:
                    self._spec_layer["o"][i] = _apply_heads(filled, r["q"], r["k"], r["v"], r["causal"],
                                                            self.seed + layer)
                o_t = self._spec_layer["o"][i][:, heads]
            out.append((r, o, o_t))
        return out

    def _rows_tv(self, spec, layer, head):
        """(Σ over the batches' rows of ½‖p − p̃‖₁, rows) of one head: P of exact attention kept for the layer, P̃
        of a plain spec formed for every head of the layer at once (each head's slice copied to contiguous memory:
        the sum in the order a head formed alone gives)."""
        filled = _filled(spec)
        one = filled(layer, head) if callable(filled) else filled
        if self._p_layer.get("layer") != layer:
            self._p_layer = {"layer": layer}
        tv_sum = tv_rows = 0.0
        for i, r in enumerate(self._layer(layer)):
            q, k = r["q"][:, head], r["k"][:, head]
            ones = np.zeros(q.shape[:-1] + (1,))
            # Every head's P at once only where the layer's matrices are small (≤ 256 MiB each): else head by head.
            whole = r["q"].size // r["q"].shape[-1] * r["k"].shape[-2] * 8 <= 256 << 20
            if not whole:
                _, p = attnlab.apply("exact", q, k, ones, causal=r["causal"], matrix=True)
            else:
                if i not in self._p_layer:
                    self._p_layer[i] = _matrix_heads("exact", r["q"], r["k"], r["causal"], None)
                p = np.ascontiguousarray(self._p_layer[i][:, head])
            if callable(filled) or not whole:
                _, p_t = attnlab.apply(attnlab._native_spec(one), q, k, ones, causal=r["causal"],
                                       seed=self.seed + layer, matrix=True)
            else:
                if i not in self._spec_layer["p"]:
                    self._spec_layer["p"][i] = _matrix_heads(one, r["q"], r["k"], r["causal"], self.seed + layer)
                p_t = np.ascontiguousarray(self._spec_layer["p"][i][:, head])
            tv_sum += float(0.5 * np.abs(p_t - p).sum())
            tv_rows += p.shape[0] * p.shape[1]
        return tv_sum, tv_rows

    def _head_measures(self, spec, scope, layer, head):
        if scope == "all":
            errs = []
            for l in self.H:
                outs = self._outputs(spec, l, list(range(self.H[l])))
                num = sum(float(((o_t - o) ** 2).sum()) for _, o, o_t in outs)
                den = sum(float((o ** 2).sum()) for _, o, _ in outs)
                errs.append(num / den if den else math.nan)
            return dict(head_err=math.sqrt(sum(errs) / len(errs)))
        heads = list(range(self.H[layer])) if scope == "layer" else [head]
        outs = self._outputs(spec, layer, heads)
        num = den = lin = gg = 0.0
        for r, o, o_t in outs:
            d = o_t - o
            g = r["do"][:, heads]
            num += float((d ** 2).sum())
            den += float((o ** 2).sum())
            lin += float((g * d).sum())
            gg += float((g ** 2).sum())
        m = dict(head_err=math.sqrt(num / den) if den else math.nan, grad_lin=lin, grad_bound=math.sqrt(gg * num))
        if scope == "head":
            tv_sum, tv_rows = self._rows_tv(spec, layer, head)
            m["p_tv"] = tv_sum / tv_rows
        if self.head_extra:
            m.update(self.head_extra(layer, heads, [o_t - o for _, o, o_t in outs]))
        return m


def _apply_heads(spec, q, k, v, causal, seed):
    """attnlab.apply over (B, H, n, d) arrays: every (batch entry, head) one attention, the same draw for all."""
    B, H, n, d = q.shape
    o = attnlab.apply(spec, _flat(q), _flat(k), _flat(v), causal=causal, seed=seed)
    return o.reshape(B, H, n, v.shape[-1])


def _flat(x):
    """(B, H, n, d) as (B·H, n, d), contiguous: every (batch entry, head) one attention of attnlab.apply."""
    return np.ascontiguousarray(x.reshape(-1, x.shape[2], x.shape[3]))


def _matrix_heads(spec, q, k, causal, seed):
    """P̃ of every (batch entry, head) of (B, H, n, d) arrays: (B, H, n, n_k), the same draw for all (a '@bf16' /
    '@fp16' spec's native P̃: attnlab._native_spec)."""
    B, H, n, d = q.shape
    _, p = attnlab.apply(attnlab._native_spec(spec), _flat(q), _flat(k), np.zeros((B * H, n, 1)), causal=causal,
                         seed=seed, matrix=True)
    return p.reshape(B, H, n, k.shape[2])


def dropin(model, batches, step, specs, *, scopes=("all", "layer", "head"), measures=True, seed=0, progress=True,
           partial=None, compare=None, head_extra=None):
    """Each spec swapped into `model` (scope "all": every head of every layer; "layer": one layer's heads, the others
    exact; "head": one head, the others exact) and what the model loses on `batches` (a list: each passed to
    step(model, batch)). Returns rows (dicts): scope, spec (canonical), layer, head ("" where not one), loss,
    loss_se, dloss (increase over the all-exact baseline), dloss_se (paired), kl (KL(p_exact ‖ p)) and top1 where
    step gives logits, finite, the head measures (see Dropin; measures=True), time_s. The first row is the baseline
    (scope "exact") with own_loss, the model's own forward's loss, and max_abs_own, the largest per-token distance
    from it (rounding: attnlab's exact attention is not the model's kernel). Random methods draw with seed + layer;
    a spec with {layer} and {head} in it is filled per head. partial: a path where finished units are kept (JSON
    lines) so that an interrupted run resumes. compare: a callable(extras, baseline_extras) -> {column: value}
    adding measures of your own to every row, from the "extra" entries step() returned (one per batch; e.g.
    embeddings, for their cosine to the exact model's); head_extra: see Dropin."""
    for s in specs:
        _label(s)   # a bad spec fails here, before any work
    for s in scopes:
        if s not in ("all", "layer", "head"):
            raise ValueError(f"study.dropin: scopes {[s for s in scopes if s not in ('all', 'layer', 'head')]}; "
                             "valid: all, layer, head")
    t0 = time.time()
    d = Dropin(model, batches, step, measures=measures, seed=seed, compare=compare, head_extra=head_extra)
    # What a unit's rows depend on besides its own key (spec, scope, layer, head): a run with more or fewer specs
    # or scopes keeps the units it shares with an interrupted one.
    settings = {"seed": seed, "measures": measures,
                "calls": [(c["layer"], c["name"], c["heads"], c["n"]) for c in d.calls], "batches": len(d.batches),
                "own_loss": d.own.mean()[0]}
    part = _Partial(partial, settings)
    rows = [d.baseline]
    units = [(spec, scope, l, h) for spec in specs for scope in scopes for l, h in d.units(spec, scope)]
    _progress(progress, f"{len(units)} units on {len(d.batches)} batches, {len(d.calls)} attention layers; attnlab's "
                        f"exact vs the model's own forward: max |Δ loss| = {d.max_abs_own:.1e}")
    for i, (spec, scope, l, h) in enumerate(units):
        key = f"{_label(spec)}|{scope}|{l}|{h}"
        if key in part.done:
            rows += part.done[key]
            continue
        r = d.unit(spec, scope, l, h)
        part.add(key, [r])
        rows.append(r)
        el = time.time() - t0
        _progress(progress, f"{i + 1}/{len(units)} {scope} {_label(spec)} {l}{'' if h == '' else f'.{h}'}: "
                            f"Δloss {r['dloss']:+.4f} ± {r['dloss_se']:.4f} ({el:.0f} s, "
                            f"~{el / (i + 1) * (len(units) - i - 1):.0f} s left)")
    return rows


def predictors(rows, measures=tuple(MEASURES), interval=True, seed=0):
    """Which head measure predicts the loss increase of the one-head swaps in `rows` (dropin()'s): per measure,
    Spearman's ρ over every one-head swap (all specs together) with a 95% cluster-bootstrap interval over heads (a
    head's rows under several specs are not independent). Returns [{measure, pairs, heads, rho, lo, hi}]."""
    heads = [r for r in rows if r.get("scope") == "head"]
    if not heads:
        raise ValueError("study.predictors: no one-head swaps in the rows (run dropin with scope 'head')")
    g = np.array([int(r["layer"]) * 10000 + int(r["head"]) for r in heads])
    y = np.array([r["dloss"] for r in heads], dtype=float)
    out = []
    for m in measures:
        x = np.array([r.get(m, math.nan) for r in heads], dtype=float)
        n, rho, lo, hi = stats.spearman(x, y, g, seed=seed, interval=interval)
        out.append(dict(measure=m, pairs=n, heads=len(np.unique(g)), rho=rho, lo=lo, hi=hi))
    return out


def _schedule(steps):
    """Linear warm-up over 10% of the steps, then cosine decay to 0 (the factor of step s, 0-based)."""
    warmup = max(1, steps // 10)
    return lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, (s + 1) / steps))))


class Run:
    """One fine-tuning arm: a copy of the model trained with `spec` swapped in (attnlab's backward); spec None: the
    model's own attention (torch's autograd)."""

    def __init__(self, model, spec, seed):
        self.model, self.spec, self.seed = copy.deepcopy(model), _filled(spec), seed

    def evaluate(self, batches, step):
        return _run(self.model, batches, step, self.spec, self.seed)


CONTROLS = {"exact": "exact", "own": None}   # a control arm's name: its swap spec (None: the model's own attention)


def finetune(model, specs, train_batches, eval_batches, step, *, steps=None, lr=1e-4, evals=4, weight_decay=0.01,
             clip=1.0, seed=0, controls=("exact",), accumulate=1, objective=None, progress=True):
    """Fine-tunes a copy of `model` for each spec in `specs` (a spec or a list; a spec with {layer} and {head} is
    filled per head) swapped into every head (AdamW, betas (0.9, 0.98), warm-up over 10% of the steps then cosine
    decay to 0, gradients clipped at `clip`; the model's weights train, the method's random draws are held) on
    train_batches, `accumulate` consecutive batches a step (their gradients summed, each loss divided by
    `accumulate`; steps defaults to their number over accumulate, cycling), evaluating the held-out loss on
    eval_batches at step 0 and `evals` evenly spaced steps; and each control in `controls` trained alike, once:
    "exact" (attnlab's exact attention: training moves the loss too, so recovery is measured against it at the same
    step) and "own" (the model's own attention through torch's autograd: the time per step a user has today).
    The training loss is objective(model, batch) (a scalar tensor) where given, else the mean of step()'s losses
    over the batch's scored units. Returns rows {arm ("method" or the control's name), spec, step, loss, loss_se,
    sums (the held-out loss's per-cluster sums: paired comparisons between any two rows), gap (method − exact
    control at that step), gap_se (paired), gap_closed (the share of the step-0 gap closed, where that gap is
    beyond two SEs), train_loss, time_per_step_s, status}. A non-finite loss or gradient, or a method refusing its
    input, stops an arm (status says at which step)."""
    train_batches = list(train_batches)
    if accumulate < 1 or len(train_batches) < accumulate:
        raise ValueError(f"study.finetune: accumulate={accumulate} with {len(train_batches)} training batches")
    steps = steps or len(train_batches) // accumulate
    wanted = sorted({0} | {round(steps * i / evals) for i in range(1, evals + 1)})
    specs = [specs] if isinstance(specs, str) else list(specs)
    bad = [c for c in controls if c not in CONTROLS]
    if bad:
        raise ValueError(f"study.finetune: controls {bad}; valid: {', '.join(CONTROLS)}")
    arms = [("method", _label(s)) for s in specs] + [(c, "exact" if c == "exact" else "own") for c in controls]
    results = {}
    for (arm, label), s in zip(arms, specs + [CONTROLS[c] for c in controls]):
        results[(arm, label)] = _train(model, s, train_batches, eval_batches, step, steps, wanted, lr, weight_decay,
                                       clip, seed, accumulate, objective)
        evals_at, _, status = results[(arm, label)]
        if evals_at:
            _progress(progress, f"finetune {arm} {label}: held-out {evals_at[0][0].mean()[0]:.4f} -> "
                                f"{evals_at[max(evals_at)][0].mean()[0]:.4f} after {max(evals_at)} steps; {status}")
        else:
            _progress(progress, f"finetune {arm} {label}: {status}")
    rows = []
    ctrl = results.get(("exact", "exact"), ({}, [], ""))[0]
    for arm, s in arms:
        evals_at, times, status = results[(arm, s)]
        start_gap = None
        for i in wanted:
            if i not in evals_at:
                rows.append(dict(arm=arm, spec=s, step=i, status=status))
                continue
            out, train = evals_at[i]
            loss, loss_se = out.mean()
            r = dict(arm=arm, spec=s, step=i, loss=loss, loss_se=loss_se, sums=torch.cat(out.sums).tolist(),
                     train_loss=train, status=status,
                     time_per_step_s=statistics.median(times) if times else math.nan)
            if i in ctrl and arm == "method":
                c = ctrl[i][0]
                gap = _compare(out, c)
                r["control_loss"], r["gap"], r["gap_se"] = c.mean()[0], gap["dloss"], gap["dloss_se"]
                if i == 0:
                    start_gap = (r["gap"], r["gap_se"])
                elif start_gap and start_gap[0] > 2 * start_gap[1] and 0 in evals_at:
                    d0 = evals_at[0][0].mean()[0]
                    r["gap_closed"] = (d0 - loss) / (d0 - c.mean()[0])
            rows.append(r)
    return rows


def _train(model, spec, train_batches, eval_batches, step, steps, wanted, lr, weight_decay, clip, seed, accumulate,
           objective):
    """One arm: ({step: (held-out outcome, mean training loss since the last evaluation)}, step times, status)."""
    run = Run(model, spec, seed)
    params = [p for p in run.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(steps))
    evals_at, times, recent, status = {}, [], [], "ok"

    def mean_loss(m, b):
        loss, mask, _ = _parts(step(m, b))
        return (loss * mask).sum() / mask.sum()

    objective = objective or mean_loss
    try:
        evals_at[0] = (run.evaluate(eval_batches, step), math.nan)
        run.model.train()
        for i in range(1, steps + 1):
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            value = 0.0
            with at.swap(run.model, run.spec, seed=seed):
                for j in range(accumulate):
                    part = objective(run.model, train_batches[((i - 1) * accumulate + j) % len(train_batches)])
                    part = part / accumulate
                    value += part.item()
                    if not math.isfinite(value):   # before the backward, which refuses a non-finite gradient
                        break
                    part.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(params, clip)) if math.isfinite(value) else math.nan
            if not (math.isfinite(value) and math.isfinite(norm)):   # AdamW would spread the NaN to every weight
                status = f"diverged at step {i} (training loss {value:.3g}, gradient norm {norm:.3g})"
                break
            opt.step()
            sched.step()
            times.append(time.perf_counter() - t)
            recent.append(value)
            if i in wanted:
                run.model.eval()
                out = run.evaluate(eval_batches, step)
                run.model.train()
                if not out.finite:
                    status = f"diverged at step {i} (non-finite held-out loss)"
                    break
                evals_at[i] = (out, statistics.fmean(recent))
                recent = []
    except (ValueError, RuntimeError) as e:   # a method refusing its input mid-run: recorded, the other arms go on
        what = "diverged" if "NaN or infinite" in str(e) else "error"   # attnlab's refusal of non-finite input
        status = f"{what} at step {len(times) + (1 if evals_at else 0)}: {str(e).splitlines()[0][:200]}"
    run.model.eval()
    return evals_at, times, status


def choose(model, report, batches, step, loss_target, *, check_batches=None, seed=0, noise=0.1, z=1.64,
           progress=None):
    """The cheapest per-head choice from `report` (attnlab report --model-dir of capture(model)'s export) that keeps
    the model's loss on `batches` within loss_target of exact (attnlab.torch.check_report's greedy rule), then that
    choice checked on check_batches (other data: the choice is fitted to `batches`). Returns check_report's result,
    with "check" {increase, se} on check_batches where given."""
    def loss_on(bs):
        def loss():
            out = _Outcome()
            for b in bs:
                out.add(step(model, b))
            return torch.cat(out.sums) / torch.cat(out.counts)
        return loss
    result = at.check_report(model, report, loss_on(list(batches)), loss_target=loss_target, seed=seed, noise=noise,
                             z=z, progress=progress)
    if check_batches is not None:
        with torch.no_grad(), at.swap(model, None, seed=seed) as s:
            exact = loss_on(list(check_batches))()
        with torch.no_grad(), at.swap(model, at.mix_spec(result["loss target"]["mix"], s.calls), seed=seed):
            got = loss_on(list(check_batches))()
        d = (got - exact).double().numpy()
        result["check"] = {"increase": float(d.mean()),
                           "se": float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else 0.0}
    return result
