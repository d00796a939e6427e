"""tools/finetune.py: fine-tuning the committed trained models through attnlab's backward (Debian's torch; a few
seconds per test: 2 held-out windows, 2-3 steps, one family)."""
import csv
import gzip
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dropin  # noqa: E402
import finetune  # noqa: E402

SMALL = ["--windows", "2", "--steps", "1", "--evals", "1", "--quiet"]


_runs = {}


def small_run(objective):
    """A model's run of 3 steps on 2 held-out windows, built once for the module's tests."""
    if objective not in _runs:
        _runs[objective] = finetune.Run(objective, finetune.parse_args(["--models", objective, "--windows", "2",
                                                                        "--steps", "3", "--evals", "3"]))
    return _runs[objective]


@pytest.mark.parametrize("objective,spec", [("mlm", "performer"), ("causal", "local:window=16")])
def test_step_zero_is_the_dropin_loss(objective, spec):
    """Before training, the float32 swapped model's held-out loss is the drop-in experiment's float64 loss for the
    same windows, masks and random draws (seed + layer): a random method on the masked-LM, a sparse one causal."""
    run = small_run(objective)
    sums = torch.cat(finetune.study.Run(run.model(), spec, 0).evaluate(run.eval_batches, dropin.step).sums)
    loss, se = dropin.pooled_windows(sums, run.n_w)
    d = dropin.Model(objective, 2).study(measures=False)
    (row,) = dropin.unit_rows(d, spec, "all")
    assert abs(loss - row["loss"]) <= 1e-5 * row["loss"] and abs(se - row["loss_se"]) <= 1e-5 * row["loss_se"]
    assert loss > d.baseline["loss"] + 0.01   # the swap costs something: the check is not vacuous


def test_training_through_attnlab_equals_training_through_torch():
    """Fine-tuning with attnlab's exact attention (its own backward, FlashAttention-2's Algorithm 2) follows the same
    trajectory as with the model's own softmax attention through PyTorch's autograd, step for step, to float32
    rounding: the autograd path end to end (the same batches, the same optimizer)."""
    run = small_run("causal")
    ours, _, s1 = run.finetune("exact")
    theirs, _, s2 = run.finetune("torch")
    assert s1 == s2 == "ok" and sorted(ours) == sorted(theirs) == [0, 1, 2, 3]
    for step in ours:
        a, b = ours[step][0], theirs[step][0]
        assert float((a - b).abs().max()) <= 2e-5 * float(b.abs().max()), step
    assert float((ours[3][0] - ours[0][0]).abs().max()) > 1e-2   # training moved the weights


def rows(path):
    with gzip.open(path, "rt") as f:
        return list(csv.DictReader(f))


def test_an_interrupted_run_continues_where_it_stopped(tmp_path, monkeypatch):
    out = str(tmp_path / "ft.csv.gz")
    argv = ["--models", "causal", "--families", "local", "--out", out] + SMALL
    calls = []
    real = finetune.Run.finetune

    def interrupted(self, spec):
        calls.append(spec)
        if len(calls) == 3:   # the controls are done; the third unit is interrupted
            raise KeyboardInterrupt
        return real(self, spec)

    monkeypatch.setattr(finetune.Run, "finetune", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune.main(argv)
    partial = open(out + ".partial").read()
    assert partial.startswith("# finetune ") and len(partial.splitlines()) == 2 + 2 * 2   # headers, 2 units × 2
    with open(out + ".partial", "a") as f:
        f.write("0.1,causal,next-byte,local,torn")   # a line torn by the interrupt: dropped, not kept
    calls.clear()
    monkeypatch.setattr(finetune.Run, "finetune", lambda self, spec: calls.append(spec) or real(self, spec))
    assert finetune.main(argv) == 0
    assert calls == ["local:window=64"]   # only the unfinished unit ran again
    got = rows(out)
    assert [(r["family"], r["step"]) for r in got] == [(f, s) for f in ("exact", "torch", "local") for s in "01"]
    assert not os.path.exists(out + ".partial") and os.path.exists(out + ".config")
    by = {(r["family"], r["step"]): r for r in got}
    # every row holds its gap to the exact control at the same step, the torch control's within rounding of zero
    assert float(by["exact", "1"]["gap"]) == 0.0 and abs(float(by["torch", "1"]["gap"])) < 1e-4
    assert float(by["local", "1"]["time_ratio_exact"]) > 0 and by["local", "0"]["budget"] == "64"


def test_units_in_worker_processes_give_the_rows_of_one_process(tmp_path):
    """--jobs 2: the units trained by two spawned processes give the rows one process gives (every value but the
    times); the .config says how the times were taken. Both runs are commands: a command pins torch's kernels
    before importing it (this test process imported it first)."""
    argv = ["--models", "causal", "--families", "local", "--threads", "1"] + SMALL
    one, two = str(tmp_path / "one.csv.gz"), str(tmp_path / "two.csv.gz")
    for jobs, out in (("1", one), ("2", two)):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "finetune.py")] + argv + ["--jobs", jobs, "--out",
                                                                                               out], check=True)

    def values(path):
        return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows(path)]

    assert len(values(one)) == 3 * 2 and values(two) == values(one)
    import json
    from figures.data import timed_on
    assert json.load(open(two + ".config"))["jobs"] == 2
    assert timed_on(str(tmp_path)) == "threads not recorded"   # no finetune.csv.gz.config there
    os.replace(two + ".config", str(tmp_path / "finetune.csv.gz.config"))
    assert timed_on(str(tmp_path)) == "1 thread a process, 2 processes training side by side"


def test_a_diverging_run_is_an_outcome(monkeypatch):
    """A non-finite training loss stops the run with a status; the steps after it have no held-out loss."""
    run = small_run("causal")
    real = finetune.ta.loss_of
    count = []

    def poisoned(model, batch):
        count.append(1)
        loss = real(model, batch)
        return loss * float("nan") if len(count) == 2 else loss

    monkeypatch.setattr(finetune.ta, "loss_of", poisoned)
    evals, times, status = run.finetune("local:window=16")
    assert status.startswith("diverged at step 2") and sorted(evals) == [0, 1] and len(times) == 1
    rows_ = finetune.rows_of(run, "local", "local:window=16", "16", evals, times, status, 1.0)
    assert [r.get("heldout_loss") is None for r in rows_] == [False, False, True, True]
    assert all(r["status"] == status for r in rows_)


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--windows", "1"], "--windows must be at least 2"),
    (["--batch", "3", "--micro-batch", "2"], "not a multiple"),
    (["--evals", "5", "--steps", "4"], "more than --steps"),
    (["--lr", "2"], "--lr must be in (0, 1)"),
    (["--models", "gpt"], "--models"),
    (["--families", "nystrom,bogus", "--models", "mlm"], "finetune: unknown family ['bogus']"),
])
def test_bad_arguments_exit_with_a_message(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        finetune.main(argv + ["--out", str(tmp_path / "x.csv.gz")])
    assert e.value.code not in (0, None)
    assert message in str(e.value.code) + capsys.readouterr().err
    assert not os.listdir(tmp_path)   # refused before any work


def test_the_command_line_exits_non_zero():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "finetune.py"), "--families", "bogus"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode != 0 and "unknown family" in r.stderr
