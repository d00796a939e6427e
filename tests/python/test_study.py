"""attnlab.study on small models of the forms users have (a hand-written model calling the standard call, and an
nn.TransformerEncoder): the drop-in rows against independent recomputations (loss, paired SE, KL, top-1, head
measures), resuming, the predictors' correlations, fine-tuning with its exact control, and bad input. Seconds."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnlab  # noqa: E402
import attnlab.study as study  # noqa: E402
import attnlab.torch as at  # noqa: E402
from attnlab import sdpa  # noqa: E402


class Tiny(nn.Module):
    def __init__(self, vocab=30, d=16, heads=2, layers=2, causal=True):
        super().__init__()
        torch.manual_seed(0)
        self.causal, self.h = causal, heads
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(32, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.out = nn.Linear(d, vocab)

    def forward(self, idx, attend=None):
        b, n = idx.shape
        x = self.emb(idx) + self.pos(torch.arange(n))
        for l, (qkv, proj) in enumerate(zip(self.qkv, self.proj)):
            q, k, v = qkv(x).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
            o = sdpa.attention(q, k, v, is_causal=self.causal) if attend is None else attend(l, q, k, v)
            x = x + proj(o.transpose(1, 2).reshape(b, n, -1))
        return self.out(x)


def step(model, batch):
    x, y = batch
    logits = model(x)
    return {"loss": F.cross_entropy(logits.transpose(1, 2), y, reduction="none"), "logits": logits}


def batches(count=3, b=2, n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        idx = torch.randint(0, 30, (b, n + 1), generator=g)
        out.append((idx[:, :-1], idx[:, 1:]))
    return out


def model():
    return Tiny().double().eval()


def test_dropin_rows_against_independent_recomputations():
    m, bs = model(), batches()
    spec = "local:window=3"
    rows = study.dropin(m, bs, step, [spec], progress=False)
    base = rows[0]
    assert base["scope"] == "exact" and base["max_abs_own"] <= 1e-10 and base["dloss"] == 0
    head = next(r for r in rows if r["scope"] == "head" and r["layer"] == 1 and r["head"] == 0)

    def attend(l, q, k, v):   # head (1, 0) by attnlab.apply, everything else by a written-out softmax
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        o = s.softmax(-1) @ v
        if l == 1:
            o[:, 0] = torch.from_numpy(attnlab.apply(spec, q[:, 0].numpy(), k[:, 0].numpy(), v[:, 0].numpy(),
                                                     causal=True))
        return o

    sums, sums0, counts, kl, top = [], [], [], 0.0, 0.0
    with torch.no_grad():
        for x, y in bs:
            logits, logits0 = m(x, attend), m(x)
            ce = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
            ce0 = F.cross_entropy(logits0.transpose(1, 2), y, reduction="none")
            sums.append(ce.sum(1)), sums0.append(ce0.sum(1)), counts.append(torch.full((x.shape[0],), x.shape[1]))
            lp, lp0 = logits.log_softmax(-1), logits0.log_softmax(-1)
            kl += float((lp0.exp() * (lp0 - lp)).sum())
            top += float((lp0.argmax(-1) == lp.argmax(-1)).sum())
    s, s0, c = torch.cat(sums).numpy(), torch.cat(sums0).numpy(), torch.cat(counts).double().numpy()
    d = (s - s0) / c.sum()
    # pooled mean and the cluster (sequence) ratio SE, written out
    mean = (s - s0).sum() / c.sum()
    se = math.sqrt(len(c) / (len(c) - 1) * (((s - s0) - mean * c) ** 2).sum()) / c.sum()
    assert head["dloss"] == pytest.approx(d.sum(), abs=1e-10)
    assert head["dloss_se"] == pytest.approx(se, rel=1e-9)
    assert head["kl"] == pytest.approx(kl / c.sum(), abs=1e-10)
    assert head["top1"] == pytest.approx(top / c.sum(), abs=1e-12)
    assert head["loss"] == pytest.approx(s.sum() / c.sum(), abs=1e-10)
    # head measures: finite, and the error is the head's ‖Õ − O‖/‖O‖ on the exact model's Q, K, V
    for key in study.MEASURES:
        assert math.isfinite(head[key]), key
    assert 0 < head["head_err"] < 2 and 0 <= head["p_tv"] <= 1 and head["grad_bound"] >= abs(head["grad_lin"])
    assert {r["scope"] for r in rows} == {"exact", "all", "layer", "head"}
    assert len([r for r in rows if r["scope"] == "head"]) == 4


def test_head_measures_against_autograd():
    m, bs = model(), batches(count=1)
    spec = "local:window=2"
    rows = study.dropin(m, bs, step, [spec], scopes=("head",), progress=False)
    r = next(r for r in rows if r["scope"] == "head" and r["layer"] == 0 and r["head"] == 1)
    outs, qkv = [], []

    def attend(l, q, k, v):
        o = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.retain_grad()
        outs.append(o)
        qkv.append((q.detach(), k.detach(), v.detach()))
        return o
    x, y = bs[0]
    ce = F.cross_entropy(m(x, attend).transpose(1, 2), y, reduction="none")
    ce.mean().backward()
    q, k, v = (t[:, 1].numpy() for t in qkv[0])
    o = outs[0][:, 1].detach().numpy()
    o_t = attnlab.apply(spec, q, k, v, causal=True)
    g = outs[0].grad[:, 1].numpy()
    assert r["grad_lin"] == pytest.approx(float((g * (o_t - o)).sum()), rel=1e-8)
    assert r["head_err"] == pytest.approx(float(np.linalg.norm(o_t - o) / np.linalg.norm(o)), rel=1e-8)


def test_dropin_on_a_transformer_encoder_and_resume(tmp_path):
    torch.manual_seed(1)
    enc = nn.Sequential(nn.Embedding(30, 16), nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True), 2),
        nn.Linear(16, 30)).double().eval()

    def enc_step(model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
    bs = batches()
    part = tmp_path / "dropin.jsonl"
    first = study.dropin(enc, bs, enc_step, ["nystrom:landmarks=4"], scopes=("all", "layer"), progress=False,
                         partial=str(part))
    assert first[0]["max_abs_own"] <= 1e-10 and math.isnan(first[0]["kl"])
    lines = part.read_text().splitlines()
    assert len(lines) == 1 + 3
    part.write_text("\n".join(lines[:-1]) + "\n{torn")   # an interrupt: the last unit lost, a torn line
    seen = []
    again = study.dropin(enc, bs, enc_step, ["nystrom:landmarks=4"], scopes=("all", "layer"),
                         progress=seen.append, partial=str(part))
    assert len([s for s in seen if "/" in s]) == 1   # only the lost unit was computed again
    strip = lambda rows: [{k: ("nan" if v != v else v) for k, v in r.items() if k != "time_s"}  # noqa: E731
                          for r in rows]
    assert strip(again) == strip(first)


def test_predictors_and_bad_input():
    m, bs = model(), batches()
    rows = study.dropin(m, bs, step, ["local:window=2", "linear"], scopes=("head",), progress=False)
    pr = study.predictors(rows)
    assert [p["measure"] for p in pr] == list(study.MEASURES)
    assert all(p["pairs"] == 8 and p["heads"] == 4 for p in pr)
    assert all(-1 <= p["rho"] <= 1 and p["lo"] <= p["rho"] <= p["hi"] for p in pr if not math.isnan(p["rho"]))
    with pytest.raises(ValueError, match="nystromm"):
        study.dropin(m, bs, step, ["nystromm"], progress=False)
    with pytest.raises(ValueError, match="no batches"):
        study.dropin(m, [], step, ["linear"], progress=False)
    with pytest.raises(ValueError, match="loss tensor"):
        study.dropin(m, bs, lambda model, b: 3.0, ["linear"], progress=False)
    with pytest.raises(ValueError, match="no one-head swaps"):
        study.predictors([r for r in rows if r["scope"] != "head"])


def test_finetune_recovers_against_its_exact_control():
    m = model()
    train, held = batches(count=6, seed=1), batches(count=2, seed=2)
    rows = study.finetune(m, "local:window=2", train, held, step, steps=6, lr=3e-3, evals=2, progress=False)
    method = [r for r in rows if r["arm"] == "method"]
    exact = [r for r in rows if r["arm"] == "exact"]
    assert [r["step"] for r in method] == [0, 3, 6] and [r["step"] for r in exact] == [0, 3, 6]
    assert all(r["status"] == "ok" for r in rows)
    # step 0: the method's drop-in loss; the exact control at step 0 is the model's own loss
    with torch.no_grad():
        own = torch.cat([step(m, b)["loss"].reshape(-1) for b in held]).mean().item()
    assert exact[0]["loss"] == pytest.approx(own, abs=1e-10)
    assert method[0]["gap"] > 0 and method[-1]["loss"] < method[0]["loss"]
    assert all(math.isfinite(r["time_per_step_s"]) for r in rows)
    # the model passed in is not trained
    with torch.no_grad():
        assert torch.cat([step(m, b)["loss"].reshape(-1) for b in held]).mean().item() == own


def test_choose_checks_its_mix_on_other_batches(tmp_path):
    """study.choose on a user's model: the report's heads chosen under a loss target on some batches, the chosen mix's
    increase then measured on others — equal to that mix swapped in by hand there."""
    import os
    import subprocess
    exe = os.environ.get("ATTNLAB_BIN")
    if not exe:
        pytest.skip("ATTNLAB_BIN (the attnlab command) not set")
    m = model()
    fit, check = batches(count=2, seed=3), batches(count=2, seed=4)
    with torch.no_grad(), at.capture(m) as cap:
        m(fit[0][0][:1])
    cap.save(str(tmp_path / "export"))
    r = subprocess.run([exe, "report", "--model-dir", str(tmp_path / "export"), "--out", str(tmp_path / "rep"),
                        "--causal", "--families", "local", "--cost-n", "1024", "--repeats", "1", "--target", "0.9"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-1000:]
    got = study.choose(m, str(tmp_path / "rep"), fit, step, loss_target=10.0, check_batches=check)
    mix = got["loss target"]["mix"]
    by_hand = {l: [mix.get((l, h)) for h in range(2)] for l in range(2) if any(k[0] == l for k in mix)}

    def per_example(spec):
        with torch.no_grad(), at.swap(m, spec):
            return torch.cat([step(m, b)["loss"].mean(1) for b in check])
    d = (per_example(by_hand) - per_example(None)).numpy() if mix else np.zeros(4)
    assert got["check"]["increase"] == pytest.approx(float(d.mean()), abs=1e-12)


def test_a_swap_that_fails_in_its_format_is_a_row():
    """A method that overflows in a reduced precision (eager Performer in float16 on long queries: the reference
    features' e^{−‖x‖²/2} underflow, 0/0) makes the next layer's attention refuse its inputs: dropin records a
    `failed` row (finite False, the losses NaN) and goes on; the other swaps are `ok`."""
    m = Tiny(causal=False).double().eval()
    with torch.no_grad():
        for lin in m.qkv:
            lin.weight.mul_(12.0)   # long queries and keys
    with pytest.warns(RuntimeWarning):
        specs = ["performer:features=16@fp16-eager", "performer:features=16@fp16-careful"]
        rows = study.dropin(m, batches(), step, specs, scopes=("all",), measures=False, progress=False)
    base, eager, careful = rows
    assert base["status"] == "ok"
    assert eager["status"].startswith("failed") and eager["finite"] is False and math.isnan(eager["loss"])
    assert careful["status"] == "ok" and careful["finite"] and math.isfinite(careful["dloss"])


def test_head_measures_of_a_half_precision_spec():
    """One-head swaps of a '@bf16' spec with the head measures (the defaults): p_tv reads the method's own P̃
    (natively: the emulation rounds outputs, not P̃), the loss its emulated run; nothing refuses the matrix."""
    m = Tiny().double().eval()
    rows = study.dropin(m, batches(1), step, ["linear@bf16-careful"], scopes=("head",), progress=False)
    heads = [r for r in rows if r["scope"] == "head"]
    plain = study.dropin(m, batches(1), step, ["linear"], scopes=("head",), progress=False)
    assert heads and all(r["status"] == "ok" and math.isfinite(r["p_tv"]) for r in heads)
    assert [r["p_tv"] for r in heads] == [r["p_tv"] for r in plain if r["scope"] == "head"]


def test_units_reuse_the_baselines_exact_calls_and_give_the_same_rows(monkeypatch):
    """A one-head or one-layer unit takes the exact outputs of the calls whose inputs are the baseline's (every layer
    before the swapped one, the unswapped heads of its layer) from the baseline's run instead of computing them: the
    rows are the same, bit for bit, as with every call computed, and attention runs only where the swap changed
    something."""
    m, bs = Tiny(layers=3).double().eval(), batches()
    computed = []
    real = at.attention

    def counting(q, k, v, spec, **kw):
        computed.append((spec, q.shape[1]))   # (spec, heads computed)
        return real(q, k, v, spec, **kw)

    monkeypatch.setattr(at, "attention", counting)
    d = study.Dropin(m, bs, step, measures=False)
    kept = dict(d._memo.calls)
    assert len(kept) == 3 * len(bs)   # every call of the baseline's forwards recorded
    rows = {}
    for memo in (kept, None):
        d._memo.calls = dict(memo) if memo is not None else {}
        computed.clear()
        rows[memo is None] = [d.unit("local:window=4", "head", 1, 0), d.unit("local:window=4", "layer", 2, ""),
                              d.unit("local:window=4", "head", 0, 1)]
        if memo is not None:
            exact = sum(h for s, h in computed if s == "exact")
            # head (1, 0): layer 0 reused, layer 1's other head reused, layer 2 computed (2 heads) per batch;
            # layer 2: layers 0, 1 reused; head (0, 1): layer 0's head 0 reused, layers 1, 2 computed (2 + 2)
            assert exact == len(bs) * (2 + 0 + 4), computed
    strip = lambda rs: [{k: v for k, v in r.items() if k != "time_s"} for r in rs]  # noqa: E731
    assert strip(rows[False]) == strip(rows[True])


class Layer(nn.Module):
    """A pre-LayerNorm transformer layer making the standard call (the project's models' form)."""

    def __init__(self, d, h, causal):
        super().__init__()
        self.h, self.causal = h, causal
        self.ln, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x, note=None):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        x = x + self.proj(sdpa.attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(x)


class Stacked(nn.Module):
    def __init__(self, layers=3, d=16, heads=2, vocab=30, causal=True):
        super().__init__()
        torch.manual_seed(1)
        self.emb, self.out = nn.Embedding(vocab, d), nn.Linear(d, vocab)
        self.layers = nn.ModuleList(Layer(d, heads, causal) for _ in range(layers))

    def forward(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x, note="kept")
        return self.out(x)


def counted(monkeypatch, owner, name):
    """A list that gains the first argument of every call of owner.name (a layer's forward), patched for the test."""
    ran, real = [], getattr(owner, name)

    def counting(first, *a, **kw):
        ran.append(first)
        return real(first, *a, **kw)

    monkeypatch.setattr(owner, name, counting)
    return ran


def with_and_without_reuse(d, units, ran):
    """The rows (without time_s) of the units and the layer forwards run ({True: with the recorded layers reused,
    False: with none}); the record is left in place."""
    kept, rows, counts = d._memo.blocks, {}, {}
    for reuse in (True, False):
        d._memo.blocks = kept if reuse else {}
        ran.clear()
        rows[reuse] = [{k: v for k, v in d.unit(*u).items() if k != "time_s"} for u in units]
        counts[reuse] = len(ran)
    d._memo.blocks = kept
    return rows, counts


def test_units_skip_the_layers_before_the_swapped_one(monkeypatch):
    """With reuse_layers, the layers (elements of the model's nn.ModuleList) before a unit's swapped one are not run
    again: their recorded outputs stand in, and the rows are those with every layer computed, bit for bit. A layer
    whose weights changed since the baseline, a model in training mode or a layer with a forward hook is
    computed."""
    m, bs = Stacked().double().eval(), batches()
    ran = counted(monkeypatch, Layer, "forward")
    assert study.Dropin(m, bs, step, measures=False)._memo.blocks is None   # off unless asked for
    d = study.Dropin(m, bs, step, measures=False, reuse_layers=True)
    assert len(d._memo.blocks) == 3 * len(bs)   # every layer of every batch's forward kept
    units = [("local:window=4", "head", 1, 0), ("local:window=4", "layer", 2, ""), ("local:window=4", "head", 0, 1),
             ("local:window=4", "all", "", ""), ("exact", "layer", 1, "")]
    rows, counts = with_and_without_reuse(d, units, ran)
    assert rows[True] == rows[False]
    # per batch: head (1, 0) runs layers 1, 2; layer 2 runs 2; head (0, 1) and all run 3; exact runs none
    assert counts[True] == len(bs) * (2 + 1 + 3 + 3 + 0) and counts[False] == len(bs) * 3 * len(units)
    assert rows[True][-1]["dloss"] == 0.0
    # a forward hook inside layer 0 (it may read what the layer computes): layer 0 is run
    h = m.layers[0].mlp.register_forward_hook(lambda mod, inp, out: None)
    ran.clear()
    d.unit("local:window=4", "head", 2, 0)
    assert len(ran) == len(bs) * 2
    h.remove()
    # weights changed in place after the baseline: that layer and the later ones are computed
    with torch.no_grad():
        m.layers[0].mlp[0].weight.add_(0.01)
    ran.clear()
    r = d.unit("local:window=4", "head", 2, 0)
    assert len(ran) == len(bs) * 3
    fresh = study.Dropin(m, bs, step, measures=False).unit("local:window=4", "head", 2, 0)
    assert r["loss"] == fresh["loss"] and r["loss"] != rows[True][0]["loss"]
    # weights replaced through .data (the same tensor object, the same version counter): computed too
    with torch.no_grad():
        m.layers[0].mlp[0].weight.sub_(0.01)
    d = study.Dropin(m, bs, step, measures=False, reuse_layers=True)
    m.layers[1].mlp[0].weight.data = m.layers[1].mlp[0].weight.data * 1.5
    ran.clear()
    r = d.unit("local:window=4", "head", 2, 0)
    assert len(ran) == len(bs) * 2   # layer 0 reused, layer 1 (changed) and 2 run
    assert r["loss"] == study.Dropin(m, bs, step, measures=False).unit("local:window=4", "head", 2, 0)["loss"]
    # in training mode (dropout would draw) nothing is reused
    m.train()
    ran.clear()
    d.unit("local:window=4", "head", 2, 0)
    assert len(ran) == len(bs) * 3


class Counting(nn.Module):
    """A layer that changes an input in place (a counter the later layers read): never skipped."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, counter):
        counter.add_(1)
        return self.layer(x) + 0.01 * counter


class CountingStack(nn.Module):
    def __init__(self):
        super().__init__()
        base = Stacked()
        self.emb, self.out = base.emb, base.out
        self.layers = nn.ModuleList(Counting(layer) for layer in base.layers)

    def forward(self, idx):
        x, counter = self.emb(idx), torch.zeros(1, dtype=self.out.weight.dtype)
        for layer in self.layers:
            x = layer(x, counter)
        return self.out(x)


def test_layers_that_change_their_inputs_are_not_skipped():
    m, bs = CountingStack().double().eval(), batches()
    d = study.Dropin(m, bs, step, measures=False, reuse_layers=True)
    assert d._memo.blocks == {}   # each layer changed `counter` in place: none kept
    r = d.unit("local:window=4", "head", 2, 0)
    assert r == {**study.Dropin(m, bs, step, measures=False).unit("local:window=4", "head", 2, 0),
                 "time_s": r["time_s"]}


def test_units_skip_the_layers_of_a_transformer_encoder(monkeypatch):
    """The same on nn.TransformerEncoder (its layers: an nn.ModuleList of nn.TransformerEncoderLayer, attention
    through nn.MultiheadAttention): the rows with and without the layers' reuse are the same bits."""
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Embedding(30, 16), nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True), 3),
        nn.Linear(16, 30)).double().eval()
    ran = counted(monkeypatch, at, "_encoder_layer_forward")
    bs = batches()
    d = study.Dropin(enc, bs, step, measures=False, reuse_layers=True)
    assert len(d._memo.blocks) == 3 * 3
    rows, counts = with_and_without_reuse(
        d, [("performer:features=8", "head", 2, 1), ("local:window=4", "layer", 1, "")], ran)
    assert rows[True] == rows[False]
    assert counts[True] == len(bs) * (1 + 2) and counts[False] == len(bs) * 3 * 2
