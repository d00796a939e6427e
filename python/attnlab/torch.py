"""attnlab.torch: attnlab's attention on PyTorch tensors, and in PyTorch's own attention modules.

    import attnlab.torch as at
    out = at.attention(q, k, v, "nystrom:landmarks=32")          # (..., n, d) CPU tensors -> a tensor
    with at.swap(model, "performer:features=64"):                  # every nn.MultiheadAttention of the model
        loss = evaluate(model)
    with at.swap(model, {0: "local:window=64", 2: ["linear", None, None, "exact"]}):   # per layer, per head
        ...
    with at.capture(model) as cap:                                 # the per-head Q, K, V after the in-projection
        model(x)
    cap.save("my_export")            # then: attnlab report --model-dir my_export --out my_report

Differentiable: attention() is a torch.autograd.Function whose backward is the method's own (attnlab's
Method.backward: exact attention's in O(n) memory, FlashAttention-2's Algorithm 2; each approximation's with its random
and discrete choices held at the forward's values — attnlab.methods() and the README say which), so a model can train
through any method on the CPU, swapped in or called directly. Second derivatives are not available (refused by torch).

What a swap does to PyTorch's modules, and why. Debian's torch 1.13 takes fused "fast paths" that never call
MultiheadAttention.forward: nn.TransformerEncoderLayer in eval mode under no_grad (torch._transformer_encoder_layer_fwd)
and nn.TransformerEncoder with a padding mask (nested tensors); a forward hook would silently see nothing there. So
while a swap or a capture is active, each nn.MultiheadAttention's forward is replaced by attnlab's (the same
in-projection, heads, out-projection and masks as torch's, with the attention computed per head by the chosen
method), each nn.TransformerEncoderLayer runs torch's own unfused path (the same arithmetic), and each
nn.TransformerEncoder's nested-tensor conversion is off. Leaving the block restores every module.

Masks: attnlab's methods know one mask, the causal one. An attn_mask equal to the causal mask (boolean True above
the diagonal, or -inf above and 0 on and below it) is passed on as causal=True; a key_padding_mask that masks
nothing is ignored; any other mask is refused with a ValueError (the methods cannot honour it). Attention dropout
in training mode is refused too (the methods apply none): call model.eval() or build the module with dropout=0.
"""
import hashlib
import json
import os
import re

import numpy as np
import torch
import torch.nn.functional as F

import attnlab

__all__ = ["attention", "attention_layers", "swap", "capture", "Capture", "check_report"]

_DTYPES = (torch.float32, torch.float64)


# ---- attention on tensors ----------------------------------------------------------------------------------------

def _tensor(x, name):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__} (for numpy arrays use "
                         "attnlab.apply)")
    if x.device.type != "cpu":
        raise ValueError(f"{name}: a tensor on {x.device}; attnlab computes on the CPU: pass {name}.cpu()")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name}: dtype {x.dtype} is not supported; give torch.float32 or torch.float64")
    if x.dim() < 2:
        raise ValueError(f"{name} must be (..., n, d), got shape {tuple(x.shape)}")
    return x


def attention(q, k, v, spec="exact", causal=False, scale=None, seed=None):
    """softmax(scale·Q Kᵀ) V approximated by method `spec` (an attnlab spec string, e.g. 'performer:features=64'),
    on CPU tensors q (..., n, d), k (..., n_k, d), v (..., n_k, d_v) with the same leading (batch, head) dims.

    float32 and float64 are kept (one dtype for all three). Contiguous inputs are not copied: their memory is read
    in place through numpy views; a non-contiguous one is copied once. Every (n, d) slice is one head: the method
    is fitted on each separately (random methods draw with the same `seed` on every head). scale defaults to
    1/sqrt(d). Returns a new tensor (..., n, d_v). Errors (bad spec, shapes, a method that cannot be causal) are
    ValueErrors with the library's message.
    """
    q, k, v = _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v")
    if len({q.dtype, k.dtype, v.dtype}) > 1:
        raise ValueError(f"q, k, v: different dtypes ({q.dtype}, {k.dtype}, {v.dtype}); give one")
    lead = tuple(q.shape[:-2])
    if tuple(k.shape[:-2]) != lead or tuple(v.shape[:-2]) != lead:
        raise ValueError(f"q, k, v: leading dimensions differ ({tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}); they must be equal (no broadcasting)")
    n, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]

    def flat(x):   # (..., n, d) -> (heads, n, d): a view of a contiguous tensor, else one copy
        x = x.reshape(-1, x.shape[-2], x.shape[-1]) if lead else x
        return x if x.is_contiguous() else x.contiguous()

    if lead and int(np.prod(lead)) == 0:
        return torch.empty(*lead, n, d_v, dtype=q.dtype)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out = _Attention.apply(flat(q), flat(k), flat(v), spec, causal, scale, seed)
        return out.reshape(*lead, n, d_v)
    out = attnlab.apply(spec, flat(q).detach().numpy(), flat(k).detach().numpy(), flat(v).detach().numpy(),
                        causal=causal, scale=scale, seed=seed)
    return torch.from_numpy(out).reshape(*lead, n, d_v)


def _array(t):
    """A tensor's memory as a numpy array (no copy for a contiguous tensor)."""
    t = t.detach()
    return (t if t.is_contiguous() else t.contiguous()).numpy()


class _Attention(torch.autograd.Function):
    """attnlab's attention in the autograd graph: the forward fits the method on every head (kept for the
    backward: its random parameters and discrete choices are those the gradient holds fixed) and returns P̃·V; the
    backward is Method.backward: dQ, dK, dV for the upstream gradient."""

    @staticmethod
    def forward(ctx, q, k, v, spec, causal, scale, seed):
        method = attnlab.Method._once(spec, causal, scale, seed)
        vn = _array(v)
        out = method(_array(q), _array(k), vn)   # fits (kept) and returns the output
        ctx.method, ctx.v = method, vn
        return torch.from_numpy(out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        dq, dk, dv = ctx.method.backward(ctx.v, _array(d_out))
        return torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv), None, None, None, None


# ---- which modules -------------------------------------------------------------------------------------------

def attention_layers(model):
    """[(name, module)] of every nn.MultiheadAttention in `model`, in named_modules() order: the layer index a
    swap's spec refers to."""
    if isinstance(model, torch.nn.MultiheadAttention):
        return [("", model)]
    return [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.MultiheadAttention)]


def _head_specs(spec, layers):
    """The spec (str or None: torch's own attention) of every head of every layer."""
    out = []
    by_name = {name: i for i, (name, _) in enumerate(layers)}
    if isinstance(spec, dict):
        table = {}
        for key, value in spec.items():
            if isinstance(key, str):
                if key not in by_name:
                    raise ValueError(f"swap: no nn.MultiheadAttention named {key!r}; the model's are "
                                     f"{sorted(by_name)}")
                key = by_name[key]
            if not isinstance(key, int) or not 0 <= key < len(layers):
                raise ValueError(f"swap: layer {key!r} is not in 0..{len(layers) - 1} (or a module name)")
            table[key] = value
        per_layer = [table.get(i) for i in range(len(layers))]
    elif isinstance(spec, (list, tuple)):
        if len(spec) != len(layers):
            raise ValueError(f"swap: {len(spec)} layer specs for a model with {len(layers)} attention layers")
        per_layer = list(spec)
    else:
        per_layer = [spec] * len(layers)
    for i, ((name, m), s) in enumerate(zip(layers, per_layer)):
        h = m.num_heads
        if callable(s) and not isinstance(s, str):
            heads = [s(i, j) for j in range(h)]
        elif callable(spec) and not isinstance(spec, str):
            heads = [spec(i, j) for j in range(h)]
        elif isinstance(s, (list, tuple)):
            if len(s) != h:
                raise ValueError(f"swap: layer {i} ({name or 'the module'}) has {h} heads; got {len(s)} specs")
            heads = list(s)
        else:
            heads = [s] * h
        for x in heads:
            if x is not None and not isinstance(x, str):
                raise ValueError(f"swap: a head's spec must be a string or None (torch's own attention), got "
                                 f"{type(x).__name__}")
        out.append(heads)
    return out


# ---- nn.MultiheadAttention through attnlab --------------------------------------------------------------------

def _causal_mask(mask, L, S):
    """True when `mask` is the causal mask (and only that); None when there is no mask."""
    if mask is None:
        return False
    if L != S:
        return None
    upper = torch.ones(L, S, dtype=torch.bool).triu(1)
    m = mask if mask.dim() == 2 else mask.reshape(-1, L, S)
    if m.dtype == torch.bool:
        ok = bool((m == upper).all())
    else:
        ok = bool(torch.isneginf(m[..., upper]).all()) and bool((m[..., ~upper] == 0).all())
    return True if ok else None


def _mha_forward(mod, heads, seed, record, query, key, value, key_padding_mask=None, need_weights=True,
                 attn_mask=None, average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention.forward (torch 1.13's slow path, F.multi_head_attention_forward) with each head's
    attention by attnlab: `heads` holds a spec per head (None: torch's own softmax attention)."""
    if query.is_nested:
        raise ValueError("attnlab.torch: nested-tensor inputs are not supported")
    batched = query.dim() == 3
    if mod.batch_first and batched:
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    if not batched:
        query, key, value = (x.unsqueeze(1) for x in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    L, B, E = query.shape
    S = key.shape[0]
    H, dh = mod.num_heads, mod.head_dim
    if mod.training and mod.dropout > 0:
        raise ValueError(f"attnlab.torch: attention dropout p={mod.dropout} in training mode; attnlab's methods "
                         "apply no dropout to the attention matrix: call model.eval() or build the module with "
                         "dropout=0")
    causal = _causal_mask(attn_mask, L, S)
    if causal is None:
        raise ValueError("attnlab.torch: attn_mask is not the causal mask; attnlab's methods know only the causal "
                         "mask (True or -inf above the diagonal, nothing else masked)")
    causal = causal or bool(is_causal)
    if key_padding_mask is not None:
        masks_something = (key_padding_mask.any() if key_padding_mask.dtype == torch.bool
                           else (key_padding_mask != 0).any())
        if bool(masks_something):
            raise ValueError("attnlab.torch: key_padding_mask masks keys; attnlab's methods cannot honour padding "
                             "masks (pass sequences of one length, or unpadded batches)")
    if mod._qkv_same_embed_dim:
        wq, wk, wv = mod.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = mod.q_proj_weight, mod.k_proj_weight, mod.v_proj_weight
    bq, bk, bv = mod.in_proj_bias.chunk(3) if mod.in_proj_bias is not None else (None, None, None)
    q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    if mod.bias_k is not None or mod.add_zero_attn:
        if causal:
            raise ValueError("attnlab.torch: add_bias_kv / add_zero_attn with a causal mask is not supported")
        if mod.bias_k is not None:
            k = torch.cat([k, mod.bias_k.repeat(1, B, 1)])
            v = torch.cat([v, mod.bias_v.repeat(1, B, 1)])
    # (L, B, E) -> (B, H, L, dh), contiguous: every (b, h) slice is one head for attnlab
    q = q.reshape(L, B, H, dh).permute(1, 2, 0, 3).contiguous()
    k = k.reshape(k.shape[0], B, H, dh).permute(1, 2, 0, 3).contiguous()
    v = v.reshape(v.shape[0], B, H, dh).permute(1, 2, 0, 3).contiguous()
    if mod.add_zero_attn:
        k = torch.cat([k, k.new_zeros(B, H, 1, dh)], 2)
        v = torch.cat([v, v.new_zeros(B, H, 1, dh)], 2)
    if record is not None:
        record(q, k, v, causal)
    out = q.new_empty(B, H, L, dh)
    weights = q.new_empty(B, H, L, k.shape[2]) if need_weights else None
    groups = {}
    for h, s in enumerate(heads):
        groups.setdefault(s, []).append(h)
    for s, hs in groups.items():
        idx = torch.tensor(hs)
        qs, ks, vs = (x if len(hs) == H else x.index_select(1, idx) for x in (q, k, v))
        if s is None:   # torch's own attention, as F.multi_head_attention_forward computes it
            logits = (qs / dh ** 0.5) @ ks.transpose(-1, -2)
            if causal:
                logits = logits.masked_fill(torch.ones(L, k.shape[2], dtype=torch.bool).triu(1), float("-inf"))
            p = logits.softmax(-1)
            o = p @ vs
        else:
            o = attention(qs, ks, vs, s, causal=causal, seed=seed)
            p = _matrix(qs, ks, s, causal, seed) if need_weights else None
        out[:, hs] = o
        if need_weights:
            weights[:, hs] = p
    o = out.permute(2, 0, 1, 3).reshape(L, B, E)
    o = F.linear(o, mod.out_proj.weight, mod.out_proj.bias)
    if mod.batch_first and batched:
        o = o.transpose(0, 1)
    if not batched:
        o = o.squeeze(1)
    if need_weights:
        if average_attn_weights:
            weights = weights.mean(1)
        if not batched:
            weights = weights.squeeze(0)
    return o, weights


def _matrix(q, k, spec, causal, seed):
    """P̃ of every head (b, h, L, S), for need_weights=True (memory-guarded by the library)."""
    lead = q.shape[:-2]
    qf, kf = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:])
    ones = torch.zeros(kf.shape[0], kf.shape[1], 1, dtype=q.dtype)
    _, p = attnlab.apply(spec, qf.detach().numpy(), kf.detach().numpy(), ones.numpy(), causal=causal, seed=seed,
                         matrix=True)
    return torch.from_numpy(p).reshape(*lead, q.shape[-2], k.shape[-2])


def _encoder_layer_forward(layer, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
    """nn.TransformerEncoderLayer.forward without torch 1.13's fused fast path: the same arithmetic, through
    self_attn.forward (so the swap's attention runs)."""
    x = src
    if layer.norm_first:
        x = x + layer._sa_block(layer.norm1(x), src_mask, src_key_padding_mask)
        x = x + layer._ff_block(layer.norm2(x))
    else:
        x = layer.norm1(x + layer._sa_block(x, src_mask, src_key_padding_mask))
        x = layer.norm2(x + layer._ff_block(x))
    return x


class swap:
    """Runs `model`'s nn.MultiheadAttention layers with attnlab's attention while the block is active:

        with attnlab.torch.swap(model, spec, seed=0):
            ...

    spec: a spec string (every head of every layer); None (torch's own attention everywhere: with capture(),
    what the model computes, recorded); a dict {layer index or module name: spec}, unnamed layers keeping torch's
    attention; a list with one entry per layer; a callable (layer, head) -> spec or None. Each layer's entry may be
    a list with one spec (or None) per head. Layers are numbered as attention_layers(model) lists them. A layer
    whose heads are all None keeps torch's own forward (its masks and dropout work as ever); a layer with any
    attnlab head runs attnlab's forward (the mask rules of the module docstring). Random methods draw with
    `seed` + the layer's index unless the spec names its own seed (a report's canonical specs do: seed=0). Also
    usable without `with`: s = swap(...); ...; s.restore(). While any swap is active, nn.TransformerEncoderLayer
    runs torch's unfused path (the same arithmetic as its fused one, up to rounding).
    """

    def __init__(self, model, spec, *, seed=0, record=None):
        self.layers = attention_layers(model)
        if not self.layers:
            raise ValueError("swap: the model has no torch.nn.MultiheadAttention (for a hand-written attention, "
                             "call attnlab.torch.attention inside its forward)")
        self.specs = _head_specs(spec, self.layers)
        for heads in self.specs:   # a bad spec fails here, before the model runs
            for s in set(heads) - {None}:
                attnlab.canonical(s)
        self._saved = []
        self._active = True
        for i, ((name, m), heads) in enumerate(zip(self.layers, self.specs)):
            if not record and all(h is None for h in heads):
                continue   # torch's own attention, untouched: its masks and dropout stay available
            rec = (lambda q, k, v, c, i=i, name=name: record(i, name, q, k, v, c)) if record else None
            self._patch(m, "forward", lambda *a, m=m, heads=heads, i=i, rec=rec, **kw:
                        _mha_forward(m, heads, seed + i, rec, *a, **kw))
        for m in model.modules() if isinstance(model, torch.nn.Module) else []:
            if isinstance(m, torch.nn.TransformerEncoderLayer):
                self._patch(m, "forward", lambda *a, m=m, **kw: _encoder_layer_forward(m, *a, **kw))
            elif isinstance(m, torch.nn.TransformerEncoder) and getattr(m, "enable_nested_tensor", False):
                self._patch(m, "enable_nested_tensor", False)

    def _patch(self, obj, attr, value):
        had = attr in obj.__dict__
        self._saved.append((obj, attr, had, obj.__dict__.get(attr)))
        setattr(obj, attr, value)

    def restore(self):
        """Puts every module back as it was (idempotent)."""
        for obj, attr, had, old in reversed(self._saved):
            if had:
                setattr(obj, attr, old)
            else:
                try:
                    delattr(obj, attr)
                except AttributeError:
                    pass
        self._saved = []
        self._active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False


class Capture(swap):
    """The per-head Q, K, V (after the in-projection, before the 1/sqrt(d_head) scale) of every attention call while
    active; `records` holds dicts {layer, name, q, k, v, causal} with numpy arrays (batch, heads, n, d_head).
    save(dir) writes them as the export `attnlab report --model-dir DIR` reads."""

    def __init__(self, model, spec=None, *, seed=0):
        self.records = []
        super().__init__(model, spec, seed=seed, record=self._record)

    def _record(self, layer, name, q, k, v, causal):
        self.records.append({"layer": layer, "name": name, "causal": causal,
                             "q": q.detach().numpy().copy(), "k": k.detach().numpy().copy(),
                             "v": v.detach().numpy().copy()})

    def save(self, directory, dtype=np.float32):
        """Writes DIR/meta.json and DIR/captured/seq{s}_layer{l}_{q,k,v}.npy, (heads, n, d_head) each: sequence s
        is the s-th batch entry of the forward calls in order, layer l the l-th attention layer. Returns DIR."""
        if not self.records:
            raise ValueError("capture: nothing recorded; run the model inside the `with` block first")
        by_layer = {}
        for r in self.records:
            by_layer.setdefault(r["layer"], []).append(r)
        layers = sorted(by_layer)
        if layers != list(range(len(layers))):
            raise ValueError(f"capture: layers {layers} were recorded; every attention layer must run")
        counts = {len(v) for v in by_layer.values()}
        if len(counts) != 1:
            raise ValueError("capture: the layers ran a different number of times; save one forward pass per call")
        sub = os.path.join(directory, "captured")
        os.makedirs(sub, exist_ok=True)
        digest = hashlib.sha256()
        causal = set()
        for l in layers:
            s = 0
            for r in by_layer[l]:
                causal.add(r["causal"])
                for b in range(r["q"].shape[0]):
                    for what in "qkv":
                        a = np.ascontiguousarray(r[what][b], dtype=dtype)
                        path = os.path.join(sub, f"seq{s}_layer{l}_{what}.npy")
                        np.save(path + ".partial.npy", a)
                        os.replace(path + ".partial.npy", path)
                        digest.update(a.tobytes())
                    s += 1
        meta = {"key": digest.hexdigest()[:16], "bidirectional": causal == {False}, "source": "attnlab.torch.capture",
                "layers": [self.layers[l][0] for l in layers],
                "layout": "captured/seq{s}_layer{l}_{q,k,v}.npy (heads, n, d_head), before the 1/sqrt(d_head) scale"}
        with open(os.path.join(directory, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        return directory


def capture(model, spec=None, *, seed=0):
    """A Capture of `model`'s attention layers (see Capture); with a spec, the model runs swapped meanwhile."""
    return Capture(model, spec, seed=seed)


# ---- the report's choices on the user's model -----------------------------------------------------------------

def _losses(value):
    """A loss() result as a float64 numpy vector: per-example losses, or one value."""
    if isinstance(value, torch.Tensor):
        value = value.detach().double().reshape(-1).numpy()
    a = np.asarray(value, dtype=np.float64).reshape(-1)
    if a.size == 0 or not np.isfinite(a).all():
        raise ValueError(f"check_report: loss() returned {a.size} values, not all finite")
    return a


def check_report(model, report, loss, *, loss_target=None, seed=0, noise=0.1, z=1.64, progress=None):
    """The report's choices applied to `model` together, and (loss_target in the loss's units, e.g. nats) the
    cheapest per-head choice that keeps the model within it (attnlab.mix.choose_under_loss_target: greedy on
    measured losses, with a margin of z standard errors).

    report: a report directory or report.csv of this model's heads (attnlab report --model-dir on capture(model)'s
    export: its layer L{l} is the l-th attention layer). loss(): the model's loss on your data, run as it stands —
    the model's attention is swapped around each call; return per-example losses (a 1-D tensor or array: the
    increase then gets a paired standard error) or one number. Evaluate on data other than the report's heads',
    and check a loss-target choice on still other data: the choice is fitted to what loss() sees.

    Returns {"exact": losses, "per-head target": {...}, "loss target": {...}}, each choice a dict with mix
    {(layer, head): spec}, increase, se (0 for a scalar loss), heads, attention_speedup (at the report's cost
    length) and, for the loss target, steps (every trial)."""
    from . import mix as mixes
    rep = report if isinstance(report, dict) else mixes.read_report(report)
    layers = attention_layers(model)
    bad = [k for k in rep if not (0 <= k[0] < len(layers) and 0 <= k[1] < layers[k[0]][1].num_heads)]
    if bad:
        raise ValueError(f"check_report: the report has heads {bad[:3]} that the model's {len(layers)} attention "
                         "layers do not; is it a report of this model?")
    with torch.no_grad(), swap(model, None, seed=seed):   # the unfused path the trials run on: no rounding offset
        exact = _losses(loss())

    def increase(mix):
        spec = {l: [mix.get((l, h)) for h in range(m.num_heads)] for l, (_, m) in enumerate(layers)
                if any(k[0] == l for k in mix)}
        with torch.no_grad(), swap(model, spec, seed=seed):
            got = _losses(loss())
        if got.shape != exact.shape:
            raise ValueError(f"check_report: loss() returned {got.size} values, then {exact.size}")
        d = got - exact
        se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else 0.0
        return float(d.mean()), se

    def entry(mix, steps=None):
        d, se = increase(mix)
        out = {"mix": mix, "increase": d, "se": se, "heads": len(mix),
               "attention_speedup": mixes.attention_speedup(rep, mix)}
        if steps is not None:
            out["steps"] = steps
        return out

    result = {"exact": exact, "per-head target": entry(mixes.recommended(rep))}
    if loss_target is not None:
        chosen, steps = mixes.choose_under_loss_target(rep, increase, loss_target, noise, z, progress)
        result["loss target"] = entry(chosen, steps)
    return result
