"""attnlab.torch against PyTorch: attention() on tensors, swap() in nn.MultiheadAttention / TransformerEncoder,
capture() and the export `attnlab report --model-dir` reads.

Run with PYTHONPATH=build/python (and ATTNLAB_BIN=build/bin/attnlab for the report command) under a Python with
torch; skipped where torch is missing. Small sizes: the whole file runs in seconds.
"""
import csv
import gzip
import json
import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnlab  # noqa: E402
import attnlab.torch as at  # noqa: E402

EXACT = 1e-12          # float64: the same arithmetic up to summation order
DIFFERENT = 1e-3       # an approximation that really ran moves the output by far more than this


def torch_attention(q, k, v, causal=False, scale=None):
    """softmax(scale·QKᵀ [causal mask]) V in PyTorch, independently of attnlab, in the inputs' dtype."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, n_k, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ---- attention() on tensors ------------------------------------------------------------------------------------

CASES = [  # (leading dims, n, n_k, d, d_v, causal, scale)
    ((), 12, 17, 8, 5, False, None),
    ((3,), 12, 17, 8, 5, False, None),
    ((2, 3), 12, 17, 8, 5, False, None),
    ((), 12, 12, 8, 5, True, None),
    ((3,), 12, 12, 8, 5, True, 0.3),
    ((2, 3), 12, 12, 8, 5, True, None),
    ((2, 3), 12, 17, 8, 5, False, 0.3),
]


def make_qkv(lead, n, n_k, d, d_v, dtype=torch.float64, seed=0):
    g = gen(seed)
    q = torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(*lead, n_k, d, generator=g, dtype=torch.float64)
    v = torch.randn(*lead, n_k, d_v, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("lead, n, n_k, d, d_v, causal, scale", CASES)
def test_exact_equals_torch_softmax_attention_float64(lead, n, n_k, d, d_v, causal, scale):
    q, k, v = make_qkv(lead, n, n_k, d, d_v)
    out = at.attention(q, k, v, "exact", causal=causal, scale=scale)
    ref = torch_attention(q, k, v, causal=causal, scale=scale)
    assert out.shape == ref.shape == (*lead, n, d_v)
    err = (out - ref).abs().max().item()
    assert err <= EXACT, err
    if causal:   # the mask really applied: the first query sees only the first key
        np.testing.assert_allclose(out[..., 0, :].numpy(), v[..., 0, :].numpy(), rtol=0, atol=EXACT)


@pytest.mark.parametrize("lead, n, n_k, d, d_v, causal, scale", CASES)
def test_exact_float32_within_a_rounding_bound(lead, n, n_k, d, d_v, causal, scale):
    q, k, v = make_qkv(lead, n, n_k, d, d_v, dtype=torch.float32, seed=1)
    out = at.attention(q, k, v, "exact", causal=causal, scale=scale)
    assert out.dtype == torch.float32
    q64, k64, v64 = q.double(), k.double(), v.double()   # the same values, exactly
    ref = torch_attention(q64, k64, v64, causal=causal, scale=scale)
    err = (out.double() - ref).abs().max().item()
    # The bound: a worst-case first-order rounding analysis of float32 softmax attention, u = eps32/2.
    #  - a logit s_ij = scale·Σ_l q_il k_jl (d products, a sum of d terms, the scale): |δs_ij| ≤ (d+1)·u·A with
    #    A = max scale·Σ_l |q_il k_jl| (not max|s|: the sum may cancel).
    #  - subtracting the row max m and exp: the argument's error ≤ 2(d+1)uA + u·|s - m| ≤ 2(d+1)uA + 2uM
    #    (M = max|s|); exp itself a few ulps (c_exp·u, c_exp ≤ 8 for any vectorised exp worth using).
    #  - the row sum of n_k terms ≤ n_k·u relative, the division u: every p_ij has relative error
    #    ρ ≤ 2(d+1)uA + 2uM + (n_k + c_exp + 1)u.
    #  - o_i = Σ_j p_ij v_j (Σ_j p_ij = 1): |δo_i| ≤ ρ·max|v| + n_k·u·max|v|.
    # So |δo| ≤ u·(2(d+1)A + 2M + 2n_k + 9 + c_exp)·max|v|; we allow twice that (a blocked / online softmax
    # rescales per block, repeating the exp and product roundings): u·(4(d+1)A + 4M + 4n_k + 64)·max|v|.
    u = np.finfo(np.float32).eps / 2
    sc = d ** -0.5 if scale is None else scale
    A = (sc * (q64.abs() @ k64.abs().transpose(-1, -2))).max().item()
    M = (sc * (q64 @ k64.transpose(-1, -2))).abs().max().item()
    vmax = v64.abs().max().item()
    bound = u * (4 * (d + 1) * A + 4 * M + 4 * n_k + 64) * vmax
    assert err <= bound, (err, bound)
    # Not vacuous: the bound is far below the outputs' size (a float16 computation or a wrong scale would fail it) ...
    assert bound < 1e-3 * ref.abs().max().item(), bound
    # ... and the result really was computed in float32: not the float64 result rounded to float32.
    assert err > 0
    assert bool((out != ref.float()).any()), "float32 output equals the float64 result rounded: not a float32 run"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_dtype_and_shape_kept(dtype, lead):
    q, k, v = make_qkv(lead, 10, 14, 6, 3, dtype=dtype)
    for spec in ("exact", "local:window=4", "nystrom:landmarks=4"):
        out = at.attention(q, k, v, spec, seed=0)
        assert isinstance(out, torch.Tensor), spec
        assert out.dtype == dtype, spec
        assert out.shape == (*lead, 10, 3), spec


def test_contiguous_inputs_are_not_copied(monkeypatch):
    b, h, n, d = 2, 3, 11, 4
    q, k, v = make_qkv((b, h), n, n, d, d)
    assert q.is_contiguous()
    # The view attention() hands on: a contiguous (b, h, n, d) tensor flattened to (b·h, n, d) and seen by numpy
    # shares the tensor's memory, and attnlab reads that memory in place.
    flat = q.reshape(-1, n, d).numpy()
    assert flat.__array_interface__["data"][0] == q.data_ptr()
    assert attnlab._data_address(flat) == q.data_ptr()
    q3 = q[1]   # one batch entry, (h, n, d): a contiguous view into q's memory
    assert q3.data_ptr() != q.data_ptr()
    assert attnlab._data_address(q3.numpy()) == q3.data_ptr()
    assert attnlab._data_address(q3) == q3.data_ptr()
    # What attention() itself passes to the library: the tensors' own memory, for every input.
    seen = []
    real_apply = attnlab.apply

    def spy(spec, *arrays, **kw):
        seen.append([attnlab._data_address(a) for a in arrays])
        return real_apply(spec, *arrays, **kw)

    monkeypatch.setattr(attnlab, "apply", spy)
    out = at.attention(q, k, v, "exact")
    assert seen == [[q.data_ptr(), k.data_ptr(), v.data_ptr()]]
    assert (out - torch_attention(q, k, v)).abs().max().item() <= EXACT
    # A non-contiguous input (a transpose) is copied once and still gives the right answer.
    seen.clear()
    kt_storage = torch.randn(b, h, d, n, generator=gen(5), dtype=torch.float64)
    kt = kt_storage.transpose(-1, -2)
    assert not kt.is_contiguous()
    out = at.attention(q, kt, v, "exact")
    assert seen[0][0] == q.data_ptr() and seen[0][1] != kt.data_ptr()
    assert (out - torch_attention(q, kt, v)).abs().max().item() <= EXACT
    qt = torch.randn(d, n, generator=gen(6), dtype=torch.float64).t()   # (n, d), no leading dims
    out = at.attention(qt, k[0, 0], v[0, 0], "exact", causal=True)
    assert (out - torch_attention(qt, k[0, 0], v[0, 0], causal=True)).abs().max().item() <= EXACT


def test_requires_grad_takes_the_autograd_path():
    """A tensor that requires grad goes through the autograd Function (the result is in the graph); under
    torch.no_grad() the plain path reads it in place and returns a tensor outside the graph."""
    q, k, v = make_qkv((2,), 8, 8, 4, 4)
    leaf = q.clone().requires_grad_(True)
    out = at.attention(leaf, k, v, "exact")
    assert out.requires_grad and out.grad_fn is not None
    assert (out.detach() - torch_attention(q, k, v)).abs().max().item() <= EXACT
    with torch.no_grad():
        out = at.attention(leaf, k, v, "exact")
    assert not out.requires_grad
    assert (out - torch_attention(q, k, v)).abs().max().item() <= EXACT


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: at.attention(q, k, v, "nystrom:landmark=3"), "did you mean landmarks"),
        (lambda q, k, v: at.attention(q, k, v, "nystrom", causal=True), "cannot honour a causal mask"),
        (lambda q, k, v: at.attention(q, k[:1], v[:1]), "leading dimensions differ"),
        (lambda q, k, v: at.attention(q, k.reshape(1, 2, 8, 4), v), "leading dimensions differ"),
        (lambda q, k, v: at.attention(q, k.float(), v), "different dtypes"),
        (lambda q, k, v: at.attention(q.numpy(), k, v), "must be a torch.Tensor"),
        (lambda q, k, v: at.attention(q, [[1.0]], v), "must be a torch.Tensor"),
        # empty sequences (batched): the library's check, not torch's ambiguous-reshape RuntimeError
        (lambda q, k, v: at.attention(q[:, :0], k, v), "q: empty array"),
        (lambda q, k, v: at.attention(q, k[:, :0], v[:, :0]), "k: empty array"),
        (lambda q, k, v: at.attention(q.half()[:, :0], k.half(), v.half()), "q: empty array"),
    ],
)
def test_errors_are_value_errors(call, message):
    q, k, v = make_qkv((2,), 8, 8, 4, 4)
    with pytest.raises(ValueError) as e:
        call(q, k, v)
    assert message in str(e.value), str(e.value)


# ---- swap() in PyTorch's modules -------------------------------------------------------------------------------

def encoder(dropout=0.0, seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=dropout, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2).double()


def tokens(b=3, n=10, e=32, seed=1):
    return torch.randn(b, n, e, generator=gen(seed), dtype=torch.float64)


def maxdiff(a, b):
    return (a - b).abs().max().item()


def assert_restored(enc):
    for layer in enc.layers:
        assert "forward" not in layer.self_attn.__dict__
        assert "forward" not in layer.__dict__
    assert enc.enable_nested_tensor is True


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_swap_exact_equals_the_model(mode):
    enc = encoder()
    getattr(enc, mode)()
    x = tokens()
    n = x.shape[1]
    float_mask = nn.Transformer.generate_square_subsequent_mask(n).double()
    bool_mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    with torch.no_grad():
        ref = enc(x)
        ref_causal = enc(x, mask=float_mask)
        assert maxdiff(ref_causal, enc(x, mask=bool_mask)) <= EXACT
        assert maxdiff(ref, ref_causal) > DIFFERENT   # the mask matters
        with at.swap(enc, "exact"):
            out = enc(x)
            out_causal = enc(x, mask=float_mask)
            out_causal_bool = enc(x, mask=bool_mask)
        assert maxdiff(out, ref) <= EXACT
        assert maxdiff(out_causal, ref_causal) <= EXACT
        assert maxdiff(out_causal_bool, ref_causal) <= EXACT
        # The swap really ran (in eval mode under no_grad torch 1.13 takes a fused path that never calls
        # MultiheadAttention.forward): an approximation changes the output.
        with at.swap(enc, "local:window=4"):
            local = enc(x)
            local_causal = enc(x, mask=float_mask)
        assert maxdiff(local, ref) > DIFFERENT
        assert maxdiff(local_causal, ref_causal) > DIFFERENT
        # Restored after the block.
        assert_restored(enc)
        assert maxdiff(enc(x), ref) == 0
        assert maxdiff(enc(x, mask=float_mask), ref_causal) == 0


def test_swap_restores_after_an_exception_and_restore():
    enc = encoder().eval()
    x = tokens()
    with torch.no_grad():
        ref = enc(x)
        with pytest.raises(RuntimeError, match="boom"):
            with at.swap(enc, "local:window=4"):
                raise RuntimeError("boom")
        assert_restored(enc)
        s = at.swap(enc, "local:window=4")
        assert maxdiff(enc(x), ref) > DIFFERENT
        s.restore()
        s.restore()   # idempotent
        assert_restored(enc)
        assert maxdiff(enc(x), ref) == 0


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_multihead_attention_sequence_first_with_weights(mode):
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(16, 4, batch_first=False).double()
    getattr(mha, mode)()
    L, S, B = 9, 13, 2
    x = torch.randn(L, B, 16, generator=gen(4), dtype=torch.float64)
    mem = torch.randn(S, B, 16, generator=gen(5), dtype=torch.float64)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    with torch.no_grad():
        for args, kw in [((x, x, x), {}), ((x, mem, mem), {}), ((x, x, x), {"attn_mask": causal}),
                         ((x, mem, mem), {"average_attn_weights": False})]:
            ref, ref_w = mha(*args, need_weights=True, **kw)
            with at.swap(mha, "exact"):
                out, w = mha(*args, need_weights=True, **kw)
            assert out.shape == ref.shape and w.shape == ref_w.shape, kw
            assert maxdiff(out, ref) <= EXACT, kw
            assert maxdiff(w, ref_w) <= EXACT, kw
        # need_weights=False: no weights, the same output.
        with at.swap(mha, "exact"):
            out, w = mha(x, x, x, need_weights=False)
        assert w is None and maxdiff(out, mha(x, x, x)[0]) <= EXACT
        assert "forward" not in mha.__dict__


def test_per_head_spec_changes_only_that_head():
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(16, 4).double().eval()
    x = torch.randn(12, 2, 16, generator=gen(4), dtype=torch.float64)
    with torch.no_grad():
        _, ref_w = mha(x, x, x, average_attn_weights=False)   # (B, H, L, S)
        with at.swap(mha, {0: [None, None, "local:window=2", None]}):
            _, w = mha(x, x, x, average_attn_weights=False)
    for h in (0, 1, 3):
        assert maxdiff(w[:, h], ref_w[:, h]) <= EXACT, h
    assert maxdiff(w[:, 2], ref_w[:, 2]) > DIFFERENT
    # local:window=2 keeps each query's keys within the window: far keys get weight 0.
    far = (torch.arange(12)[:, None] - torch.arange(12)[None, :]).abs() > 2
    assert bool((w[:, 2][:, far] == 0).all())


def test_per_layer_and_per_head_specs():
    enc = encoder().eval()
    x = tokens()
    with torch.no_grad():
        ref = enc(x)
        with at.swap(enc, {0: ["local:window=4", None, None, None]}):
            one_head = enc(x)
        with at.swap(enc, {1: None}):
            torch_only = enc(x)
        with at.swap(enc, {"layers.1.self_attn": "local:window=4"}):
            by_name = enc(x)
        with at.swap(enc, [None, "local:window=4"]):
            by_list = enc(x)
        with at.swap(enc, lambda layer, head: "local:window=4" if (layer, head) == (1, 0) else None):
            by_callable = enc(x)
        with at.swap(enc, {1: ["local:window=4", None, None, None]}):
            layer1_head0 = enc(x)
    assert maxdiff(one_head, ref) > DIFFERENT
    assert maxdiff(torch_only, ref) <= EXACT
    assert maxdiff(by_name, ref) > DIFFERENT
    assert maxdiff(by_list, by_name) <= EXACT
    assert maxdiff(by_callable, layer1_head0) <= EXACT
    assert maxdiff(by_callable, ref) > DIFFERENT
    assert_restored(enc)


@pytest.mark.parametrize(
    "spec, message",
    [
        (["exact"], "1 layer specs for a model with 2"),
        ({0: ["exact", None, None]}, "has 4 heads; got 3 specs"),
        ({2: "exact"}, "not in 0..1"),
        ({-1: "exact"}, "not in 0..1"),
        ({"layers.7.self_attn": "exact"}, "no nn.MultiheadAttention named"),
        ({1: "nystrom:landmark=3"}, "did you mean landmarks"),
        ({0: [None, None, None, "nystromm"]}, "nystromm"),
        ({0: [None, None, None, 3]}, "must be a string or None"),
    ],
)
def test_swap_refuses_bad_specs_before_running(spec, message):
    enc = encoder()
    with pytest.raises(ValueError) as e:
        at.swap(enc, spec)
    assert message in str(e.value), str(e.value)
    assert_restored(enc)   # nothing was patched


def test_swap_without_attention_layers():
    # A model without nn.MultiheadAttention may call the standard call: known only when it runs; a forward that made
    # no attention call is an error (a hand-written softmax(QKᵀ)V is not seen), and the block restores everything.
    lin = nn.Linear(4, 4)
    with at.swap(lin, "exact"):
        with pytest.raises(ValueError, match="no attention call through nn.MultiheadAttention"):
            lin(torch.zeros(1, 4))
    assert "forward" not in lin.__dict__


def test_dropout_and_masks_it_cannot_honour():
    x = tokens()
    n = x.shape[1]
    enc = encoder(dropout=0.1).train()
    with torch.no_grad():
        with at.swap(enc, "exact"):
            with pytest.raises(ValueError, match="dropout"):
                enc(x)
        enc.eval()   # no dropout in eval mode: fine
        ref = enc(x)
        with at.swap(enc, "exact"):
            assert maxdiff(enc(x), ref) <= EXACT

        enc = encoder().eval()
        ref = enc(x)
        rand = torch.rand(n, n, generator=gen(9)) < 0.3
        rand.fill_diagonal_(False)
        with at.swap(enc, "exact"):
            with pytest.raises(ValueError, match="not the causal mask"):
                enc(x, mask=rand)
            with pytest.raises(ValueError, match="not the causal mask"):   # causal the wrong way round
                enc(x, mask=torch.ones(n, n, dtype=torch.bool).tril(-1))
            padding = torch.zeros(x.shape[0], n, dtype=torch.bool)
            padding[1, -2:] = True
            with pytest.raises(ValueError, match="key_padding_mask"):
                enc(x, src_key_padding_mask=padding)
            fine = enc(x, src_key_padding_mask=torch.zeros(x.shape[0], n, dtype=torch.bool))
        assert maxdiff(fine, ref) <= EXACT
        assert_restored(enc)


# ---- capture() and the export ----------------------------------------------------------------------------------

def heads_of(t, H):
    """(B, n, E) -> (B, H, n, E/H)."""
    B, n, E = t.shape
    return t.reshape(B, n, H, E // H).permute(0, 2, 1, 3)


def run_report(binary, model_dir, out, *extra):
    return subprocess.run([binary, "report", "--model-dir", str(model_dir), "--out", str(out), "--families", "local",
                           "--repeats", "1", *extra], capture_output=True, text=True, timeout=120)


def test_capture_records_qkv_that_reproduce_the_layer(tmp_path):
    enc = encoder().eval()
    x = tokens(b=2, n=16)
    B, n, E = x.shape
    H, hd = 4, 8
    with torch.no_grad():
        ref = enc(x)
        with at.capture(enc) as cap:
            out = enc(x)
        assert_restored(enc)
        assert maxdiff(out, ref) <= EXACT   # capture alone runs torch's own attention
        assert [r["layer"] for r in cap.records] == [0, 1]
        assert [r["name"] for r in cap.records] == ["layers.0.self_attn", "layers.1.self_attn"]
        for r in cap.records:
            assert r["causal"] is False
            for what in "qkv":
                assert r[what].shape == (B, H, n, hd) and r[what].dtype == np.float64
        # The records are the in-projections of each layer's input (layer 1's input is layer 0's output).
        inputs = [x, enc.layers[0](x)]
        for layer, r, inp in zip(enc.layers, cap.records, inputs):
            mha = layer.self_attn
            wq, wk, wv = mha.in_proj_weight.chunk(3)
            bq, bk, bv = mha.in_proj_bias.chunk(3)
            for what, w, bias in (("q", wq, bq), ("k", wk, bk), ("v", wv, bv)):
                np.testing.assert_allclose(r[what], heads_of(F.linear(inp, w, bias), H).numpy(), rtol=0, atol=EXACT)
        # Layer 0's attention from the captured heads, then out_proj: what the module computes.
        r = cap.records[0]
        q, k, v = (torch.from_numpy(r[w]) for w in "qkv")
        o = at.attention(q, k, v, "exact")
        assert maxdiff(o, torch_attention(q, k, v)) <= EXACT
        np.testing.assert_allclose(o.numpy(), attnlab.apply("exact", r["q"].reshape(-1, n, hd),
                                                            r["k"].reshape(-1, n, hd), r["v"].reshape(-1, n, hd)
                                                            ).reshape(B, H, n, hd), rtol=0, atol=EXACT)
        o = F.linear(o.permute(0, 2, 1, 3).reshape(B, n, E), mha.out_proj.weight, mha.out_proj.bias)
        mod, _ = enc.layers[0].self_attn(x, x, x, need_weights=False)
        assert maxdiff(o, mod) <= EXACT

    # The export: meta.json and captured/seq{s}_layer{l}_{q,k,v}.npy, (heads, n, d_head) float32.
    export = tmp_path / "export"
    assert cap.save(str(export)) == str(export)
    meta = json.loads((export / "meta.json").read_text())
    assert meta["bidirectional"] is True and meta["layers"] == ["layers.0.self_attn", "layers.1.self_attn"]
    files = sorted(os.listdir(export / "captured"))
    assert files == sorted(f"seq{s}_layer{l}_{w}.npy" for s in range(B) for l in range(2) for w in "qkv")
    a = np.load(export / "captured" / "seq1_layer1_k.npy")
    assert a.dtype == np.float32 and a.shape == (H, n, hd)
    assert np.array_equal(a, cap.records[1]["k"][1].astype(np.float32))

    binary = os.environ.get("ATTNLAB_BIN")
    if not binary:
        pytest.skip("ATTNLAB_BIN not set: the report command is not checked")
    r = run_report(binary, export, tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(tmp_path / "rep" / "report.csv")))
    assert rows


def causal_export(tmp_path):
    enc = encoder().eval()
    x = tokens(b=1, n=16)
    mask = nn.Transformer.generate_square_subsequent_mask(16).double()
    with torch.no_grad():
        with at.capture(enc) as cap:
            enc(x, mask=mask)
    assert [r["causal"] for r in cap.records] == [True, True]
    export = tmp_path / "export"
    cap.save(str(export))
    assert json.loads((export / "meta.json").read_text())["bidirectional"] is False
    binary = os.environ.get("ATTNLAB_BIN")
    if not binary:
        pytest.skip("ATTNLAB_BIN not set: the report command is not checked")
    return binary, export


def test_capture_of_a_causal_run_is_refused_without_causal(tmp_path):
    binary, export = causal_export(tmp_path)
    bad = run_report(binary, export, tmp_path / "bad")
    assert bad.returncode != 0 and "--causal" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad" / "report.csv").exists()


# Was a bug (every `attnlab report --causal` built the svd baseline with causal=true and exited 2): the causal
# report keeps the Eckart-Young floor from the singular values and has no SVD output line.
def test_capture_of_a_causal_run_is_accepted_with_causal(tmp_path):
    binary, export = causal_export(tmp_path)
    good = run_report(binary, export, tmp_path / "good", "--causal")
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "good" / "report.csv").exists()


def test_capture_with_nothing_recorded():
    cap = at.capture(encoder())
    cap.restore()
    with pytest.raises(ValueError, match="nothing recorded"):
        cap.save("unused")


# A look-ahead form is never a causal verdict: vq with its codebook fitted on the window's own keys is skipped, and
# said, when the report runs under --causal.
def test_a_causal_report_skips_look_ahead_forms(tmp_path):
    binary, export = causal_export(tmp_path)
    r = subprocess.run([binary, "report", "--model-dir", str(export), "--out", str(tmp_path / "rep"), "--families",
                        "local,vq", "--repeats", "1", "--causal"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "family vq skipped under --causal" in r.stderr and "look-ahead" in r.stderr
    with gzip.open(tmp_path / "rep" / "report.csv.gz", "rt") if (tmp_path / "rep" / "report.csv.gz").exists() \
            else open(tmp_path / "rep" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and not any("vq" in str(r.get("spec", "")) or r.get("family") == "vq" for r in rows)
