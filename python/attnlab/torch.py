"""attnlab.torch: attnlab's attention on PyTorch tensors, and in PyTorch's own attention modules.

    import attnlab.torch as at
    out = at.attention(q, k, v, "nystrom:landmarks=32")          # (..., n, d) CPU tensors -> a tensor
    with at.swap(model, "performer:features=64"):                  # every attention call of the model
        loss = evaluate(model)
    with at.swap(model, {0: "local:window=64", 2: ["linear", None, None, "exact"]}):   # per layer, per head
        ...
    with at.capture(model) as cap:                                 # the per-head Q, K, V of every call
        model(x)
    cap.save("my_export")            # then: attnlab report --model-dir my_export --out my_report

Differentiable: attention() is a torch.autograd.Function whose backward is the method's own (attnlab's
Method.backward: exact attention's in O(n) memory, FlashAttention-2's Algorithm 2; each approximation's with its random
and discrete choices held at the forward's values — attnlab.methods() and the README say which), so a model can train
through any method on the CPU, swapped in or called directly. Second derivatives are not available (refused by torch).

Which attention a swap sees: every nn.MultiheadAttention, and every call to PyTorch 2's standard
torch.nn.functional.scaled_dot_product_attention (installed on torch 1.13 while a swap is active: attnlab.sdpa has
an exact one with its signature), in the order a forward makes them (swap's docstring). A model with a softmax(QKᵀ)V
of its own changes that line to the standard call: `o = attnlab.sdpa.attention(q, k, v, is_causal=causal)` (or
F.scaled_dot_product_attention on PyTorch 2).

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
The standard call's masks follow the same rule: no attn_mask, an all-visible one, is_causal=True or a causal attn_mask
(True on and below the diagonal, or 0 there and -inf above) pass; any other is refused, and so is dropout_p > 0.
"""
import hashlib
import json
import math
import os
import re

import numpy as np
import torch
import torch.nn.functional as F

import attnlab
from . import sdpa as _sdpa_ref

__all__ = ["attention", "attention_calls", "attention_layers", "swap", "capture", "Capture", "check_report"]

_DTYPES = (torch.float32, torch.float64)
_HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}   # computed by the emulation of that storage


# ---- attention on tensors ----------------------------------------------------------------------------------------

def _tensor(x, name):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__} (for numpy arrays use "
                         "attnlab.apply)")
    if x.device.type != "cpu":
        raise ValueError(f"{name}: a tensor on {x.device}; attnlab computes on the CPU: pass {name}.cpu()")
    if x.dtype not in _DTYPES and x.dtype not in _HALF:
        raise ValueError(f"{name}: dtype {x.dtype} is not supported; give torch.float32, torch.float64, "
                         "torch.bfloat16 or torch.float16")
    if x.dim() < 2:
        raise ValueError(f"{name} must be (..., n, d), got shape {tuple(x.shape)}")
    return x


def attention(q, k, v, spec="exact", causal=False, scale=None, seed=None):
    """softmax(scale·Q Kᵀ) V approximated by method `spec` (an attnlab spec string, e.g. 'performer:features=64'),
    on CPU tensors q (..., n, d), k (..., n_k, d), v (..., n_k, d_v) with the same leading (batch, head) dims.

    float32 and float64 are kept (one dtype for all three). Contiguous inputs are not copied: their memory is read
    in place through numpy views; a non-contiguous one is copied once. bfloat16 and float16 tensors are computed by
    the library's exact emulation of that storage (spec + '@bf16' / '@fp16', eager unless the spec names
    '@FORMAT-careful'; attnlab.Method's precision=) and returned in their dtype. A spec ending in '@bf16', '@fp16',
    '@bf16-careful', ... runs emulated half storage on float32/float64 tensors too (the result in their dtype).
    Every (n, d) slice is one head: the method is fitted on each separately (random methods draw with the same
    `seed` on every head). scale defaults to 1/sqrt(d). Returns a new tensor (..., n, d_v). Errors (bad spec,
    shapes, a method that cannot be causal) are ValueErrors with the library's message.
    """
    q, k, v = _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v")
    if not isinstance(spec, str):
        raise ValueError(f"spec must be a method spec string such as 'performer:features=64', got {spec!r}")
    if len({q.dtype, k.dtype, v.dtype}) > 1:
        raise ValueError(f"q, k, v: different dtypes ({q.dtype}, {k.dtype}, {v.dtype}); give one")
    if q.dtype in _HALF:
        # Half tensors: their values are exact in float32; the emulation stores every tensor in their format.
        named = attnlab._split_precision(spec, None, "eager")[1]   # an '@' in a path names no precision
        if named is None:
            spec = f"{spec}@{_HALF[q.dtype]}"
        elif named != _HALF[q.dtype]:
            raise ValueError(f"spec {spec!r}: its precision differs from the tensors' {q.dtype}; give one")
        half = q.dtype
        out = attention(q.float(), k.float(), v.float(), spec, causal=causal, scale=scale, seed=seed)
        return out.to(half)
    lead = tuple(q.shape[:-2])
    if tuple(k.shape[:-2]) != lead or tuple(v.shape[:-2]) != lead:
        raise ValueError(f"q, k, v: leading dimensions differ ({tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}); they must be equal (no broadcasting)")
    n, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]

    def flat(x):   # (..., n, d) -> (heads, n, d): a view of a contiguous tensor, else one copy
        # the head count spelled out: reshape(-1, 0, d) of an empty tensor is ambiguous to torch, and an empty
        # (n = 0) input must reach the library's own check (a ValueError naming it), not torch's RuntimeError
        x = x.reshape(int(np.prod(lead)), x.shape[-2], x.shape[-1]) if lead else x
        return x if x.is_contiguous() else x.contiguous()

    if lead and int(np.prod(lead)) == 0:
        return torch.empty(*lead, n, d_v, dtype=q.dtype)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out = _Attention.apply(flat(q), flat(k), flat(v), spec, causal, scale, seed)
        return out.reshape(*lead, n, d_v).to(q.dtype)
    out = attnlab.apply(spec, flat(q).detach().numpy(), flat(k).detach().numpy(), flat(v).detach().numpy(),
                        causal=causal, scale=scale, seed=seed)
    # A spec '...@bf16' / '@fp16' computes in emulated half storage and answers in float32: given back in q's dtype.
    return torch.from_numpy(out).reshape(*lead, n, d_v).to(q.dtype)


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


# ---- which attention calls --------------------------------------------------------------------------------------

def attention_layers(model):
    """[(name, module)] of every nn.MultiheadAttention in `model`, in named_modules() order. A model that computes
    attention through torch.nn.functional.scaled_dot_product_attention has none: its layers are known only once it
    runs (swap(...).calls after a forward, or attention_calls())."""
    if isinstance(model, torch.nn.MultiheadAttention):
        return [("", model)]
    return [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.MultiheadAttention)]


def attention_calls(model, *inputs, **kwargs):
    """[{"layer", "name", "heads", "n", "n_k", "causal", "via"}] of every attention call one forward of
    `model(*inputs, **kwargs)` makes (torch's own attention: nothing is swapped): the layers a swap's spec numbers,
    with their head counts. Runs under torch.no_grad()."""
    with torch.no_grad(), swap(model, None) as s:
        model(*inputs, **kwargs)
        return list(s.calls)


def _head_list(entry, layer, name, H, where):
    """One layer's entry of a swap's spec (a spec, None, a list per head or a callable) as H specs."""
    if callable(entry) and not isinstance(entry, str):
        heads = [entry(layer, h) for h in range(H)]
    elif isinstance(entry, (list, tuple)):
        if len(entry) != H:
            raise ValueError(f"swap: layer {layer} ({name or where}) has {H} heads; got {len(entry)} specs")
        heads = list(entry)
    else:
        heads = [entry] * H
    for x in heads:
        if x is not None and not isinstance(x, str):
            raise ValueError(f"swap: a head's spec must be a string or None (torch's own attention), got "
                             f"{type(x).__name__}")
    return heads


def _spec_strings(spec):
    """Every spec string a swap's spec names outside callables (to be checked before the model runs)."""
    values = spec.values() if isinstance(spec, dict) else spec if isinstance(spec, (list, tuple)) else [spec]
    out = set()
    for v in values:
        for s in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(s, str):
                out.add(s)
            elif s is not None and not callable(s):
                raise ValueError(f"swap: a head's spec must be a string or None (torch's own attention), got "
                                 f"{type(s).__name__}")
    return out


class _Layers:
    """A swap's spec resolved per attention call: layer = the call's place in the forward (0, 1, ...), name = the
    module that made it (the nn.MultiheadAttention, or the module whose forward called the standard call)."""

    def __init__(self, spec, model):
        self.spec = spec
        self.mha = attention_layers(model) if isinstance(model, torch.nn.Module) else []
        self.names = {name for name, _ in model.named_modules()} if isinstance(model, torch.nn.Module) else set()
        if isinstance(spec, dict):
            for key in spec:
                if isinstance(key, str):
                    if key not in self.names or key == "":
                        mha = sorted(n for n, _ in self.mha)
                        raise ValueError(f"swap: no nn.MultiheadAttention named {key!r} and no module of that name "
                                         f"in the model" + (f"; its nn.MultiheadAttention are {mha}" if mha else ""))
                elif not isinstance(key, int) or (key < 0 and not self.mha):
                    raise ValueError(f"swap: layer {key!r} is not a layer index (0, 1, ...) or a module name")
        # A model with nn.MultiheadAttention layers: they are known before it runs, so a layer index or a list of the
        # wrong length fails here (one that calls the standard call only is checked after its first forward; a model
        # mixing both is checked against its nn.MultiheadAttention here: name its other layers by module).
        if self.mha:
            self.check(len(self.mha), {n for n, _ in self.mha}, before=True)
            for i, (name, m) in enumerate(self.mha):
                self.heads(i, name, m.num_heads)

    def check(self, count, names, before=False):
        """Refuses layer indices, names and list lengths that the forward's `count` attention calls do not have."""
        spec = self.spec
        if isinstance(spec, dict):
            for key in spec:
                if isinstance(key, int) and not 0 <= key < count:
                    raise ValueError(f"swap: layer {key} is not in 0..{count - 1} (or a module name)" +
                                     ("" if before else f": the forward made {count} attention calls"))
                if isinstance(key, str) and key not in names:
                    raise ValueError(f"swap: no nn.MultiheadAttention named {key!r}"
                                     if before else f"swap: the module {key!r} made no attention call in the forward "
                                     f"(those that did: {sorted(names)})")
        elif isinstance(spec, (list, tuple)) and len(spec) != count:
            raise ValueError(f"swap: {len(spec)} layer specs for a model with {count} attention layers")

    def heads(self, layer, name, H):
        spec = self.spec
        if isinstance(spec, dict):
            entry = spec.get(layer, spec.get(name) if name else None)
        elif isinstance(spec, (list, tuple)):
            if layer >= len(spec):
                raise ValueError(f"swap: {len(spec)} layer specs, but the forward makes attention call {layer + 1}")
            entry = spec[layer]
        else:
            entry = spec
        return _head_list(entry, layer, name, H, "the module")



# ---- torch.nn.functional.scaled_dot_product_attention through attnlab ------------------------------------------

_TORCH_SDPA = getattr(F, "scaled_dot_product_attention", None)   # PyTorch 2's, where torch has it
_ACTIVE = []   # the swaps in force, innermost last


def _own_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch's own attention for the standard call: PyTorch's where it has one, else attnlab.sdpa's exact one."""
    if _TORCH_SDPA is None:
        return _sdpa_ref.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
    kw = {} if scale is None else {"scale": scale}
    return _TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)


def _sdpa_causal(attn_mask, is_causal, L, S):
    """True/False: the standard call's mask as the methods know it (none, or the causal one); ValueError else."""
    if is_causal:
        if attn_mask is not None:
            raise ValueError("scaled_dot_product_attention: is_causal and attn_mask are exclusive")
        if L != S:
            raise ValueError(f"attnlab.torch: is_causal with {L} queries and {S} keys (PyTorch aligns that mask at "
                             "the top left); attnlab's causal mask is square")
        return True
    if attn_mask is None:
        return False
    allowed = _sdpa_ref.causal_mask(L, S)
    m = attn_mask.expand(*attn_mask.shape[:-2], L, S)
    if m.dtype == torch.bool:
        if bool(m.all()):
            return False
        if L == S and bool((m == allowed).all()):
            return True
    else:
        if bool((m == 0).all()):
            return False
        if L == S and bool((m.masked_select(allowed) == 0).all()) and bool(torch.isneginf(m.masked_select(~allowed))
                                                                             .all()):
            return True
    raise ValueError("attnlab.torch: attn_mask is neither all-visible nor the causal mask; attnlab's methods know "
                     "only the causal mask (pass is_causal=True for it) — a padding mask cannot be honoured: pass "
                     "sequences of one length")


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """What torch.nn.functional.scaled_dot_product_attention is while a swap is active: the call of the swapped
    model's forward goes through the swap; any other call to torch's own."""
    for s in reversed(_ACTIVE):
        if s._depth > 0:
            return s._standard_call(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return _own_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _assemble(heads, axis, compute):
    """Each group of heads with one spec computed by compute(spec, q-rows, index) and put in its place on the head
    axis (every head one spec: no copy)."""
    groups = {}
    for h, s in enumerate(heads):
        groups.setdefault(s, []).append(h)
    if len(groups) == 1:
        return compute(heads[0], None)
    out = None
    for s, hs in groups.items():
        idx = torch.tensor(hs)
        o = compute(s, idx)
        if out is None:
            shape = list(o.shape)
            shape[axis] = len(heads)
            out = o.new_zeros(shape)
        out = out.index_copy(axis, idx, o)
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


def _mha_forward(mod, heads, seed, record, on_output, query, key, value, key_padding_mask=None, need_weights=True,
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
    if on_output is not None:
        on_output(out)
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
    """P̃ of every head (b, h, L, S), for need_weights=True (memory-guarded by the library), in q's dtype. Under a
    half dtype or a spec's '@bf16'/'@fp16' it is the method's float32 P̃ on the same inputs, rounded to the dtype at
    the end: the emulation covers the output, not the matrix."""
    lead = q.shape[:-2]
    qf, kf = (x.reshape(-1, *x.shape[-2:]).detach() for x in (q, k))
    if q.dtype in _HALF:
        qf, kf = qf.float(), kf.float()   # exact in float32
    ones = torch.ones(kf.shape[0], kf.shape[1], 1, dtype=qf.dtype)   # the row sums; only P̃ is kept
    _, p = attnlab.apply(attnlab._native_spec(spec), qf.numpy(), kf.numpy(), ones.numpy(), causal=causal, seed=seed,
                         matrix=True)
    return torch.from_numpy(p).reshape(*lead, q.shape[-2], k.shape[-2]).to(q.dtype)


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


class _ExactMemo:
    """Exact attention's outputs of one run (attnlab.study's baseline), per forward and attention call, with their
    inputs: a later run (through the same batches) whose call has the same inputs, bit for bit, takes its exact heads'
    outputs from here instead of computing them again — the same bits, since attnlab computes every (batch entry,
    head) as its own attention (a head's slice of the call is the head computed alone). A one-head unit of the
    drop-in study then computes attention only where the swap changed something: the swapped head and the layers
    after it. Recording stops at `budget` bytes (inputs and outputs kept): past it, calls are computed as before."""

    def __init__(self, budget=1 << 30, blocks=False):
        self.calls, self.recording, self.budget, self.bytes = {}, True, budget, 0
        # (forward, module name, its call in that forward) -> a block's recorded call (put_block); None: not kept
        self.blocks = {} if blocks else None

    def put(self, where, q, k, v, causal, scale, out):
        size = sum(t.numel() * t.element_size() for t in (q, k, v, out))
        if self.recording and self.bytes + size <= self.budget:   # copies: the model may change its tensors in place
            self.calls[where] = (q.clone(), k.clone(), v.clone(), causal, scale, out.clone())
            self.bytes += size

    def get(self, where, q, k, v, causal, scale):
        """The recorded output where this call's inputs, mask and scale are the recorded ones; else None."""
        c = self.calls.get(where)
        if c is None or self.recording or c[3] != causal or c[4] != scale:
            return None
        same = all(_same_tensor(a, b) for a, b in zip(c[:3], (q, k, v)))
        return c[5].clone() if same else None   # the caller's to change

    # ---- whole blocks: the same reuse one level up (opt-in: blocks=True) ---------------------------------------
    # A block (an element of one of the model's nn.ModuleLists: a transformer layer) whose inputs, parameters and
    # buffers are the baseline's, bit for bit, and whose attention calls are all exact in the unit's swap computes
    # what it computed in the baseline — if it is a function of those alone: no state kept between calls (caches,
    # counters, attributes it writes for others to read), no forward hooks inside it, no random draws. Then its
    # recorded output is returned and its forward skipped (its linear layers, activations and norms: most of a
    # layer's work at n = 512), and a one-head unit computes from the swapped layer on. Checked here: no_grad and not
    # inference mode, every submodule in eval mode, no forward hooks but the swap's own, the inputs not changed in
    # place by the block, the parameters and buffers the same tensors at the same versions, the output a dense
    # tensor (or tuple of them) sharing no memory with the inputs. The rest is the caller's promise.
    def put_block(self, where, module, snapshot, args, kwargs, calls, out):
        """Keeps a block's call of the baseline: snapshot (_block_inputs() before the forward), the call's own
        args and kwargs (after it), its attention calls (swap.calls entries), its output."""
        if self.blocks is None or not self.recording or snapshot is None:
            return
        inputs, versions, state = snapshot
        if versions != _versions((args, kwargs)) or not _same_state(state, _state(module)):   # it changed them
            return
        kept = _clone_output(out, _tensors((args, kwargs)))
        if kept is None:
            return
        size = sum(t.numel() * t.element_size() for t in _tensors(inputs) + _tensors(kept))
        if self.bytes + size <= self.budget:
            self.blocks[where] = (inputs, state, [dict(c) for c in calls], kept)
            self.bytes += size

    def get_block(self, where, module, args, kwargs, usable):
        """(calls, output) of the recorded call at `where` when usable(its recorded attention calls) holds (the
        caller's swap computes them as recorded) and this call's inputs, parameters and buffers are the recorded
        ones; else None. The cheap checks first: the output is copied only when it is returned."""
        b = None if self.blocks is None or self.recording else self.blocks.get(where)
        if b is None or not _reusable(module, args, kwargs) or not usable(b[2]):
            return None
        if not _same_state(b[1], _state(module)) or not _same_inputs(b[0], (args, kwargs)):
            return None
        return b[2], _clone_output(b[3], [])


def _reusable(module, args, kwargs):
    """Whether a block call may be kept or reused: not where an input is of another kind than tensors, None,
    bools, numbers and strings, in grad or inference mode, or where a submodule is in training mode (dropout draws)
    or has forward hooks other than a swap's own."""
    if torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return False
    flat = list(args) + list(kwargs.values())
    if not all(x is None or isinstance(x, (torch.Tensor, bool, int, float, str)) for x in flat):
        return False
    if any(isinstance(x, torch.Tensor) and x.is_inference() for x in flat):
        return False
    return not any(m.training or any(not getattr(h, "_attnlab_swap", False)
                                     for h in list(m._forward_hooks.values()) + list(m._forward_pre_hooks.values()))
                   for m in module.modules())


def _block_inputs(module, args, kwargs):
    """A block call's inputs as kept (tensors cloned; None, bools, numbers and strings as they are), their
    version counters, and the block's state; None where the call cannot be kept (_reusable)."""
    if not _reusable(module, args, kwargs):
        return None
    kept = (tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in args),
            {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
    return kept, _versions((args, kwargs)), _state(module)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return []


def _versions(inputs):
    """The version counters of a call's input tensors (an in-place change increments them)."""
    return tuple(t._version for t in _tensors(inputs))


def _state(module):
    """A block's parameters and buffers: the tensors themselves (kept: their identities stay theirs), their memory,
    type and version counters (an optimizer step, .data = ..., .to() change one of these)."""
    return tuple((t, t._version, t.data_ptr(), t.dtype, t.device, tuple(t.shape))
                 for t in list(module.parameters()) + list(module.buffers()))


def _same_state(a, b):
    return len(a) == len(b) and all(x[0] is y[0] and x[1:] == y[1:] for x, y in zip(a, b))


def _same_tensor(a, b):
    """The same values, bit for bit, in the same shape, type and place."""
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


def _same_inputs(kept, now):
    (ka, kk), (na, nk) = kept, now
    if len(ka) != len(na) or sorted(kk) != sorted(nk):
        return False
    for a, b in list(zip(ka, na)) + [(kk[k], nk[k]) for k in kk]:
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return False
        if isinstance(a, torch.Tensor):
            if not _same_tensor(a, b):
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True


def _storage(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def _clone_output(out, inputs):
    """A copy of a block's output (a tensor, or tuples and lists of tensors and None) with its strides; None for
    other kinds, a view that is not dense (a copy would have other strides), or one sharing memory with an input."""
    if isinstance(out, torch.Tensor):
        c = out.clone()
        if c.stride() != out.stride() or any(_storage(out) == _storage(t) for t in inputs):
            return None
        return c
    if isinstance(out, (tuple, list)):
        items = [None if o is None else _clone_output(o, inputs) for o in out]
        if any(i is None and o is not None for i, o in zip(items, out)):
            return None
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)   # a namedtuple, or not
    return None


def _blocks(model):
    """(name, module) of the elements of the model's outermost nn.ModuleLists: its layers, as models hold them."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and not any(name.startswith(b + ".") for b, _ in found):
            found += [(f"{name}.{c}" if name else c, child) for c, child in m.named_children()]
    return found


class swap:
    """Runs `model`'s attention with attnlab's methods while the block is active:

        with attnlab.torch.swap(model, spec, seed=0):
            ...

    Where: every nn.MultiheadAttention of the model, and every call the model's forward makes to
    torch.nn.functional.scaled_dot_product_attention (PyTorch 2's standard call; on torch 1.13, which lacks it,
    the swap installs it there — attnlab.sdpa's exact one for the heads that keep torch's attention — so a model
    written for PyTorch 2 runs). The call is looked up when made: a model that wrote `F.scaled_dot_product_attention
    (...)` or `attnlab.sdpa.attention(...)` is seen; a name bound earlier by `from torch.nn.functional import
    scaled_dot_product_attention` is not (a forward that makes no attention call the swap sees is an error).

    Layers: the attention calls of one forward of `model`, numbered 0, 1, ... in the order they are made (the
    numbering restarts with every call of `model`), each also named by its module (the nn.MultiheadAttention, or
    the module whose forward made the standard call); heads: the head axis (-3) of the call's Q, K, V.

    spec: a spec string (every head of every layer); None (torch's own attention everywhere: with capture(),
    what the model computes, recorded); a dict {layer index or module name: spec}, other layers keeping torch's
    attention; a list with one entry per layer; a callable (layer, head) -> spec or None. Each layer's entry may be
    a list with one spec (or None) per head, or a callable (layer, head). Spec strings are checked before the model
    runs; layer indices, names and list lengths against the model's nn.MultiheadAttention before it runs when it has
    any, else after its first forward. A layer whose heads are all None computes as the model would (its masks and
    dropout work as ever); a layer with any attnlab head follows the mask rules of the module docstring (and of
    scaled_dot_product_attention: attn_mask all-visible or causal, is_causal, scale; dropout_p > 0 refused).
    Random methods draw with `seed` + the layer's index unless the spec names its own seed (a report's canonical
    specs do: seed=0). Also usable without `with`: s = swap(...); ...; s.restore(). While any swap is active,
    nn.TransformerEncoderLayer runs torch's unfused path (the same arithmetic as its fused one, up to rounding).

    After a forward, .calls lists its attention calls: dicts {layer, name, heads, n, n_k, causal, via}.
    """

    def __init__(self, model, spec, *, seed=0, record=None, on_output=None, memo=None):
        for s in _spec_strings(spec):   # a bad spec fails here, before the model runs
            attnlab.canonical(s)
        self.layers = _Layers(spec, model)
        self.seed, self.calls = seed, []
        self._memo, self._forward, self._block_count = memo, -1, {}
        self._record, self._on_output = record, on_output
        self._saved, self._hooks, self._stack, self._depth = [], [], [], 0
        self._active = True
        module = isinstance(model, torch.nn.Module)
        for name, m in self.layers.mha:
            self._patch(m, "forward", lambda *a, m=m, name=name, **kw: self._mha_call(m, name, *a, **kw))
        for m in model.modules() if module else []:
            if isinstance(m, torch.nn.TransformerEncoderLayer):
                self._patch(m, "forward", lambda *a, m=m, **kw: _encoder_layer_forward(m, *a, **kw))
            elif isinstance(m, torch.nn.TransformerEncoder) and getattr(m, "enable_nested_tensor", False):
                self._patch(m, "enable_nested_tensor", False)
        if module and memo is not None and memo.blocks is not None:   # whole layers reused (_ExactMemo.put_block)
            for name, m in _blocks(model):
                self._patch(m, "forward", self._block(m, name, m.forward))
        if module:   # which module makes a standard call: the innermost one running
            for name, m in model.named_modules():
                enter, leave = (lambda mod, inp, name=name: self._enter(name)), (lambda mod, inp, out: self._leave())
                enter._attnlab_swap = leave._attnlab_swap = True   # not a user's hook (_reusable)
                self._hooks += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
        self._patch(model, "forward", self._root(model.forward))
        self._patch(F, "scaled_dot_product_attention", _sdpa)
        _ACTIVE.append(self)

    def _enter(self, name):   # a forward pre-hook: returns None (the inputs unchanged)
        self._stack.append(name)

    def _leave(self):         # a forward hook: returns None (the output unchanged)
        if self._stack:
            self._stack.pop()

    def _root(self, forward):
        """The model's forward, numbering its attention calls from 0 and checking the spec against them."""
        def run(*a, **kw):
            self._depth += 1
            if self._depth == 1:
                self.calls, self._stack, self._block_count = [], [], {}
                self._forward += 1
            try:
                out = forward(*a, **kw)
            finally:
                self._depth -= 1
            if self._depth == 0:
                if not self.calls:
                    raise ValueError("swap: the model's forward made no attention call through nn.MultiheadAttention "
                                     "or torch.nn.functional.scaled_dot_product_attention; a hand-written "
                                     "softmax(QKᵀ)V must be changed to the standard call (the README's 'Quick "
                                     "start: your own model' shows the one line)")
                self.layers.check(len(self.calls), {c["name"] for c in self.calls})
            return out
        return run

    def _block(self, m, name, forward):
        """A block's forward under the memo: kept in the baseline's run; in a later run its recorded output, with
        its attention calls counted as made, where _ExactMemo.get_block finds the same inputs and state and every
        one of those calls is exact in this swap (else computed as ever)."""
        def run(*a, **kw):
            k = self._block_count[name] = self._block_count.get(name, -1) + 1   # its k-th call in this forward
            memo, where = self._memo, (self._forward, name, k)
            plain = self._record is None and self._on_output is None
            if memo.recording:
                snapshot = _block_inputs(m, a, kw) if plain else None
                start = len(self.calls)
                out = forward(*a, **kw)
                inner = self.calls[start:]
                if snapshot is not None and all(self._exact_call(c) for c in inner):
                    memo.put_block(where, m, snapshot, a, kw, inner, out)
                return out
            if plain:
                got = memo.get_block(where, m, a, kw, lambda calls: all(
                    c["layer"] == len(self.calls) + i and self._exact_call(c) for i, c in enumerate(calls)))
                if got is not None:
                    calls, out = got
                    self.calls += [dict(c) for c in calls]
                    return out
            return forward(*a, **kw)
        return run

    def _exact_call(self, call):
        """Whether every head of a recorded attention call is attnlab's exact attention in this swap."""
        return all(h == "exact" for h in self.layers.heads(call["layer"], call["name"], call["heads"]))

    def _next(self, name, H, L, S, causal, via):
        layer = len(self.calls)
        heads = self.layers.heads(layer, name, H)
        self.calls.append({"layer": layer, "name": name, "heads": H, "n": L, "n_k": S, "causal": causal, "via": via})
        return layer, heads

    def _mha_call(self, m, name, *a, **kw):
        query = kw.get("query", a[0] if a else None)
        H = m.num_heads
        L = query.shape[0 if query.dim() < 3 or not m.batch_first else 1]
        layer, heads = self._next(name, H, L, None, None, "nn.MultiheadAttention")
        if not self._record and all(h is None for h in heads):
            return type(m).forward(m, *a, **kw)   # torch's own: its masks and dropout stay available
        rec = (lambda q, k, v, c: self._record(layer, name, q, k, v, c)) if self._record else None
        out = (lambda o: self._on_output(layer, o)) if self._on_output else None
        return _mha_forward(m, heads, self.seed + layer, rec, out, *a, **kw)

    def _standard_call(self, query, key, value, attn_mask, dropout_p, is_causal, scale):
        if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"attnlab.torch: scaled_dot_product_attention with shapes {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}: want (..., n, d) each")
        L, S = query.shape[-2], key.shape[-2]
        H = query.shape[-3] if query.dim() >= 3 else 1
        name = self._stack[-1] if self._stack else ""
        layer, heads = self._next(name, H, L, S, None, "scaled_dot_product_attention")
        own = all(h is None for h in heads)
        if own and not self._record:
            return _own_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
        causal = _sdpa_causal(attn_mask, is_causal, L, S)
        self.calls[-1]["causal"] = causal
        if tuple(key.shape[:-2]) != tuple(query.shape[:-2]) or tuple(value.shape[:-2]) != tuple(query.shape[:-2]):
            raise ValueError(f"attnlab.torch: scaled_dot_product_attention with leading dimensions "
                             f"{tuple(query.shape[:-2])}, {tuple(key.shape[:-2])}, {tuple(value.shape[:-2])}: "
                             "attnlab needs them equal (no broadcasting, no grouped K, V heads)")
        if self._record:
            d = query.shape[-1]
            # Recorded before the 1/sqrt(d_head) scale attnlab applies by default: a custom scale is folded into Q.
            q = query if scale is None else query * (scale * math.sqrt(d))
            as4 = lambda t: t.reshape(-1, *t.shape[-3:]) if t.dim() >= 3 else t.reshape(1, 1, *t.shape)  # noqa: E731
            self._record(layer, name, as4(q), as4(key), as4(value), causal)
        if own:
            out = _own_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
        else:
            if dropout_p > 0:
                raise ValueError(f"attnlab.torch: scaled_dot_product_attention with dropout_p={dropout_p}; attnlab's "
                                 "methods apply no dropout to the attention matrix: call model.eval() (a model "
                                 "passes dropout_p only in training) or pass 0")
            axis = query.dim() - 3

            memo = self._memo
            # Compared only where a head is exact (a swap of every head, the "all" units, has nothing to reuse).
            known = (memo.get((self._forward, layer), query, key, value, causal, scale)
                     if memo and "exact" in heads else None)

            def compute(s, idx):
                if s == "exact" and known is not None:   # this call's inputs, bit for bit, in the memo's run
                    return known if idx is None else known.index_select(axis, idx)
                qs, ks, vs = (x if idx is None else x.index_select(axis, idx) for x in (query, key, value))
                if s is None:
                    return _own_sdpa(qs, ks, vs, None, 0.0, causal, scale)
                o = attention(qs, ks, vs, s, causal=causal, scale=scale, seed=self.seed + layer)
                if s == "exact" and idx is None and memo:
                    memo.put((self._forward, layer), query, key, value, causal, scale, o)
                return o
            out = compute(heads[0], None) if query.dim() == 2 else _assemble(heads, axis, compute)
        if self._on_output:
            self._on_output(layer, out)
        return out

    def _patch(self, obj, attr, value):
        had = attr in obj.__dict__
        self._saved.append((obj, attr, had, obj.__dict__.get(attr)))
        setattr(obj, attr, value)

    def restore(self):
        """Puts every module (and torch.nn.functional) back as it was (idempotent)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
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
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False


class Capture(swap):
    """The per-head Q, K, V of every attention call while active (Q, K before the 1/sqrt(d_head) scale: a call's
    custom scale is folded into Q), and with grads=True the upstream gradient ∂L/∂O of each call's output once the
    caller runs a backward; `records` holds dicts {layer, name, q, k, v, causal[, do]} with numpy arrays (batch,
    heads, n, d_head; a bfloat16 or float16 model's as float32, which holds their values exactly). save(dir) writes
    them as the export `attnlab report --model-dir DIR` reads."""

    def __init__(self, model, spec=None, *, seed=0, grads=False):
        self.records = []
        super().__init__(model, spec, seed=seed, record=self._keep,
                         on_output=self._watch if grads else None)

    @staticmethod
    def _numpy(t):
        """A detached copy as numpy: bfloat16 and float16 as float32 (exact; numpy has no bfloat16)."""
        t = t.detach()
        return (t.float() if t.dtype in _HALF else t).numpy().copy()

    def _keep(self, layer, name, q, k, v, causal):
        self.records.append({"layer": layer, "name": name, "causal": causal,
                             "q": self._numpy(q), "k": self._numpy(k), "v": self._numpy(v)})

    def _watch(self, layer, out):
        if out.requires_grad:
            r = self.records[-1]
            shape = r["q"].shape[:-1] + (out.shape[-1],)
            out.register_hook(lambda g, r=r: r.__setitem__("do", self._numpy(g.reshape(shape))))

    def save(self, directory, dtype=np.float32):
        """Writes DIR/meta.json and DIR/captured/seq{s}_layer{l}_{q,k,v}.npy, (heads, n, d_head) each: sequence s
        is the s-th batch entry of the forward calls in order, layer l the l-th attention call of a forward (and
        seq{s}_layer{l}_do.npy, ∂L/∂O, where a backward filled it). Returns DIR."""
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
                    for what in ("q", "k", "v", "do") if "do" in r else "qkv":
                        a = np.ascontiguousarray(r[what][b], dtype=dtype)
                        path = os.path.join(sub, f"seq{s}_layer{l}_{what}.npy")
                        np.save(path + ".partial.npy", a)
                        os.replace(path + ".partial.npy", path)
                        digest.update(a.tobytes())
                    s += 1
        meta = {"key": digest.hexdigest()[:16], "bidirectional": causal == {False}, "source": "attnlab.torch.capture",
                "layers": [by_layer[l][0]["name"] for l in layers],
                "layout": "captured/seq{s}_layer{l}_{q,k,v}.npy (heads, n, d_head), before the 1/sqrt(d_head) scale"}
        with open(os.path.join(directory, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        return directory



def capture(model, spec=None, *, seed=0, grads=False):
    """A Capture of `model`'s attention calls (see Capture); with a spec, the model runs swapped meanwhile; with
    grads=True each record gains "do", ∂L/∂O of its output, once a backward has run through it."""
    return Capture(model, spec, seed=seed, grads=grads)


# ---- the report's choices on the user's model -----------------------------------------------------------------

def _losses(value):
    """A loss() result as a float64 numpy vector: per-example losses, or one value."""
    if isinstance(value, torch.Tensor):
        value = value.detach().double().reshape(-1).numpy()
    a = np.asarray(value, dtype=np.float64).reshape(-1)
    if a.size == 0 or not np.isfinite(a).all():
        raise ValueError(f"check_report: loss() returned {a.size} values, not all finite")
    return a


def mix_spec(mix, calls):
    """A per-head mix {(layer, head): spec} as a swap's spec for a model whose attention calls are `calls`
    (swap(...).calls): the layers the mix names, every other head of theirs torch's own (None)."""
    return {l: [mix.get((l, h)) for h in range(c["heads"])] for l, c in enumerate(calls)
            if any(k[0] == l for k in mix)}


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
    with torch.no_grad(), swap(model, None, seed=seed) as s:   # the unfused path the trials run on: no offset
        exact = _losses(loss())
        calls = s.calls
    bad = [k for k in rep if not (0 <= k[0] < len(calls) and 0 <= k[1] < calls[k[0]]["heads"])]
    if bad:
        raise ValueError(f"check_report: the report has heads {bad[:3]} that the model's {len(calls)} attention "
                         "layers do not; is it a report of this model?")

    def increase(mix):
        with torch.no_grad(), swap(model, mix_spec(mix, calls), seed=seed):
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
