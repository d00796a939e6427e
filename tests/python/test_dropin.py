"""tools/dropin.py: the drop-in experiment on the committed trained models (Debian's torch; seconds per test)."""
import gzip
import csv
import os
import sys

import pytest

torch = pytest.importorskip("torch")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dropin  # noqa: E402


@pytest.fixture(scope="module", params=["mlm", "causal"])
def model(request):
    m = dropin.Model(request.param, 3)
    m.exact_run()
    return m


def test_exact_through_attnlab_reproduces_the_models_own_loss(model):
    """Swapping exact attention in through attnlab gives the model's held-out loss (float64, ≤ 1e-10)."""
    native = model.torch_loss()
    assert float((model.ce - native).abs().max()) <= 1e-10
    m = model.scored
    assert abs(float(model.ce[m].sum() - native[m].sum()) / model.tokens) <= 1e-10
    assert model.tokens == int(m.sum()) > 100
    if model.objective == "mlm":   # BERT's 15% of the positions, the same seeded masks every time
        assert 0.10 < model.tokens / m.numel() < 0.20
        again = dropin.Model("mlm", 3)
        assert torch.equal(again.x, model.x) and torch.equal(again.scored, model.scored)


def test_exact_limit_of_an_approximation_loses_nothing(model):
    """local with a window as long as the sequence is exact attention: every measure at its exact value."""
    spec = "local:window=1024"
    (row,) = dropin.unit_all(model, spec, 0)
    assert abs(row["dloss"]) <= 1e-10 and abs(row["kl"]) <= 1e-10 and row["top1"] == 1.0
    assert row["head_err"] <= 1e-12
    grads = model.head_gradients()
    heads = dropin.unit_heads(model, spec, 0, grads)
    assert len(heads) == model.L * model.H
    assert max(abs(r["dloss"]) for r in heads) <= 1e-10 and max(r["p_tv"] for r in heads) <= 1e-12


def independent_head_swap(model, layer, head, spec):
    """The model's own forward (torch's attention in every other head, recomputed on the perturbed stream) with one
    head's output replaced by the method's: what a per-head swap means, written without dropin's caches."""
    import attnlab.torch as at
    with torch.no_grad():
        x = model.embed()
        for l, blk in enumerate(model.net.blocks):
            q, k, v = blk.heads(x)
            o = blk.attention(q, k, v)
            if l == layer:
                o = o.clone()
                o[:, head] = at.attention(q[:, head], k[:, head], v[:, head], spec, causal=model.causal, seed=l)
            x = blk.finish(x, o)
        return torch.log_softmax(model.net.head(model.net.ln(x)), -1)


def test_per_head_and_per_layer_swaps_match_an_independent_forward(model):
    spec = "local:window=8"
    grads = model.head_gradients()
    rows = dropin.unit_heads(model, spec, 0, grads)
    for layer, head in ((0, 1), (2, 3)):
        r = next(r for r in rows if r["layer"] == layer and r["head"] == head)
        want = model.measures(independent_head_swap(model, layer, head, spec))
        assert abs(r["dloss"] - want["dloss"]) <= 1e-10 and abs(r["kl"] - want["kl"]) <= 1e-10
        assert r["dloss"] != 0.0
    # the first-order prediction is ⟨∂L/∂O, Õ − O⟩: for a small perturbation it matches the measured change
    assert all(abs(r["grad_lin"]) <= r["grad_bound"] * (1 + 1e-12) for r in rows)
    layers = dropin.unit_layers(model, spec, 0, grads)
    assert [r["layer"] for r in layers] == list(range(model.L))


def test_p_tv_is_the_mean_total_variation_of_the_rows(model):
    """p_tv of a per-head swap: ½‖p − p̃‖₁ of each attention row, averaged over rows and windows, from the two
    matrices as attnlab forms them; row_l1_distances gives the same sums, bit for bit, as the whole-array
    expression it replaces (the exact P is cached per layer: a second spec is measured against the same one)."""
    np, attnlab = dropin.np, dropin.attnlab
    grads = model.head_gradients()
    layer = 1
    q, k, _ = model.qkv[layer]
    W, H, n, dh = q.shape
    qf, kf, z = q.reshape(-1, n, dh).numpy(), k.reshape(-1, n, dh).numpy(), np.zeros((W * H, n, 1))
    _, pe = attnlab.apply("exact", qf, kf, z, causal=model.causal, matrix=True)
    for spec in ("local:window=8", "performer:features=16"):
        rows = dropin.unit_heads(model, spec, 0, grads)
        _, pa = attnlab.apply(spec, qf, kf, z, causal=model.causal, seed=layer, matrix=True)
        whole = np.abs(pa - pe).sum(-1)
        assert np.array_equal(dropin.row_l1_distances(pa, pe), whole)
        want = 0.5 * whole.reshape(W, H, n).mean(axis=(0, 2))
        got = [r["p_tv"] for r in rows if r["layer"] == layer]
        assert got == [float(w) for w in want] and min(got) > 0


@pytest.mark.parametrize("layer", [0, 3])
def test_gradients_are_the_loss_derivative(model, layer):
    """∂L/∂O by autograd against a central difference of the pooled loss along a random direction (float64), the
    perturbation carried through every later layer's attention (layer 0: all of them)."""
    grads = model.head_gradients()
    gen = torch.Generator().manual_seed(layer)
    d = torch.randn(model.o[layer].shape, generator=gen, dtype=torch.float64)
    eps = 1e-6

    def loss(o):
        logp = model.run_from(layer, model.xs[layer], o, dropin.exact_later(model))
        return float(model.token_ce(logp)[model.scored].sum() / model.tokens)

    fd = (loss(model.o[layer] + eps * d) - loss(model.o[layer] - eps * d)) / (2 * eps)
    assert abs(fd - float((grads[layer] * d).sum())) <= 1e-6 * max(1e-3, abs(fd))


def read(path):
    with gzip.open(path, "rt") as f:
        return list(csv.DictReader(f))


def test_run_is_resumable_and_complete(tmp_path, monkeypatch):
    args = ["--windows", "2", "--families", "local", "--models", "causal", "--budgets-all", "0,1",
            "--budgets-detail", "0", "--quiet"]
    clean = tmp_path / "clean.csv.gz"
    assert dropin.main(args + ["--out", str(clean)]) == 0
    rows = read(clean)
    scopes = [r["scope"] for r in rows]
    assert scopes.count("exact") == 1 and scopes.count("all") == 2 and scopes.count("layer") == 4
    assert scopes.count("head") == 16
    exact = next(r for r in rows if r["scope"] == "exact")
    assert float(exact["dloss"]) == 0.0 and float(exact["top1"]) == 1.0
    assert all(float(r["kl"]) > 0 for r in rows if r["scope"] == "all")
    # interrupted in the per-head unit: the finished units stay in .partial and a rerun completes from there
    out = tmp_path / "resumed.csv.gz"
    real = dropin.unit_heads

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(dropin, "unit_heads", interrupt)
    with pytest.raises(KeyboardInterrupt):
        dropin.main(args + ["--out", str(out)])
    assert not out.exists() and (tmp_path / "resumed.csv.gz.partial").exists()
    monkeypatch.setattr(dropin, "unit_heads", real)
    assert dropin.main(args + ["--out", str(out)]) == 0
    again = read(out)

    def values(rs):
        return [{k: v for k, v in r.items() if k != "time_s"} for r in rs]

    assert values(again) == values(rows)
    assert not (tmp_path / "resumed.csv.gz.partial").exists()
    # a torn unit (an interrupt inside a write) and a malformed line are dropped and computed again, not kept
    torn = tmp_path / "torn.csv.gz"
    monkeypatch.setattr(dropin, "unit_heads", interrupt)
    with pytest.raises(KeyboardInterrupt):
        dropin.main(args + ["--out", str(torn)])
    partial = tmp_path / "torn.csv.gz.partial"
    layer_rows = [r for r in rows if r["scope"] == "layer"]
    with open(partial, "a") as f:
        f.write(",".join(layer_rows[0][c] for c in dropin.COLUMNS) + "\n")   # one of the unit's 4 rows only
        f.write("causal,next-byte,hea")                                        # a line cut short
    monkeypatch.setattr(dropin, "unit_heads", real)
    assert dropin.main(args + ["--out", str(torn)]) == 0
    assert values(read(torn)) == values(rows)


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        dropin.main(["--models", "gpt", "--out", "/nonexistent/x.csv.gz"])
    with pytest.raises(SystemExit, match="unknown family"):
        dropin.main(["--families", "nystrom,bogus", "--windows", "2", "--models", "mlm", "--out", "/tmp/x.csv.gz"])


def test_the_library_study_gives_the_tools_numbers(model):
    """attnlab.study.dropin on the ByteTransformer (through the standard call, as on a user's model) against this
    tool's cached per-head units: the same loss increase, KL, top-1 and head measures (the library recomputes every
    layer where the tool replays the cached ones, and takes ∂L/∂O from attnlab's exact backward where the tool
    takes torch's: rounding apart)."""
    import attnlab.study as study
    spec = "local:window=8"

    def step(net, batch):
        logits = net(model.x)
        ce = -torch.log_softmax(logits, -1).gather(-1, model.target[..., None])[..., 0]
        return {"loss": ce, "mask": model.scored, "logits": logits}

    rows = study.dropin(model.net, [None], step, [spec], scopes=("head",), progress=False)
    assert rows[0]["max_abs_own"] <= 1e-10
    tool = {(r["layer"], r["head"]): r for r in dropin.unit_heads(model, spec, 0, model.head_gradients())}
    for r in rows[1:]:
        t = tool[(r["layer"], r["head"])]
        for key in ("dloss", "kl", "top1", "loss", "loss_se", "dloss_se"):
            assert r[key] == pytest.approx(t[key], rel=1e-9, abs=1e-12), key
        for key in ("head_err", "grad_lin", "grad_bound", "p_tv"):
            assert r[key] == pytest.approx(t[key], rel=1e-8, abs=1e-14), key
