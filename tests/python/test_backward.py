"""attnlab's backward pass from Python: attnlab.backward and Method.backward against PyTorch autograd of exact
attention, the autograd Function behind attnlab.torch.attention (torch.autograd.gradcheck through several methods),
and a model that trains through a swapped-in method."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402

import attnlab  # noqa: E402
import attnlab.torch as at  # noqa: E402


def torch_grads(q, k, v, do, causal=False):
    """PyTorch autograd of softmax(QKᵀ/√d [+ causal mask])V: the peer's gradients (float64)."""
    q, k, v = (torch.from_numpy(x).clone().requires_grad_(True) for x in (q, k, v))
    logits = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        n, m = logits.shape[-2:]
        logits = logits.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(m - n + 1), float("-inf"))
    out = logits.softmax(-1) @ v
    out.backward(torch.from_numpy(do))
    return [x.grad.numpy() for x in (q, k, v)]


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("causal", [False, True])
def test_exact_backward_equals_torch_autograd_at_n_2048(causal):
    """The issue's check: attnlab.backward('exact', ...) equals PyTorch autograd to 1e-12 (float64) at n = 2048."""
    rng = np.random.default_rng(0)
    n, d = 2048, 64
    q, k, v, do = (rng.standard_normal((n, d)) for _ in range(4))
    got = attnlab.backward("exact", q, k, v, do, causal=causal)
    want = torch_grads(q, k, v, do, causal)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.dtype == np.float64
        assert rel(a, b) <= 1e-12, (name, rel(a, b))


def test_method_backward_batched_heads_and_float32():
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.standard_normal((3, 40, 8)) for _ in range(4))
    m = attnlab.Method("exact", causal=True).fit(q, k)
    dq, dk, dv = m.backward(v, do)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for h in range(3):
        want = torch_grads(q[h], k[h], v[h], do[h], causal=True)
        for a, b in zip((dq[h], dk[h], dv[h]), want):
            assert rel(a, b) <= 1e-12
    m32 = attnlab.Method("exact", causal=True).fit(q.astype(np.float32), k.astype(np.float32))
    g32 = m32.backward(v.astype(np.float32), do.astype(np.float32))
    assert all(g.dtype == np.float32 for g in g32)
    assert all(rel(a, b) <= 1e-5 for a, b in zip(g32, (dq, dk, dv)))


def test_backward_errors_are_value_errors():
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((30, 4)) for _ in range(4))
    with pytest.raises(ValueError, match="not fitted"):
        attnlab.Method("exact").backward(v, do)
    with pytest.raises(ValueError, match="has no backward pass"):
        attnlab.backward("svd:rank=4", q, k, v, do)
    with pytest.raises(ValueError, match="do"):
        attnlab.backward("exact", q, k, v, do[:, :3])
    with pytest.raises(ValueError):
        attnlab.backward("exact", q, k, v, do.astype(np.float32))
    bad = do.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError):
        attnlab.backward("exact", q, k, v, bad)
    info = {m["name"]: m for m in attnlab.methods()}
    assert info["exact"]["backward"] and not info["svd"]["backward"]
    assert info["svd"]["backward_note"].startswith("refused")


@pytest.mark.parametrize("spec, causal", [("exact", True), ("linear", True), ("performer:features=16", False),
                                          ("local:window=3", True), ("nystrom:landmarks=4", False)])
def test_torch_gradcheck_through_the_function(spec, causal):
    """torch.autograd.gradcheck (central differences of the forward against the Function's backward, float64) on
    (batch, heads, n, d) tensors: the forward refits at every perturbation with the same seed."""
    if not attnlab.methods() or not {m["name"]: m for m in attnlab.methods()}[spec.split(":")[0]]["backward"]:
        pytest.skip(f"{spec} has no backward pass")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: at.attention(a, b, c, spec, causal=causal, seed=0), (q, k, v),
                                    eps=1e-6, atol=1e-7, rtol=1e-5)


def test_a_model_trains_through_a_swapped_method():
    """nn.MultiheadAttention with attnlab's exact attention swapped in gives torch's own gradients of the weights;
    with Performer swapped in, a few Adam steps lower the loss (the backward reaches the weights)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, dropout=0.0, batch_first=True).double()
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    target = torch.randn(2, 24, 16, dtype=torch.float64)

    def loss():
        out, _ = mha(x, x, x, need_weights=False)
        return ((out - target) ** 2).mean()

    mha.zero_grad()
    loss().backward()
    want = mha.in_proj_weight.grad.clone()
    mha.zero_grad()
    with at.swap(mha, "exact"):
        loss().backward()
    assert (mha.in_proj_weight.grad - want).abs().max().item() <= 1e-12 * want.abs().max().item()

    opt = torch.optim.Adam(mha.parameters(), lr=1e-2)
    with at.swap(mha, "performer:features=32"):
        first = loss().item()
        for _ in range(20):
            opt.zero_grad()
            value = loss()
            value.backward()
            opt.step()
        last = loss().item()
    assert last < 0.9 * first, (first, last)


@pytest.mark.parametrize("peer,spec,tol", [("exact", "exact", 1e-12), ("linear", "linear", 1e-11),
                                           ("local", "local:window=64", 1e-12),
                                           ("nystrom", "nystrom:landmarks=64,iters=6", 1e-7)])
def test_backward_benchmark_peers_compute_attnlabs_gradients(peer, spec, tol):
    """tools/bench_peers.py --backward times PyTorch autograd of its transcriptions against attnlab's backward: for the
    deterministic ones the two must compute the same dQ, dK, dV (like with like), float64, n = 256."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
    import bench_peers
    rng = np.random.default_rng(5)
    n, d = 256, 64
    q, k, v, do = (rng.standard_normal((n, d)) for _ in range(4))
    x = [torch.from_numpy(a).clone().requires_grad_(True) for a in (q, k, v)]
    out = bench_peers.BACKWARD_METHODS[peer](*x, {"scale": 1 / np.sqrt(d)})
    want = torch.autograd.grad(out, x, torch.from_numpy(do))
    got = attnlab.backward(spec, q, k, v, do)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert rel(a, b.numpy()) < tol, f"{peer} {name}: {rel(a, b.numpy()):.2g}"
