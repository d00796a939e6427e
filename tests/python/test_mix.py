"""attnlab.mix (the report's choices as a mix; the greedy choice under a model-level loss target) and
tools/model_report.py on the committed report."""
import csv
import os
import subprocess
import sys

import pytest

from attnlab import mix

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
REPORT = os.path.join(ROOT, "results", "report")


def synthetic():
    """Three heads; candidates with known times and a known additive loss per (head, spec)."""
    def cand(spec, t, pareto=1, speedup=None):
        return {"spec": spec, "family": spec.split(":")[0], "budget": 1.0, "error": 0.1, "time_s": t,
                "speedup": speedup if speedup is not None else 1.0 / t, "pareto": pareto, "recommended": 0}
    report = {
        (0, 0): {"exact_time_s": 1.0, "candidates": [cand("a", 0.1), cand("b", 0.3), cand("c", 0.05, pareto=0)]},
        (0, 1): {"exact_time_s": 1.0, "candidates": [cand("a", 0.2), cand("b", 0.5)]},
        (1, 0): {"exact_time_s": 1.0, "candidates": [cand("a", 0.95, speedup=1.05)]},   # within the noise
    }
    cost = {((0, 0), "a"): 0.04, ((0, 0), "b"): 0.01, ((0, 1), "a"): 0.03, ((0, 1), "b"): 0.02,
            ((1, 0), "a"): 0.0}
    return report, cost


def test_greedy_keeps_the_whole_mix_within_the_target():
    report, cost = synthetic()
    calls = []

    def loss(m):
        calls.append(dict(m))
        return sum(cost[(k, s)] for k, s in m.items())

    chosen, steps = mix.choose_under_loss_target(report, loss, 0.05, noise=0.1)
    # head (0,0) saves most with "a" (0.9 s) and goes first: "a" (0.04) fits; then (0,1): "a" would make 0.07, "b" 0.06:
    # neither fits, so it stays exact; (1,0)'s only candidate is within the timing noise of exact: never tried;
    # the non-Pareto "c" is never tried either.
    assert chosen == {(0, 0): "a"}
    assert [(s["layer"], s["head"], s["spec"], s["kept"]) for s in steps] == [
        (0, 0, "a", True), (0, 1, "a", False), (0, 1, "b", False)]
    assert loss(chosen) <= 0.05
    # the margin: with a standard error, a trial is kept only when increase + z·se is within the target; then
    # (0,0)'s cheapest "a" (0.04 + 0.0164) no longer fits, its next "b" (0.01) does, and (0,1)'s "b" fits beside it
    chosen, _ = mix.choose_under_loss_target(report, lambda m: (loss(m), 0.01), 0.05, z=1.64)
    assert chosen == {(0, 0): "b", (0, 1): "b"}
    chosen, _ = mix.choose_under_loss_target(report, lambda m: (loss(m), 0.001), 0.05, z=1.64)
    assert chosen == {(0, 0): "a"}
    with pytest.raises(ValueError, match="> 0"):
        mix.choose_under_loss_target(report, loss, 0.0)


def test_swap_spec_and_speedup():
    report, _ = synthetic()
    assert mix.mix_to_swap_spec({(0, 1): "a", (1, 0): "b"}, 2) == {0: [None, "a"], 1: ["b", None]}
    with pytest.raises(ValueError):
        mix.mix_to_swap_spec({(0, 2): "a"}, 2)
    assert mix.attention_speedup(report, {}) == pytest.approx(1.0)
    assert mix.attention_speedup(report, {(0, 0): "a"}) == pytest.approx(3.0 / 2.1)


def test_committed_report_reads_and_its_recommendation_is_the_reports():
    if not os.path.exists(os.path.join(REPORT, "report.csv")):
        pytest.skip("no committed report")
    r = mix.read_report(REPORT)
    assert len(r) == 16 and all(h["exact_time_s"] > 0 and h["candidates"] for h in r.values())
    rec = mix.recommended(r)
    with open(os.path.join(REPORT, "report.csv")) as f:
        want = {(int(x["layer"][1:]), int(x["head"])): x["spec"] for x in csv.DictReader(f)
                if x["metric"] == "recommended" and float(x["value"]) == 1}
    assert rec == want
    with pytest.raises(ValueError, match="does not exist"):
        mix.read_report(os.path.join(REPORT, "nothing.csv"))


def test_model_report_runs_on_the_committed_report(tmp_path):
    if not os.path.exists(os.path.join(REPORT, "report.csv")):
        pytest.skip("no committed report")
    pytest.importorskip("torch")
    env = dict(os.environ)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "model_report.py"), "--report", REPORT,
                        "--windows", "3", "--loss-target", "0.5", "--out", str(tmp_path), "--quiet"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    with open(tmp_path / "model_check.csv") as f:
        rows = {x["choice"]: x for x in csv.DictReader(f)}
    assert set(rows) == {"per-head target", "loss target"}
    assert int(rows["loss target"]["heads_swapped"]) >= int(rows["per-head target"]["heads_swapped"]) >= 0
    assert (tmp_path / "model.md").read_text().count("| L") == 16
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "model_report.py"), "--report", REPORT,
                          "--loss-target", "-1"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode != 0 and "loss-target" in bad.stderr


def test_check_report_on_a_pytorch_model(tmp_path):
    """attnlab.torch.check_report: a user's nn.TransformerEncoder, its captured heads' report, its own loss."""
    torch = pytest.importorskip("torch")
    import attnlab.torch as at
    exe = os.environ.get("ATTNLAB_BIN")
    if not exe:
        pytest.skip("ATTNLAB_BIN (the attnlab command) not set")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2).double().eval()
    x = torch.randn(6, 96, 32, dtype=torch.float64)
    target = torch.randn(6, 96, 32, dtype=torch.float64)
    with torch.no_grad(), at.capture(enc) as cap:
        enc(x[:1])
    cap.save(str(tmp_path / "export"))
    r = subprocess.run([exe, "report", "--model-dir", str(tmp_path / "export"), "--out", str(tmp_path / "rep"),
                        "--families", "local", "--cost-n", "2048", "--repeats", "1", "--target", "0.5"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-1000:]

    def loss():   # per-example losses: the increase gets a paired standard error
        return ((enc(x) - target) ** 2).mean(dim=(1, 2))

    rep = mix.read_report(str(tmp_path / "rep"))
    got = at.check_report(enc, str(tmp_path / "rep"), loss, loss_target=1e-3)
    assert got["per-head target"]["mix"] == mix.recommended(rep)
    assert got["exact"].shape == (6,)
    kept = [s for s in got["loss target"]["steps"] if s["kept"]]
    assert all(s["loss_increase"] + 1.64 * s["se"] <= 1e-3 for s in kept)
    if kept:   # the final mix is the last kept trial's: the same losses, measured again
        assert got["loss target"]["increase"] == pytest.approx(kept[-1]["loss_increase"], abs=1e-12)
    else:
        assert got["loss target"]["mix"] == {} and got["loss target"]["increase"] == 0.0
    # an empty mix is the model itself
    none = at.check_report(enc, {k: {"exact_time_s": 1.0, "candidates": []} for k in rep}, loss)
    assert none["per-head target"]["increase"] == 0.0 and none["per-head target"]["heads"] == 0
    with pytest.raises(ValueError, match="report of this model"):
        at.check_report(enc, {(5, 0): {"exact_time_s": 1.0, "candidates": []}}, loss)
