"""The Python module against numpy: values, dtypes, shapes, no copies, errors, batches, the report.

Run by ctest (python.module) with PYTHONPATH=build/python and Debian's pytest.
"""
import csv
import os

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
        (lambda q, k, v: attnlab.apply("nystromm", q, k, v), "'nystromm'"),
        (lambda q, k, v: attnlab.apply("nystrom", q, k, v, causal=True), "cannot honour a causal mask"),
        (lambda q, k, v: attnlab.apply("linformer", q, k, v, causal=True), "cannot honour a causal mask"),
        (lambda q, k, v: attnlab.apply("exact", np.where(q > 2, np.nan, q), k, v), "q: has NaN"),
        (lambda q, k, v: attnlab.apply("exact", q, k * np.inf, v), "k: has NaN"),
        (lambda q, k, v: attnlab.apply("exact", q.astype(np.int64), k, v), "dtype int64 is not supported"),
        (lambda q, k, v: attnlab.apply("exact", q, k.astype(np.float32), v), "(q float64, k float32, v float64)"),
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
    assert list(df["head_index"]) == [0, 0, 1, 1]
    assert set(df["method"]) == {"nystrom", "local"}
    for _, row in df.iterrows():
        h = row["head_index"]
        out, p = attnlab.apply(row["spec"], q[h], k[h], v[h], matrix=True)
        ref, pref = softmax_attention(q[h], k[h], v[h])
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


def test_gil_released_during_a_long_call(ticking):
    q, k, v = attnlab.generate("gaussian", 3000, 64)
    with ticking() as ticks:
        before = len(ticks)
        attnlab.spectrum(q, k, top=8)  # seconds of C++ work
        during = len(ticks) - before
    assert during >= 5, "the other thread did not run: the GIL was held"


def test_ctrl_c_interrupts_a_long_call(ctrl_c):
    q, k, v = attnlab.generate("gaussian", 6000, 64, seed=1)
    with ctrl_c(within=20):  # and Python's own handler is back afterwards
        for _ in range(200):  # far longer than the timer, uninterrupted
            attnlab.spectrum(q, k, top=32, tol=1e-12)
    # The module works again afterwards.
    assert attnlab.apply("exact", q[:10], k[:10], v[:10]).shape == (10, 64)


def test_ctrl_c_interrupts_the_timed_calls_of_compare(ctrl_c):
    # Inside the cost harness an interruption is a refused cost; it must still reach Python as KeyboardInterrupt.
    q, k, v = attnlab.generate("gaussian", 2000, 32, seed=1)
    with ctrl_c():
        attnlab.compare(q, k, v, "nystrom:landmarks=16", matrix_metrics="off", repeats=100000)


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
    # exact_peer= (the command's --exact-peer): a peer 4× faster than attnlab's exact on this CPU at one thread —
    # the speed-ups are over it, named; a file of another CPU is refused.
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               "unknown CPU")
    saved = attnlab.threads()
    attnlab.set_threads(1)
    kernels = attnlab.cost(q[0], k[0], v[0], "exact", repeats=1, memory=False)["context"].split(" ", 1)[1]
    attnlab.set_threads(saved)
    for name, device in (("peer.csv", cpu), ("other.csv", "Other CPU")):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["impl", "build", "dtype", "n", "d", "threads", "time_s", "device", "detail"])
            for n_ in (128, 512):
                w.writerow(["attnlab", "default", "fp32", n_, 16, 1, 4e-3, device, f"attnlab default: {kernels}"])
                w.writerow(["PyTorch SDPA", "", "fp32", n_, 16, 1, 1e-3, device, "torch 9.9"])
    attnlab.report(q, k, v, out=str(tmp_path / "peer"), families=["local"], repeats=1, quiet=True, threads=1,
                   exact_peer=str(tmp_path / "peer.csv"))
    rows = list(csv.DictReader(open(tmp_path / "peer" / "report.csv")))
    base = {r["head"]: float(r["value"]) for r in rows if r["metric"] == "baseline_time_s"}
    exact = {r["head"]: float(r["value"]) for r in rows if r["metric"] == "time_s" and r["spec"] == "exact"}
    assert set(base) == {"0", "1"} and all(abs(base[h] * 4 - exact[h]) <= 1e-12 * exact[h] for h in base)
    assert "over PyTorch SDPA" in open(tmp_path / "peer" / "summary.md", encoding="utf-8").read()
    with pytest.raises(ValueError, match="this CPU is"):
        attnlab.report(q, k, v, out=str(tmp_path / "x"), families=["local"], quiet=True, threads=1,
                       exact_peer=str(tmp_path / "other.csv"))


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


# ---- the first hour of a new user (issue 20) ---------------------------------------------------------------------

def test_torch_cpu_tensors_are_read_in_place():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    for dt, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        q, k, v = (torch.randn(2, 50, 8, generator=g, dtype=dt) for _ in range(3))
        assert attnlab._data_address(q) == q.data_ptr()  # no copy: numpy shares the tensor's memory
        out = attnlab.apply("exact", q, k, v)
        assert out.dtype == (np.float64 if dt == torch.float64 else np.float32)
        ref, _ = softmax_attention(q.numpy(), k.numpy(), v.numpy())
        assert np.max(np.abs(out - ref)) <= tol
    # A non-contiguous tensor (a transpose) is copied once, like a strided numpy array, and gives the right answer.
    qt = torch.randn(8, 50, generator=g, dtype=torch.float64).t()
    assert not qt.is_contiguous()
    kk, vv = (torch.randn(50, 8, generator=g, dtype=torch.float64) for _ in range(2))
    ref, _ = softmax_attention(qt.numpy(), kk.numpy(), vv.numpy())
    assert np.max(np.abs(attnlab.apply("exact", qt, kk, vv) - ref)) <= 1e-10
    # Autograd: refused while on (arrays are outside the graph; the message names the differentiable path), read in
    # place under torch.no_grad().
    leaf = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError) as e:
        attnlab.apply("exact", leaf, kk, vv)
    assert "q: a tensor that requires grad; call q.detach() or run under torch.no_grad()" in str(e.value)
    assert "attnlab.torch.attention" in str(e.value) and len(str(e.value)) < 300
    with torch.no_grad():
        assert attnlab._data_address(leaf) == leaf.data_ptr()
        np.testing.assert_array_equal(attnlab.apply("exact", leaf, kk, vv),
                                      attnlab.apply("exact", leaf.detach(), kk, vv))
    # Other dtypes: what is wrong and what is accepted.
    with pytest.raises(ValueError, match=r"q: dtype float16 is not supported; give float32 or float64"):
        attnlab.apply("exact", kk.half(), kk, vv)
    with pytest.raises(ValueError, match=r"q: cannot be read as an array .*BFloat16.*float32 or float64"):
        attnlab.apply("exact", kk.bfloat16(), kk, vv)
    # An explicit compute dtype converts them (a copy).
    assert attnlab.apply("exact", kk.half(), kk, vv, dtype=torch.float32).dtype == np.float32


def test_buffer_protocol_and_array_interface_inputs():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((40, 8)) for _ in range(3))

    class ArrayLike:  # only __array__, as pandas, xarray and others expose
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None):
            return self.a

    ref = attnlab.apply("exact", q, k, v)
    np.testing.assert_array_equal(attnlab.apply("exact", memoryview(q), ArrayLike(k), v), ref)
    assert attnlab._data_address(memoryview(q)) == q.ctypes.data
    assert attnlab._data_address(ArrayLike(q)) == q.ctypes.data


SHORT = 300  # an error message is one short line: what was wrong and what is valid, never the arrays


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: attnlab.apply("exact", q, k, v, seed=-1), "seed must be a non-negative integer, got -1"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v, seed=1.5), "seed must be a non-negative integer"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v, seed=np.array([1, 2])), "ndarray of shape (2,)"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v, seed=2**64), "seed must be below 2**64"),
        (lambda q, k, v: attnlab.compare(q, k, v, seed=-3), "seed must be a non-negative integer, got -3"),
        (lambda q, k, v: attnlab.apply(["nystrom"], q, k, v), "spec must be a string"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v, causal="yes"), "causal must be True or False"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v, scale="1"), "scale must be a number or None"),
        (lambda q, k, v: attnlab.compare(q, k, v, 3), "methods must be a string"),
        (lambda q, k, v: attnlab.compare(q, k, v, ["nystrom", 3]), "every entry must be a string"),
        (lambda q, k, v: attnlab.compare(q, k, v, repeats=0), "repeats must be an integer ≥ 1, got 0"),
        (lambda q, k, v: attnlab.compare(q, k, v, warmup=-1), "warmup must be a non-negative integer"),
        (lambda q, k, v: attnlab.cost(q, k, v, "exact", repeats=2.0), "repeats must be an integer ≥ 1"),
        (lambda q, k, v: attnlab.spectrum(q, k, top="5"), "top must be an integer or None"),
        (lambda q, k, v: attnlab.apply("exact", q, k, v, dtype="float16"), "dtype must be 'float32' or 'float64'"),
        (lambda q, k, v: attnlab.apply("exact", None, k, v), "q: an array is required"),
        (lambda q, k, v: attnlab.apply("exact", q, [[1.0, 2.0], [3.0]], v), "k: cannot be read as an array"),
        (lambda q, k, v: attnlab.generate("gaussian", n=-5), "n must be an integer ≥ 1"),
        (lambda q, k, v: attnlab.set_threads("2"), "n must be an integer ≥ 1"),
    ],
)
def test_argument_errors_are_one_short_line(qkv, call, message):
    with pytest.raises(ValueError) as e:
        call(*qkv)
    text = str(e.value)
    assert message in text, text
    assert len(text) < SHORT and "\n" not in text and "array(" not in text, text


def test_python_signature_errors_are_short(qkv):
    # Python's own TypeError for a misspelt keyword or a missing argument, not pybind11's (which printed the arrays).
    for call in (lambda q, k, v: attnlab.apply("exact", q, k, v, seeds=1),
                 lambda q, k, v: attnlab.compare(q, k),
                 lambda q, k, v: attnlab.apply("exact", q, k, v, False)):
        with pytest.raises(TypeError) as e:
            call(*qkv)
        assert len(str(e.value)) < SHORT and "array(" not in str(e.value), str(e.value)


def test_compare_takes_one_spec_string(qkv):
    q, k, v = (x[0] for x in qkv)
    one = attnlab.compare(q, k, v, "nystrom:landmarks=16", matrix_metrics="off", repeats=1)
    assert list(one["spec"]) == list(attnlab.compare(q, k, v, ["nystrom:landmarks=16"], matrix_metrics="off",
                                                     repeats=1)["spec"])
    assert len(one) == 1 and one["method"][0] == "nystrom"


def test_library_errors_keep_the_library_message(qkv):
    """attnlab::Error arrives as ValueError with the library's text unchanged: the command prints the same."""
    import subprocess
    binary = os.environ.get("ATTNLAB_BIN")
    if not binary:
        pytest.skip("ATTNLAB_BIN not set (ctest sets it)")
    for spec in ("nystrom:landmark=3", "nystromm", "nystrom:landmarks=x", "exact:impl=nope"):
        with pytest.raises(ValueError) as e:
            attnlab.apply(spec, *qkv)
        r = subprocess.run([binary, "compare", "--method", spec, "--n", "16", "--d", "4"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and str(e.value) in r.stderr, (str(e.value), r.stderr)


def test_a_misspelt_method_name_gets_a_suggestion(qkv):
    with pytest.raises(ValueError) as e:
        attnlab.apply("Nystrom", *qkv)
    assert "did you mean nystrom" in str(e.value), str(e.value)
    assert len(str(e.value)) < SHORT


THREADS_PROBE = """
import sys
order = sys.argv[1]
if order == "torch-first":
    import torch
import attnlab
if order == "torch-after":
    import torch
before = attnlab._omp_max_threads()  # the calling thread's OpenMP setting (PyTorch's, once imported)
attnlab.apply("exact", *attnlab.generate("gaussian", 64, 8))
context = attnlab.cost(*attnlab.generate("gaussian", 64, 8), "exact", repeats=1, memory=False)["context"]
print(attnlab.threads(), context.split()[0], before == attnlab._omp_max_threads())
"""


def test_importing_torch_leaves_the_module_threads_alone():
    import subprocess
    import sys
    pytest.importorskip("torch")
    runs = {}
    for order in ("no-torch", "torch-first", "torch-after"):
        r = subprocess.run([sys.executable, "-c", THREADS_PROBE, order], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        runs[order] = r.stdout.split()
    threads, context, restored = runs["no-torch"]
    assert context == f"threads={threads}"  # the calls ran on threads()
    for order in ("torch-first", "torch-after"):
        assert runs[order] == [threads, context, "True"], (order, runs)


def test_no_column_hides_a_dataframe_attribute():
    pd = pytest.importorskip("pandas")
    q, k, v = attnlab.generate("clustered", 256, 8, seed=1)
    df = attnlab.compare(q, k, v, repeats=1, warmup=0)  # every method: every diagnostic column
    hidden = set(df.columns) & set(dir(pd.DataFrame))
    assert not hidden, hidden
    assert "head_index" in df.columns and callable(df.head)


def test_non_finite_outputs_are_refused():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((30, 4)) for _ in range(3))
    huge = q * 1e300  # finite inputs whose scores overflow
    assert np.all(np.isfinite(huge))
    for call in (lambda: attnlab.apply("exact", huge, k * 1e300, v),
                 lambda: attnlab.apply("exact", huge, k * 1e300, v, matrix=True),
                 lambda: attnlab.compare(huge, k * 1e300, v, "local:window=4", repeats=1),
                 lambda: attnlab.spectrum(huge, k * 1e300),
                 lambda: attnlab.spectrum(huge, k * 1e300, top=3)):
        with pytest.raises(ValueError, match="non-finite values") as e:
            call()
        assert len(str(e.value)) < SHORT
    # Non-finite inputs: refused before the work, naming the array.
    with pytest.raises(ValueError, match="^v: has NaN or infinite values"):
        attnlab.apply("exact", q, k, np.where(v > 1, np.inf, v))
    with pytest.raises(ValueError, match="^k: has NaN or infinite values"):
        attnlab.cost(q, np.where(k > 1, np.nan, k), v, "exact")


def test_mixed_dtypes_one_rule():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((30, 4)) for _ in range(3))
    k32 = k.astype(np.float32)
    with pytest.raises(ValueError) as e:
        attnlab.apply("exact", q, k32, v)
    assert "(q float64, k float32, v float64)" in str(e.value) and "dtype=" in str(e.value)
    with pytest.raises(ValueError, match=r"\(q float64, k float32\)"):
        attnlab.spectrum(q, k32)
    # An explicit compute dtype: every input converted to it, the output in it.
    for dt, want in (("float32", np.float32), (np.float64, np.float64), (np.dtype("float32"), np.float32)):
        out = attnlab.apply("exact", q, k32, v, dtype=dt)
        assert out.dtype == want
        ref = attnlab.apply("exact", *(x.astype(want) for x in (q, k32, v)))
        np.testing.assert_array_equal(out, ref)
    df = attnlab.compare(q, k32, v, "local:window=4", dtype="float32", repeats=1)
    assert df["dtype"][0] == "float32"
    # Converting an input of the compute dtype does not copy it.
    assert attnlab._data_address(q, dtype="float64") == q.ctypes.data


def test_compare_costs_by_the_harness(qkv):
    q, k, v = (x[0] for x in qkv)
    df = attnlab.compare(q, k, v, ["nystrom:landmarks=16", "local:window=8"], matrix_metrics="off", repeats=3,
                         warmup=2)
    for _, r in df.iterrows():
        assert 0 < r["time_s"] <= r["time_median_s"]
        assert r["exact_time_s"] > 0
        assert r["speedup"] == pytest.approx(r["exact_time_s"] / r["time_s"], rel=1e-12)  # exact / method


def test_cost_dict(qkv):
    q, k, v = (x[0] for x in qkv)
    c = attnlab.cost(q, k, v, "nystrom:landmarks=16", repeats=4, warmup=1)
    assert set(c) == {"spec", "min_s", "median_s", "max_s", "repeats", "warmup", "peak_bytes", "context"}
    assert 0 < c["min_s"] <= c["median_s"] <= c["max_s"]
    assert c["repeats"] == 4 and c["warmup"] == 1
    assert isinstance(c["peak_bytes"], int) and c["peak_bytes"] >= 0
    assert c["spec"].startswith("nystrom:") and "landmarks=16" in c["spec"]
    assert c["context"].startswith(f"threads={attnlab.threads()} ")
    assert attnlab.cost(q, k, v, "exact", repeats=1, memory=False)["peak_bytes"] is None
    # (heads, n, d): one call running every head.
    batched = attnlab.cost(*qkv, "local:window=8", repeats=2, memory=False, causal=True)
    assert batched["repeats"] == 2 and batched["min_s"] > 0
    with pytest.raises(ValueError, match="cannot honour a causal mask"):
        attnlab.cost(q, k, v, "nystrom", causal=True)
    with pytest.raises(ValueError, match="'nystromm'"):
        attnlab.cost(q, k, v, "nystromm")


# Was a bug: an unknown dtype name became None, and numpy's np.dtype('float64') == None is True, so "bfloat16",
# "bf16", torch.bfloat16 and the typo "fp32" were accepted and computed in float64.
@pytest.mark.parametrize("dtype", ["bfloat16", "bf16", "fp32", "float16", "half", "torch.bfloat16", "int32",
                                   "nonsense"])
def test_unknown_or_unsupported_dtypes_are_refused(dtype):
    q = np.ones((4, 2))
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'float64'"):
        attnlab.apply("exact", q, q, q, dtype=dtype)
    for ok, want in (("float32", np.float32), ("float64", np.float64), (np.float32, np.float32)):
        assert attnlab.apply("exact", q, q, q, dtype=ok).dtype == want
