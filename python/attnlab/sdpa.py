"""PyTorch 2's standard attention call, exact, for a PyTorch that lacks it (Debian's torch 1.13).

Models written for PyTorch 2 compute attention through torch.nn.functional.scaled_dot_product_attention (nanoGPT,
the model libraries, most research code). This module gives that call with PyTorch 2's signature and semantics, in
plain tensor code, so that such a model runs here, and so that attnlab.torch.swap has one call to intercept:

    from attnlab.sdpa import attention        # F.scaled_dot_product_attention where torch has it, else ours
    o = attention(q, k, v, is_causal=True)    # q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev)

`attention` looks the call up on torch.nn.functional at every call (not at import), so a swap that installs its own
there (attnlab.torch.swap and capture do) sees every call a model makes through it — or through
F.scaled_dot_product_attention directly.

Pure PyTorch: it does not import attnlab's compiled module, so the project's model scripts load it by path before
the module is built.
"""
import math

import torch

__all__ = ["scaled_dot_product_attention", "attention", "causal_mask"]


def causal_mask(L, S, device=None):
    """PyTorch 2's is_causal mask: True where query i may attend key j (j ≤ i, aligned at the top left)."""
    return torch.ones(L, S, dtype=torch.bool, device=device).tril()


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """softmax(scale·Q Kᵀ + mask) V with PyTorch 2's signature and semantics (torch.nn.functional.
    scaled_dot_product_attention, 2.1+): scale defaults to 1/sqrt(E); a boolean attn_mask is True where a query
    may attend (the opposite of nn.MultiheadAttention's), a float one is added to the logits; is_causal masks
    keys after the query (top-left aligned) and excludes attn_mask; dropout_p drops attention weights (always, as
    PyTorch's does: its callers pass 0 in eval mode).

    The arithmetic: Q is multiplied by the scale before the product (n·d work, not n²) — the order the project's
    trained models used, so their committed weights give the same bits through this call."""
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: is_causal and attn_mask are exclusive (PyTorch 2's rule)")
    L, S = query.shape[-2], key.shape[-2]
    if scale is None:
        scale = 1 / math.sqrt(query.shape[-1])
    logits = (query * scale) @ key.transpose(-1, -2)
    if is_causal:
        logits = logits.masked_fill(torch.ones(L, S, dtype=torch.bool, device=query.device).triu(1), float("-inf"))
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask
    p = logits.softmax(-1)
    if dropout_p > 0:
        p = torch.nn.functional.dropout(p, dropout_p)
    return p @ value


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """The standard call as a model written for PyTorch 2 makes it: torch.nn.functional.scaled_dot_product_attention
    where it exists (PyTorch ≥ 2, or installed by an active attnlab swap), else this module's exact one."""
    f = getattr(torch.nn.functional, "scaled_dot_product_attention", None) or scaled_dot_product_attention
    kw = {} if scale is None else {"scale": scale}   # PyTorch 2.0's call has no scale argument
    return f(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)
