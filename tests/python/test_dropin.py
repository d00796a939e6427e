"""tools/dropin.py: the drop-in experiment on the committed trained models, through attnlab.study (Debian's torch;
seconds per test)."""
import gzip
import csv
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dropin  # noqa: E402

np, attnlab, at = dropin.np, dropin.attnlab, dropin.at


@pytest.fixture(scope="module", params=["mlm", "causal"])
def model(request):
    m = dropin.Model(request.param, 3)
    m.d = m.study()
    return m


def test_exact_through_attnlab_reproduces_the_models_own_loss(model):
    """Swapping exact attention in through attnlab gives the model's held-out loss (float64, ≤ 1e-10)."""
    native, ce = model.torch_loss(), model.d.base.tokens[0]
    assert float((ce - native).abs().max()) <= 1e-10
    m = model.scored
    assert abs(float(ce[m].sum() - native[m].sum()) / model.tokens) <= 1e-10
    assert abs(model.d.baseline["loss"] - float(native[m].sum()) / model.tokens) <= 1e-10
    assert model.tokens == int(m.sum()) > 100
    if model.objective == "mlm":   # BERT's 15% of the positions, the same seeded masks every time
        assert 0.10 < model.tokens / m.numel() < 0.20
        again = dropin.Model("mlm", 3)
        assert torch.equal(again.x, model.x) and torch.equal(again.scored, model.scored)


def test_exact_limit_of_an_approximation_loses_nothing(model):
    """local with a window as long as the sequence is exact attention: every measure at its exact value."""
    spec = "local:window=1024"
    (row,) = dropin.unit_rows(model.d, spec, "all")
    assert abs(row["dloss"]) <= 1e-10 and abs(row["kl"]) <= 1e-10 and row["top1"] == 1.0
    assert row["head_err"] <= 1e-12
    heads = dropin.unit_rows(model.d, spec, "head")
    assert len(heads) == model.L * model.H
    assert max(abs(r["dloss"]) for r in heads) <= 1e-10 and max(r["p_tv"] for r in heads) <= 1e-12
    assert max(r["resid_err"] for r in heads) <= 1e-12


def embed(model):
    net = model.net
    x = net.tok(model.x)
    return x if net.rotary else x + net.pos(torch.arange(model.x.shape[1]))


def independent_forward(model, layer=None, change=None):
    """The model's own forward (torch's attention in every head, recomputed on the perturbed stream) with layer
    `layer`'s head outputs o replaced by change(o, q, k, v): what a swap means, written without attnlab.study.
    Returns the per-position cross-entropy, and the layers' inputs and Q, K, V."""
    xs, qkv = [], []
    x = embed(model)
    for l, blk in enumerate(model.net.blocks):
        q, k, v = blk.heads(x)
        xs.append(x)
        qkv.append((q, k, v))
        o = blk.attention(q, k, v)
        if l == layer:
            o = change(o, q, k, v)
        x = blk.finish(x, o)
    logp = torch.log_softmax(model.net.head(model.net.ln(x)), -1)
    return -logp.gather(-1, model.target[..., None])[..., 0], logp, xs, qkv


def test_per_head_and_per_layer_swaps_match_an_independent_forward(model):
    spec = "local:window=8"
    rows = dropin.unit_rows(model.d, spec, "head")
    m = model.scored
    ce0, logp0, xs, _ = independent_forward(model)
    with torch.no_grad():
        for layer, head in ((0, 1), (2, 3)):
            r = next(r for r in rows if r["layer"] == layer and r["head"] == head)
            kept = {}

            def one_head(o, q, k, v):
                o = o.clone()
                o[:, head] = at.attention(q[:, head], k[:, head], v[:, head], spec, causal=model.causal, seed=layer)
                kept["d"] = o[:, head] - model.net.blocks[layer].attention(q, k, v)[:, head]
                return o

            ce, logp, _, _ = independent_forward(model, layer, one_head)
            dloss = float(((ce - ce0) * m).sum()) / model.tokens
            kl = float(((logp0.exp() * (logp0 - logp)).sum(-1) * m).sum()) / model.tokens
            assert abs(r["dloss"] - dloss) <= 1e-10 and abs(r["kl"] - kl) <= 1e-10 and r["dloss"] != 0.0
            # resid_err: the head's error through its columns of the out-projection, relative to the stream
            dh = model.net.blocks[layer].dh
            w = model.net.blocks[layer].proj.weight[:, head * dh:(head + 1) * dh]
            want = float((kept["d"] @ w.T).norm() / xs[layer].norm())
            assert r["resid_err"] == pytest.approx(want, rel=1e-9)
    # the first-order prediction ⟨∂L/∂O, Õ − O⟩ is bounded by Cauchy–Schwarz
    assert all(abs(r["grad_lin"]) <= r["grad_bound"] * (1 + 1e-12) for r in rows)
    layers = dropin.unit_rows(model.d, spec, "layer")
    assert [r["layer"] for r in layers] == list(range(model.L))


def test_p_tv_is_the_mean_total_variation_of_the_rows(model):
    """p_tv of a per-head swap: ½‖p − p̃‖₁ of each attention row, averaged over rows and windows, from the two
    matrices as attnlab forms them on the exact model's Q, K."""
    layer = 1
    _, _, _, qkv = independent_forward(model)
    q, k, _ = (t.detach() for t in qkv[layer])
    W, H, n, dh = q.shape
    qf, kf, z = q.reshape(-1, n, dh).numpy(), k.reshape(-1, n, dh).numpy(), np.zeros((W * H, n, 1))
    _, pe = attnlab.apply("exact", qf, kf, z, causal=model.causal, matrix=True)
    for spec in ("local:window=8", "performer:features=16"):
        rows = dropin.unit_rows(model.d, spec, "head")
        _, pa = attnlab.apply(spec, qf, kf, z, causal=model.causal, seed=layer, matrix=True)
        want = 0.5 * np.abs(pa - pe).sum(-1).reshape(W, H, n).mean(axis=(0, 2))
        got = [r["p_tv"] for r in rows if r["layer"] == layer]
        assert got == pytest.approx([float(w) for w in want], rel=1e-12) and min(got) > 0


@pytest.mark.parametrize("layer", [0, 3])
def test_gradients_are_the_loss_derivative(model, layer):
    """∂L/∂O (attnlab's exact backward, through attnlab.study's capture) against a central difference of the pooled
    loss along a random direction (float64), the perturbation carried through every later layer's attention (layer
    0: all of them)."""
    (records,) = model.d.records()
    do = torch.from_numpy(next(r["do"] for r in records if r["layer"] == layer))
    gen = torch.Generator().manual_seed(layer)
    d = torch.randn(do.shape, generator=gen, dtype=torch.float64)
    eps = 1e-6

    def loss(sign):
        with torch.no_grad():
            ce, _, _, _ = independent_forward(model, layer, lambda o, q, k, v: o + sign * eps * d)
        return float(ce[model.scored].sum() / model.tokens)

    fd = (loss(1) - loss(-1)) / (2 * eps)
    assert abs(fd - float((do * d).sum())) <= 1e-6 * max(1e-3, abs(fd))


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
    real = dropin.unit_rows

    def interrupt(d, spec, scope):
        if scope == "head":
            raise KeyboardInterrupt
        return real(d, spec, scope)

    monkeypatch.setattr(dropin, "unit_rows", interrupt)
    with pytest.raises(KeyboardInterrupt):
        dropin.main(args + ["--out", str(out)])
    assert not out.exists() and (tmp_path / "resumed.csv.gz.partial").exists()
    monkeypatch.setattr(dropin, "unit_rows", real)
    assert dropin.main(args + ["--out", str(out)]) == 0
    again = read(out)

    def values(rs):
        return [{k: v for k, v in r.items() if k != "time_s"} for r in rs]

    assert values(again) == values(rows)
    assert not (tmp_path / "resumed.csv.gz.partial").exists()
    # a torn unit (an interrupt inside a write) and a malformed line are dropped and computed again, not kept
    torn = tmp_path / "torn.csv.gz"
    monkeypatch.setattr(dropin, "unit_rows", interrupt)
    with pytest.raises(KeyboardInterrupt):
        dropin.main(args + ["--out", str(torn)])
    partial = tmp_path / "torn.csv.gz.partial"
    layer_rows = [r for r in rows if r["scope"] == "layer"]
    with open(partial, "a") as f:
        f.write(",".join(layer_rows[0][c] for c in dropin.COLUMNS) + "\n")   # one of the unit's 4 rows only
        f.write("causal,next-byte,hea")                                        # a line cut short
    monkeypatch.setattr(dropin, "unit_rows", real)
    assert dropin.main(args + ["--out", str(torn)]) == 0
    assert values(read(torn)) == values(rows)


def test_units_in_worker_processes_give_the_rows_of_one_process(tmp_path):
    """--jobs 2: the units computed by two spawned processes (each building the baselines itself) give the rows one
    process gives, every value but the wall times; the settings (the resumable key) are the same. Both runs are
    commands: a command pins torch's kernels before importing it (this test process imported it first)."""
    args = ["--windows", "2", "--families", "local,nystrom", "--models", "causal,mlm", "--budgets-all", "0",
            "--budgets-detail", "0", "--threads", "1", "--quiet"]
    one, two = tmp_path / "one.csv.gz", tmp_path / "two.csv.gz"
    for jobs, out in (("1", one), ("2", two)):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "dropin.py")] + args + ["--jobs", jobs, "--out",
                                                                                             str(out)], check=True)

    def values(rs):
        return [{k: v for k, v in r.items() if k != "time_s"} for r in rs]

    # causal: exact and local (nystrom is not causal); mlm: exact, local, nystrom; each family all + 4 layers + 16 heads
    assert len(read(one)) == (1 + 21) + (1 + 2 * 21)
    assert values(read(two)) == values(read(one))
    import json
    c1, c2 = (json.load(open(f"{p}.config")) for p in (one, two))
    assert (c1["jobs"], c2["jobs"]) == (1, 2) and c1["checks"] == c2["checks"] and c1["code"] == c2["code"]
    assert {k: v for k, v in c1.items() if k not in ("jobs", "command")} == \
        {k: v for k, v in c2.items() if k not in ("jobs", "command")}


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        dropin.main(["--models", "gpt", "--out", "/nonexistent/x.csv.gz"])
    for bad in (["--jobs", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            dropin.main(bad + ["--models", "mlm", "--out", "/nonexistent/x.csv.gz"])
    with pytest.raises(SystemExit, match="unknown family"):
        dropin.main(["--families", "nystrom,bogus", "--windows", "2", "--models", "mlm", "--out", "/tmp/x.csv.gz"])
