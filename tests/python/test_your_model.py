"""attnlab.torch on the models users have: nn.TransformerEncoder, a hand-written model calling PyTorch 2's standard
torch.nn.functional.scaled_dot_product_attention (nanoGPT-style, causal, and a bidirectional one), and the project's
ByteTransformer (tools/trained_attention.py, which calls the standard call too).

For each: exact attention through attnlab reproduces the model's own loss (float64, ≤ 1e-10); a one-head swap equals
an independent recomputation of that head; a causal model's swapped forward leaks nothing from the future for every
causal-capable method; the calls are numbered and named; masks and dropout the methods cannot honour are refused;
capture(grads=True) gives ∂L/∂O equal to autograd's. Small sizes: seconds.
"""
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnlab  # noqa: E402
import attnlab.torch as at  # noqa: E402
from attnlab import sdpa  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LOSS_EXACT = 1e-10


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ---- the models ----------------------------------------------------------------------------------------------

class HandWritten(nn.Module):
    """A nanoGPT-style model (pre-LN blocks, fused QKV, the standard call), causal or bidirectional."""

    def __init__(self, vocab=40, d=32, heads=4, layers=2, causal=True, scale=None):
        super().__init__()
        self.causal, self.h, self.scale = causal, heads, scale
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(64, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({"ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d),
                                                   "proj": nn.Linear(d, d), "ln2": nn.LayerNorm(d),
                                                   "mlp": nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(),
                                                                        nn.Linear(2 * d, d))})
                                    for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        b, n = idx.shape
        x = self.emb(idx) + self.pos(torch.arange(n))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
            o = sdpa.attention(q, k, v, is_causal=self.causal, scale=self.scale)   # the one standard line
            x = x + blk["proj"](o.transpose(1, 2).reshape(b, n, -1))
            x = x + blk["mlp"](blk["ln2"](x))
        return self.head(x)


def by_hand(model, idx, swapped=None):
    """The hand-written model recomputed with its attention written out (softmax(QKᵀ/√d)V, no attnlab and no
    standard call), and `swapped(layer, q, k, v)` -> o for the heads it replaces: an independent recomputation."""
    b, n = idx.shape
    x = model.emb(idx) + model.pos(torch.arange(n))
    for l, blk in enumerate(model.blocks):
        q, k, v = blk["qkv"](blk["ln1"](x)).view(b, n, 3, model.h, -1).permute(2, 0, 3, 1, 4)
        scale = model.scale if model.scale is not None else q.shape[-1] ** -0.5
        s = (q @ k.transpose(-1, -2)) * scale
        if model.causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        o = s.softmax(-1) @ v
        if swapped is not None:
            o = swapped(l, q, k, v, o)
        x = x + blk["proj"](o.transpose(1, 2).reshape(b, n, -1))
        x = x + blk["mlp"](blk["ln2"](x))
    return model.head(x)


def token_losses(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")


def data(b=2, n=24, vocab=40, seed=1):
    idx = torch.randint(0, vocab, (b, n + 1), generator=gen(seed))
    return idx[:, :-1], idx[:, 1:]


def hand_written(causal=True, scale=None):
    torch.manual_seed(0)
    return HandWritten(causal=causal, scale=scale).double().eval()


def encoder():
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Embedding(40, 32), nn.TransformerEncoder(layer, 2), nn.Linear(32, 40)).double().eval()


def byte_model(objective):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import trained_attention as ta
    ck = ta.safe_load(ta.committed(objective, "weights"))
    import argparse
    net = ta.ByteTransformer(argparse.Namespace(**ck["config"]))
    net.load_state_dict(ck["state_dict"])
    return net.double().eval(), ta


# ---- exact through attnlab is the model -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["encoder", "hand-causal", "hand-bidirectional", "hand-scale"])
def test_exact_through_attnlab_reproduces_the_loss(kind):
    model = {"encoder": encoder, "hand-causal": lambda: hand_written(True),
             "hand-bidirectional": lambda: hand_written(False),
             "hand-scale": lambda: hand_written(True, scale=0.2)}[kind]()
    x, y = data()
    with torch.no_grad():
        own = token_losses(model(x), y)
        if kind.startswith("hand"):   # the standard call is the model: the written-out attention gives its loss
            assert (token_losses(by_hand(model, x), y) - own).abs().max() <= 1e-12
        with at.swap(model, "exact") as s:
            through = token_losses(model(x), y)
    assert float(through.mean() - own.mean()) == pytest.approx(0, abs=LOSS_EXACT)
    assert (through - own).abs().max() <= LOSS_EXACT
    assert [c["layer"] for c in s.calls] == [0, 1] and [c["heads"] for c in s.calls] == [4, 4]
    if kind.startswith("hand"):
        assert [c["name"] for c in s.calls] == ["", ""]   # the model's own forward made the calls
        assert all(c["via"] == "scaled_dot_product_attention" for c in s.calls)
        assert all(c["causal"] is (kind != "hand-bidirectional") for c in s.calls)
    else:
        assert [c["name"] for c in s.calls] == ["1.layers.0.self_attn", "1.layers.1.self_attn"]
    assert "scaled_dot_product_attention" not in F.__dict__ or F.scaled_dot_product_attention is not at._sdpa


@pytest.mark.parametrize("objective", ["mlm", "causal"])
def test_byte_transformer_exact_through_attnlab(objective):
    net, ta = byte_model(objective)
    tokens = torch.from_numpy(np.frombuffer(b"def f(x):\n    return x + 1  # a comment about it\n" * 3,
                                            dtype=np.uint8).astype(np.int64))[None, :96]
    with torch.no_grad():
        own = torch.log_softmax(net(tokens), -1)
        with at.swap(net, "exact") as s:
            through = torch.log_softmax(net(tokens), -1)
    assert (through - own).abs().max() <= LOSS_EXACT
    assert [c["name"] for c in s.calls] == [f"blocks.{l}" for l in range(4)]
    assert all(c["causal"] is (objective == "causal") for c in s.calls)


# ---- one head swapped, recomputed independently -------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_one_head_swap_equals_an_independent_recomputation(causal):
    model = hand_written(causal)
    x, _ = data()
    spec = "local:window=3"

    def replace(l, q, k, v, o):
        if l != 1:
            return o
        o = o.clone()
        o[:, 2] = torch.from_numpy(attnlab.apply(spec, q[:, 2].numpy(), k[:, 2].numpy(), v[:, 2].numpy(),
                                                 causal=causal))
        return o

    with torch.no_grad():
        ref = by_hand(model, x, replace)
        with at.swap(model, {1: [None, None, spec, None]}):
            got = model(x)
        with at.swap(model, lambda layer, head: spec if (layer, head) == (1, 2) else None):
            by_callable = model(x)
        plain = model(x)
    assert (got - ref).abs().max() <= 1e-12
    assert (by_callable - ref).abs().max() <= 1e-12
    assert (got - plain).abs().max() > 1e-3   # the swap really changed the model


def test_one_head_swap_in_the_byte_transformer_by_module_name():
    net, ta = byte_model("mlm")
    tokens = torch.arange(64)[None, :] % 200
    spec = "local:window=8"
    with torch.no_grad():
        with at.swap(net, {"blocks.2": [None, spec, None, None]}):
            got = net(tokens)
        # independently: run the blocks, replacing head 1 of block 2 by attnlab.apply on its Q, K, V
        x = net.tok(tokens)
        for l, blk in enumerate(net.blocks):
            q, k, v = blk.heads(x)
            o = blk.matrix(q, k) @ v
            if l == 2:
                o[:, 1] = torch.from_numpy(attnlab.apply(spec, q[:, 1].numpy(), k[:, 1].numpy(), v[:, 1].numpy()))
            x = blk.finish(x, o)
        ref = net.head(net.ln(x))
    assert (got - ref).abs().max() <= 1e-10


# ---- a causal model leaks nothing -----------------------------------------------------------------------------

def causal_specs():
    out = []
    for m in attnlab.methods():
        if m["causal"] and m["name"] != "exact":
            out.append(m["name"])
    return out


@pytest.mark.parametrize("name", causal_specs())
def test_a_causal_models_swapped_forward_leaks_nothing(name, tmp_path):
    model = hand_written(True)
    spec = name
    if name == "vq":   # the fair causal form: a codebook per head fitted on other windows, held (codebook=FILE)
        spec = held_vq_codebooks(model, tmp_path)
    x, _ = data(b=1, n=40)
    i = 25
    later = x.clone()
    later[:, i + 1:] = (later[:, i + 1:] + 7) % 40
    with torch.no_grad(), at.swap(model, spec):
        a = model(x)
        b = model(later)
    assert (a[:, :i + 1] - b[:, :i + 1]).abs().max() <= 1e-12, name
    assert (a[:, i + 1:] - b[:, i + 1:]).abs().max() > 1e-6   # the later inputs did change the later outputs


def held_vq_codebooks(model, where, codes=8):
    """vq's spec per (layer, head) with a codebook fitted by attnlab.vq_codebook on the keys of other (training)
    windows: what a trained Transformer-VQ holds."""
    train, _ = data(b=4, n=40, seed=11)
    with torch.no_grad(), at.capture(model) as cap:
        model(train)
    for r in cap.records:
        for h in range(r["k"].shape[1]):
            np.save(where / f"L{r['layer']}H{h}.npy", attnlab.vq_codebook(r["k"][:, h], codes=codes, seed=0))
    return lambda layer, head: f"vq:codes={codes},codebook={where}/L{layer}H{head}.npy"


def test_vq_fitted_on_the_window_looks_ahead():
    """The look-ahead form (codebook=window: k-means on every key of the call) is kept for bidirectional attention and
    says so; in a causal model the later keys move the earlier outputs — never a causal verdict."""
    assert "all keys" in attnlab.Method("vq").lookahead
    model = hand_written(True)
    x, _ = data(b=1, n=40)
    later = x.clone()
    later[:, 26:] = (later[:, 26:] + 7) % 40
    with torch.no_grad(), at.swap(model, "vq:codes=8"):
        a, b = model(x), model(later)
    assert (a[:, :26] - b[:, :26]).abs().max() > 1e-6


# ---- what the methods cannot honour ------------------------------------------------------------------------------

class Masked(nn.Module):
    def __init__(self, mask=None, dropout_p=0.0, is_causal=False):
        super().__init__()
        self.mask, self.p, self.causal = mask, dropout_p, is_causal
        self.lin = nn.Linear(8, 24)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.lin(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return sdpa.attention(q, k, v, attn_mask=self.mask, dropout_p=self.p, is_causal=self.causal)


def test_masks_the_methods_honour_and_those_they_refuse():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    n = 6
    causal_bool = torch.ones(n, n, dtype=torch.bool).tril()
    causal_float = torch.zeros(n, n, dtype=torch.float64).masked_fill(~causal_bool, float("-inf"))
    with torch.no_grad():
        ref_causal = Masked(is_causal=True).double()
        ref = ref_causal(x)
        for mask in (causal_bool, causal_float, causal_bool[None, None]):
            m = Masked(mask).double()
            m.load_state_dict(ref_causal.state_dict())
            assert (m(x) - ref).abs().max() <= 1e-12
            with at.swap(m, "exact") as s:
                assert (m(x) - ref).abs().max() <= 1e-12
            assert s.calls[0]["causal"] is True
        padding = torch.ones(2, 1, 1, n, dtype=torch.bool)
        padding[1, ..., -2:] = False
        for bad, message in ((Masked(padding), "padding mask"), (Masked(dropout_p=0.1), "dropout_p=0.1"),
                             (Masked(causal_bool.T.contiguous()), "neither all-visible nor the causal mask")):
            bad.double()
            with at.swap(bad, "exact"):
                with pytest.raises(ValueError, match=message):
                    bad(x)
        everything = Masked(torch.ones(n, n, dtype=torch.bool)).double()   # all-visible: no mask
        with at.swap(everything, "exact") as s:
            everything(x)
        assert s.calls[0]["causal"] is False
        # torch's own heads (spec None) keep the model's masks and dropout: nothing refused
        with at.swap(Masked(padding).double(), None):
            pass


def test_a_forward_with_no_attention_call_is_an_error():
    lin = nn.Linear(4, 4)
    with at.swap(lin, "exact"):
        with pytest.raises(ValueError, match="no attention call"):
            lin(torch.zeros(1, 4))


def test_layer_indices_and_lists_checked_after_the_first_forward():
    model = hand_written(True)
    x, _ = data()
    for spec, message in (({2: "exact"}, "not in 0..1"), (["exact"], "1 layer specs"),
                          ({"blocks": "exact"}, "made no attention call"), ({1: ["exact"] * 3}, "has 4 heads")):
        with at.swap(model, spec), torch.no_grad():
            with pytest.raises(ValueError, match=message):
                model(x)
    with pytest.raises(ValueError, match="no module of that name"):
        at.swap(model, {"nowhere": "exact"})
    assert "scaled_dot_product_attention" not in F.__dict__ or F.scaled_dot_product_attention is not at._sdpa


def test_nested_calls_outside_the_swapped_model_run_torchs_own():
    model = hand_written(True)
    other = hand_written(False)
    x, _ = data()
    with torch.no_grad():
        ref = other(x)
        with at.swap(model, "local:window=2"):
            assert (other(x) - ref).abs().max() == 0   # another model's calls are not swapped


# ---- capture: Q, K, V and the upstream gradient ------------------------------------------------------------------

def test_capture_with_upstream_gradients():
    model = hand_written(True, scale=0.3)
    x, y = data(b=2, n=12)
    with at.capture(model, grads=True) as cap:
        loss = token_losses(model(x), y).mean()
        loss.backward()
    assert [r["layer"] for r in cap.records] == [0, 1]
    # Q is recorded with the custom scale folded in: attnlab's default scale on the record gives the model's output
    r = cap.records[0]
    q, k, v = (torch.from_numpy(r[w]) for w in "qkv")
    assert q.shape == (2, 4, 12, 8) and r["causal"] is True
    # ∂L/∂O by autograd, independently: the outputs of the written-out model kept in the graph
    outs = []

    def keep(l, q, k, v, o):
        o.retain_grad()
        outs.append(o)
        return o
    model.zero_grad()
    token_losses(by_hand(model, x, keep), y).mean().backward()
    for r, o in zip(cap.records, outs):
        assert np.abs(r["do"] - o.grad.numpy()).max() <= 1e-12
    with torch.no_grad():
        o0 = at.attention(q, k, v, "exact", causal=True)
    blk = model.blocks[0]
    with torch.no_grad():
        xs = model.emb(x) + model.pos(torch.arange(12))
        qq, kk, vv = blk["qkv"](blk["ln1"](xs)).view(2, 12, 3, 4, -1).permute(2, 0, 3, 1, 4)
        want = sdpa.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=0.3)
    assert (o0 - want).abs().max() <= 1e-12


# ---- the reference call itself ------------------------------------------------------------------------------

def test_reference_sdpa_matches_a_written_out_softmax():
    g = gen(5)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    kk = torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64)
    vv = torch.randn(2, 3, 9, 5, generator=g, dtype=torch.float64)
    s = (q @ kk.transpose(-1, -2)) / 2
    np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, kk, vv).numpy(), (s.softmax(-1) @ vv).numpy(),
                               rtol=0, atol=1e-14)
    m = torch.rand(7, 9, generator=g) < 0.7
    m[:, 0] = True
    ref = s.masked_fill(~m, float("-inf")).softmax(-1) @ vv
    np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, kk, vv, attn_mask=m).numpy(), ref.numpy(),
                               rtol=0, atol=1e-14)
    s = (q @ k.transpose(-1, -2)) * 0.7
    ref = s.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ v
    np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7).numpy(),
                               ref.numpy(), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="exclusive"):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True)
    assert math.isfinite(float(sdpa.attention(q, k, v).sum()))
