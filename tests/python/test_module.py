"""The Python module against numpy: values, dtypes, shapes, no copies, errors, batches, the report.

Run by ctest (python.module) with PYTHONPATH=build/python and Debian's pytest.
"""
import csv
import os
import signal
import threading
import time

import numpy as np
import pytest

import attnlab


def softmax_attention(q, k, v, causal=False, scale=None):
    """Exact attention in float64, independently of attnlab."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.tril(np.ones((n_q, n_k), dtype=bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v, p


@pytest.fixture
def qkv():
    rng = np.random.default_rng(7)
    return tuple(rng.standard_normal((3, 200, 24)) for _ in range(3))


def test_exact_equals_numpy_batched_float64(qkv):
    q, k, v = qkv
    out = attnlab.apply("exact", q, k, v)
    ref, _ = softmax_attention(q, k, v)
    assert out.shape == (3, 200, 24) and out.dtype == np.float64
    assert np.max(np.abs(out - ref)) <= 1e-10


def test_exact_causal_scale_and_matrix(qkv):
    q, k, v = (x[0] for x in qkv)
    out, p = attnlab.apply("exact", q, k, v, causal=True, scale=0.3, matrix=True)
    ref, pref = softmax_attention(q, k, v, causal=True, scale=0.3)
    assert np.max(np.abs(out - ref)) <= 1e-10
    assert np.max(np.abs(p - pref)) <= 1e-12
    assert np.all(np.triu(p, 1) == 0)


def test_float32_stays_float32(qkv):
    q, k, v = (x.astype(np.float32) for x in qkv)
    out = attnlab.apply("exact", q, k, v)
    assert out.dtype == np.float32
    ref, _ = softmax_attention(q, k, v)
    assert np.max(np.abs(out - ref)) <= 1e-5
    out, p = attnlab.apply("nystrom:landmarks=16", q[0], k[0], v[0], matrix=True)
    assert out.dtype == np.float32 and p.dtype == np.float32
    np.testing.assert_allclose(out, p @ v[0], rtol=0, atol=1e-4)


def test_method_output_is_its_matrix_times_v(qkv):
    q, k, v = (x[0] for x in qkv)
    for spec in ["nystrom:landmarks=16", "linformer:k=32", "local:window=8", "performer:features=64", "vq:codes=16"]:
        out, p = attnlab.apply(spec, q, k, v, matrix=True)
        np.testing.assert_allclose(out, p @ v, rtol=0, atol=1e-10, err_msg=spec)


def test_exact_limits_through_the_module(qkv):
    q, k, v = (x[0] for x in qkv)
    ref, _ = softmax_attention(q, k, v)
    # Every query selected / every key a landmark: the exact limits.
    assert np.max(np.abs(attnlab.apply("probsparse:factor=1000", q, k, v) - ref)) <= 1e-9
    assert np.max(np.abs(attnlab.apply("local:window=400", q, k, v) - ref)) <= 1e-10


def test_contiguous_inputs_are_not_copied(qkv):
    q = qkv[0]
    assert attnlab._data_address(q) == q.ctypes.data
    assert attnlab._data_address(q[1]) == q[1].ctypes.data  # a C-contiguous view
    strided = q[:, ::2, :]
    assert not strided.flags.c_contiguous
    assert attnlab._data_address(strided) != strided.ctypes.data
    # Non-contiguous inputs still give the right answer (copied once).
    k, v = qkv[1][:, ::2, :], qkv[2][:, ::2, :]
    ref, _ = softmax_attention(strided, k, v)
    assert np.max(np.abs(attnlab.apply("exact", strided, k, v) - ref)) <= 1e-10
    fortran = np.asfortranarray(qkv[0][0])
    ref, _ = softmax_attention(fortran, qkv[1][0], qkv[2][0])
    assert np.max(np.abs(attnlab.apply("exact", fortran, qkv[1][0], qkv[2][0]) - ref)) <= 1e-10


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: attnlab.apply("nystrom:landmark=3", q, k, v), "has no parameter 'landmark'"),
        (lambda q, k, v: attnlab.apply("nystromm", q, k, v), "unknown method"),
        (lambda q, k, v: attnlab.apply("nystrom", q, k, v, causal=True), "cannot honour a causal mask"),
        (lambda q, k, v: attnlab.apply("linformer", q, k, v, causal=True), "cannot honour a causal mask"),
        (lambda q, k, v: attnlab.apply("exact", np.where(q > 2, np.nan, q), k, v), "q: has NaN"),
        (lambda q, k, v: attnlab.apply("exact", q, k * np.inf, v), "k: has NaN"),
        (lambda q, k, v: attnlab.apply("exact", q.astype(np.int64), k, v), "dtype int64 is not supported"),
        (lambda q, k, v: attnlab.apply("exact", q, k.astype(np.float32), v), "differs from q's"),
        (lambda q, k, v: attnlab.apply("exact", q[0], k, v), "all three as (n, d)"),
        (lambda q, k, v: attnlab.apply("exact", q, k[:, :, :5], v), "head dimensions differ"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v[:, :7]), "different lengths"),
        (lambda q, k, v: attnlab.apply("exact", q[0, 0], k, v), "expected (n, d) or (heads, n, d)"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v, scale=-1.0), "scale"),
        (lambda q, k, v: attnlab.spectrum(q, k, top=0), "top = 0 is out of range"),
        (lambda q, k, v: attnlab.compare(q, k, v, []), "empty list"),
        (lambda q, k, v: attnlab.generate("uniform", 10), "gaussian"),
    ],
)
def test_errors_are_value_errors_with_the_message(qkv, call, message):
    with pytest.raises(ValueError) as e:
        call(*qkv)
    assert message in str(e.value), str(e.value)


def test_torch_tensor_is_refused_with_the_fix():
    class FakeTensor:  # the duck type the module recognises (torch is not a dependency)
        def detach(self):
            return self

        def numpy(self):
            return np.zeros((2, 2))

    with pytest.raises(ValueError, match=r"detach\(\)\.cpu\(\)\.numpy\(\)"):
        attnlab.apply("exact", FakeTensor(), np.zeros((2, 2)), np.zeros((2, 2)))


def test_methods_lists_the_registry():
    ms = {m["name"]: m for m in attnlab.methods()}
    assert {"exact", "nystrom", "linformer", "performer", "vq", "probsparse", "local"} <= set(ms)
    assert ms["exact"]["causal"] and not ms["nystrom"]["causal"]
    lm = {p["name"]: p for p in ms["nystrom"]["params"]}
    assert lm["landmarks"]["default"] == "64" and "integer" in lm["landmarks"]["type"]
    assert all(m["reference"] for m in ms.values())


def test_compare_frame_against_numpy(qkv):
    q, k, v = (x[:2] for x in qkv)
    df = attnlab.compare(q, k, v, ["nystrom:landmarks=16", "local:window=8"])
    assert list(df["head"]) == [0, 0, 1, 1]
    assert set(df["method"]) == {"nystrom", "local"}
    for _, row in df.iterrows():
        out, p = attnlab.apply(row["spec"], q[row["head"]], k[row["head"]], v[row["head"]], matrix=True)
        ref, pref = softmax_attention(q[row["head"]], k[row["head"]], v[row["head"]])
        assert abs(row["out_rel_fro"] - np.linalg.norm(out - ref) / np.linalg.norm(ref)) <= 1e-9
        assert abs(row["P_rel_fro"] - np.linalg.norm(p - pref) / np.linalg.norm(pref)) <= 1e-9
        assert abs(row["P_rel_spectral"] - np.linalg.norm(p - pref, 2) / np.linalg.norm(pref, 2)) <= 1e-6
    records = attnlab.compare(q[0], k[0], v[0], ["local:window=8"], frame=False, matrix_metrics="off")
    assert isinstance(records, list) and "P_rel_fro" not in records[0]


def test_compare_all_causal_keeps_the_causal_methods(qkv):
    q, k, v = (x[0, :64] for x in qkv)
    df = attnlab.compare(q, k, v, causal=True, matrix_metrics="off")
    causal = {m["name"] for m in attnlab.methods() if m["causal"]}
    assert set(df["method"]) == causal


def test_spectrum_against_numpy(qkv):
    q, k = qkv[0][:2], qkv[1][:2]
    _, p = softmax_attention(q, k, q)
    ref = np.linalg.svd(p, compute_uv=False)
    full = attnlab.spectrum(q, k)
    assert full.shape == (2, 200)
    np.testing.assert_allclose(full, ref, rtol=0, atol=1e-12)
    top = attnlab.spectrum(q, k, top=5, solver="block")
    np.testing.assert_allclose(top, ref[:, :5], rtol=1e-8)


def test_generate_is_seeded_and_typed():
    a = attnlab.generate("clustered", 100, 16, seed=3)
    b = attnlab.generate("clustered", 100, 16, seed=3)
    c = attnlab.generate("clustered", 100, 16, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])
    q, k, v = attnlab.generate("lowrank", 50, 8, n_k=70, d_v=4, dtype="float32", rank=2)
    assert q.shape == (50, 8) and k.shape == (70, 8) and v.shape == (70, 4) and q.dtype == np.float32
    assert np.linalg.matrix_rank(q.astype(np.float64), tol=1e-4) == 2
    assert "gaussian" in attnlab.sources()


def test_gil_released_during_a_long_call():
    q, k, v = attnlab.generate("gaussian", 3000, 64)
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        before = len(ticks)
        attnlab.spectrum(q, k, top=8)  # seconds of C++ work
        during = len(ticks) - before
    finally:
        stop.set()
        t.join()
    assert during >= 5, "the other thread did not run: the GIL was held"


def test_ctrl_c_interrupts_a_long_call():
    q, k, v = attnlab.generate("gaussian", 6000, 64, seed=1)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in range(200):  # far longer than the timer, uninterrupted
            attnlab.spectrum(q, k, top=32, tol=1e-12)
    assert time.monotonic() - start < 20
    # The module works again afterwards, and Python's own handler is back.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert attnlab.apply("exact", q[:10], k[:10], v[:10]).shape == (10, 64)


def test_report_writes_html_csv_and_summary(tmp_path, qkv):
    rng = np.random.default_rng(1)
    # Two heads: a clustered one (low rank: methods do well) and a Gaussian one.
    cq, ck, cv = attnlab.generate("clustered", 256, 16, seed=2, centres=4)
    q = np.stack([cq, rng.standard_normal((256, 16))])
    k = np.stack([ck, rng.standard_normal((256, 16))])
    v = np.stack([cv, rng.standard_normal((256, 16))])
    index = attnlab.report(q, k, v, out=str(tmp_path / "rep"), families=["nystrom", "local", "performer"],
                           repeats=1, quiet=True)
    assert index.endswith("index.html") and os.path.exists(index)
    html = open(index, encoding="utf-8").read()
    assert html.count("<svg") >= 2 + 1 + 2  # two maps, a spectrum, a plot per head
    rows = list(csv.DictReader(open(tmp_path / "rep" / "report.csv")))
    errs = [r for r in rows if r["metric"] == "out_rel_fro"]
    assert {r["family"] for r in errs} == {"nystrom", "local", "performer"}
    # A row's error is the module's own compare of that spec on that head.
    r = next(r for r in errs if r["head"] == "0" and r["family"] == "nystrom" and r["budget"] == "32")
    df = attnlab.compare(q[0], k[0], v[0], [r["spec"]], matrix_metrics="off")
    assert abs(float(r["value"]) - df["out_rel_fro"][0]) <= 1e-12
    # Entropy against numpy.
    _, p = softmax_attention(q[1], k[1], v[1])
    ent = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=1).mean()
    e = next(r for r in rows if r["metric"] == "entropy" and r["head"] == "1")
    assert abs(float(e["value"]) - ent) <= 1e-10
    # Exactly one recommendation or none per head, and it is under the target.
    for h in ("0", "1"):
        rec = [r for r in rows if r["metric"] == "recommended" and r["head"] == h and r["value"] == "1"]
        assert len(rec) <= 1
        for rr in rec:
            err = next(x for x in errs if x["head"] == h and x["spec"] == rr["spec"])
            assert float(err["value"]) <= 0.05
    assert "Recommendations" in open(tmp_path / "rep" / "summary.md").read()
    with pytest.raises(ValueError, match="unknown family"):
        attnlab.report(q, k, v, out=str(tmp_path / "x"), families=["nope"], quiet=True)
    with pytest.raises(ValueError, match="target"):
        attnlab.report(q, k, v, out=str(tmp_path / "x"), target=-1, quiet=True)


def test_threads_setting_and_same_result():
    q, k, v = attnlab.generate("gaussian", 600, 16, seed=5)
    saved = attnlab.threads()
    try:
        attnlab.set_threads(1)
        assert attnlab.threads() == 1
        one = attnlab.apply("nystrom:landmarks=32", q, k, v)
        attnlab.set_threads(2)
        two = attnlab.apply("nystrom:landmarks=32", q, k, v)
        np.testing.assert_allclose(one, two, rtol=0, atol=1e-12)
        with pytest.raises(ValueError, match="must be"):
            attnlab.set_threads(0)
    finally:
        attnlab.set_threads(saved)


def test_report_command_on_npy_files(tmp_path):
    """`attnlab report --q Q.npy --k K.npy --v V.npy --out DIR`: the command's path to the same report."""
    import subprocess
    binary = os.environ.get("ATTNLAB_BIN")
    if not binary:
        pytest.skip("ATTNLAB_BIN not set (ctest sets it)")
    q, k, v = attnlab.generate("clustered", 192, 16, seed=4, centres=4)
    files = {}
    for name, a in zip("qkv", (q, k, v)):
        files[name] = str(tmp_path / f"{name}.npy")
        np.save(files[name], np.stack([a, a[::-1].copy()]).astype(np.float32))  # (2, n, d), float32
    out = tmp_path / "rep"
    r = subprocess.run([binary, "report", "--q", files["q"], "--k", files["k"], "--v", files["v"], "--out", str(out),
                        "--families", "local,nystrom", "--repeats", "1", "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[2/2] input head 1" in r.stderr  # progress per head
    html = (out / "index.html").read_text(encoding="utf-8")
    assert html.count("<svg") >= 2 + 1 + 2 and "Pareto" in html
    rows = list(csv.DictReader(open(out / "report.csv")))
    assert {r["head"] for r in rows} == {"0", "1"}
    assert {r["family"] for r in rows if r["metric"] == "out_rel_fro"} == {"local", "nystrom"}
    assert (out / "summary.md").read_text(encoding="utf-8").startswith("# attnlab report")
    # A mismatched file is refused with a message, not a crash.
    np.save(files["v"], np.zeros((2, 100, 16), dtype=np.float32))
    bad = subprocess.run([binary, "report", "--q", files["q"], "--k", files["k"], "--v", files["v"], "--out",
                          str(tmp_path / "bad")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "v" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
