"""attnlab.Method: fit once on (Q, K), apply to many V; the operator, the matrix, diagnostics, spectrum; errors.

Run by ctest (python.module, with the rest of tests/python) with PYTHONPATH=build/python and Debian's pytest.
"""
import pydoc
import threading

import numpy as np
import pytest

import attnlab

# Methods with a random part (their seed), and deterministic ones; all of them (n, d) and (heads, n, d).
SPECS = ["exact", "nystrom:landmarks=16", "performer:features=64", "local:window=8", "linformer:k=32",
         "vq:codes=16", "probsparse", "sparse", "reformer", "scatterbrain:features=32", "svd:rank=8",
         "cur:columns=16", "linear", "taylor", "efficient"]


def softmax(q, k, causal=False, scale=None):
    """Exact attention's P in float64, independently of attnlab."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.tril(np.ones((n_q, n_k), dtype=bool), n_k - n_q), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


@pytest.fixture
def qkv():
    rng = np.random.default_rng(11)
    return tuple(rng.standard_normal((128, 16)) for _ in range(3))


@pytest.fixture
def batched():
    rng = np.random.default_rng(12)
    return tuple(rng.standard_normal((3, 96, 8)) for _ in range(3))


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


# ---- fit once, apply to many V -----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS)
def test_one_fit_many_v_equals_refitting_and_apply(spec, qkv):
    q, k, _ = qkv
    rng = np.random.default_rng(3)
    vs = [rng.standard_normal((128, c)) for c in (16, 1, 5)]
    m = attnlab.Method(spec).fit(q, k)
    for v in vs:
        once = m.output(v)
        fresh = attnlab.Method(spec).fit(q, k).output(v)
        np.testing.assert_array_equal(once, fresh, err_msg=spec)
        np.testing.assert_array_equal(once, attnlab.apply(spec, q, k, v), err_msg=spec)
        # The compiled core's own apply (the module's path before Method): the same numbers.
        if hasattr(attnlab._core, "apply"):
            np.testing.assert_array_equal(once, attnlab._core.apply(spec, q, k, v, False, None, None, False),
                                          err_msg=spec)


@pytest.mark.parametrize("spec", ["exact", "nystrom:landmarks=16", "performer:features=32", "local:window=8",
                                  "vq:codes=8", "reformer"])
def test_batched_fit_is_one_fit_per_head(spec, batched):
    q, k, v = batched
    m = attnlab.Method(spec).fit(q, k)
    assert m.heads == 3 and m.shape == (3, 96, 96) and m.n_q == m.n_k == 96
    out = m.output(v)
    assert out.shape == (3, 96, 8)
    for h in range(3):
        np.testing.assert_array_equal(out[h], attnlab.Method(spec).fit(q[h], k[h]).output(v[h]), err_msg=spec)
    np.testing.assert_array_equal(out, attnlab.apply(spec, q, k, v))
    p = m.matrix()
    assert p.shape == (3, 96, 96)
    for h in range(3):
        np.testing.assert_allclose(out[h], p[h] @ v[h], rtol=0, atol=1e-12 * np.abs(out[h]).max() * 96)
    assert m.spectrum(top=4).shape == (3, 4)
    assert isinstance(m.diagnostics, list) and len(m.diagnostics) == 3


def test_seeded_random_methods_replay(qkv):
    q, k, v = qkv
    for spec in ("performer:features=64", "nystrom:landmarks=16,select=random", "linformer:k=16"):
        a = attnlab.Method(spec, seed=5).fit(q, k).output(v)
        b = attnlab.Method(spec, seed=5)(q, k, v)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, attnlab.apply(spec, q, k, v, seed=5))
        np.testing.assert_array_equal(a, attnlab.Method(spec + ",seed=5").fit(q, k).output(v))
        assert attnlab.Method(spec, seed=5).spec == attnlab.Method(spec + ",seed=5").spec
        assert not np.array_equal(a, attnlab.Method(spec, seed=6).fit(q, k).output(v)), spec


def test_call_fits_and_keeps_the_fit(qkv):
    q, k, v = qkv
    m = attnlab.Method("nystrom", landmarks=16)
    assert not m.fitted
    out = m(q, k, v)
    assert m.fitted and m.n_q == 128
    np.testing.assert_array_equal(out, m.output(v))


def test_refit_replaces_the_fit(qkv):
    q, k, v = qkv
    m = attnlab.Method("exact").fit(q, k)
    m.fit(q[:50], k[:70])
    assert (m.n_q, m.n_k) == (50, 70)
    np.testing.assert_allclose(m.output(v[:70]), softmax(q[:50], k[:70]) @ v[:70], rtol=0, atol=1e-12)
    # A failed fit leaves it unfitted, not on the previous data.
    with pytest.raises(ValueError):
        m.fit(q, k[:, :3])
    assert not m.fitted and m.n_q is None
    with pytest.raises(ValueError, match="call fit"):
        m.output(v)


# ---- the operator, the matrix, the spectrum ----------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["exact", "nystrom:landmarks=16", "performer:features=64", "local:window=8",
                                  "linformer:k=32", "vq:codes=16", "sparse", "svd:rank=8"])
def test_output_and_operator_agree_with_the_matrix(spec, qkv):
    q, k, v = qkv
    m = attnlab.Method(spec).fit(q, k)
    p = m.matrix()
    assert p.shape == (128, 128) and p.dtype == np.float64
    assert rel(m.output(v), p @ v) <= 1e-12, spec
    x = np.random.default_rng(1).standard_normal((128, 3))
    assert rel(m.apply(x), p @ x) <= 1e-12, spec
    assert rel(m.apply_transpose(x), p.T @ x) <= 1e-12, spec
    # A vector is one column, and comes back as a vector.
    y = m.apply(x[:, 0])
    assert y.shape == (128,) and rel(y, p @ x[:, 0]) <= 1e-12
    assert m.output(v[:, 0]).shape == (128,)
    assert m.apply_transpose(x[:, 0]).shape == (128,)


def test_exact_method_equals_numpy_softmax(qkv):
    q, k, v = qkv
    for causal, scale in ((False, None), (True, 0.3)):
        m = attnlab.Method("exact", causal=causal, scale=scale).fit(q, k)
        ref = softmax(q, k, causal, scale)
        assert np.max(np.abs(m.matrix() - ref)) <= 1e-13
        assert np.max(np.abs(m.output(v) - ref @ v)) <= 1e-12
    # Rectangular, causal aligned bottom-right.
    m = attnlab.Method("exact", causal=True).fit(q[:40], k)
    assert np.max(np.abs(m.matrix() - softmax(q[:40], k, True))) <= 1e-13


@pytest.mark.parametrize("spec", ["exact", "nystrom:landmarks=16"])
def test_spectrum_against_numpy_svd(spec, qkv):
    q, k, _ = qkv
    m = attnlab.Method(spec).fit(q, k)
    ref = np.linalg.svd(m.matrix(), compute_uv=False)
    s = m.spectrum()
    assert s.shape == (128,) and s.dtype == np.float64
    assert np.max(np.abs(s - ref)) <= 1e-8 * ref[0]
    top = m.spectrum(8)
    assert top.shape == (8,) and np.all(np.diff(top) <= 0)
    assert np.max(np.abs(top - ref[:8]) / ref[:8]) <= 1e-8
    # The matrix-free solvers on the operator.
    for solver in ("block", "lanczos"):
        np.testing.assert_allclose(m.spectrum(4, solver=solver, tol=1e-10), ref[:4], rtol=1e-6, err_msg=solver)


def test_spectrum_matrix_free_at_a_larger_n():
    q, k, _ = attnlab.generate("clustered", 1500, 16, seed=3)
    m = attnlab.Method("nystrom", landmarks=24).fit(q, k)
    s = m.spectrum(5, tol=1e-10)  # block Krylov (n_k > 512), P̃ never formed
    ref = np.linalg.svd(m.matrix(), compute_uv=False)[:5]
    np.testing.assert_allclose(s, ref, rtol=1e-6)
    assert m.rank_bound == 24


def test_diagnostics_and_rank_bound(qkv):
    q, k, _ = qkv
    ny = attnlab.Method("nystrom", landmarks=16).fit(q, k)
    d = ny.diagnostics
    assert isinstance(d, dict) and "pinv_residual" in d and np.isfinite(d["pinv_residual"]) and d["pinv_residual"] >= 0
    assert ny.rank_bound == 16 and ny.status == "success"
    ex = attnlab.Method("exact").fit(q, k)
    assert ex.rank_bound is None and isinstance(ex.diagnostics, dict)
    assert attnlab.Method("vq", codes=8).lookahead  # the codebook: fitted on every key
    assert attnlab.Method("exact").lookahead == ""


def test_scipy_linear_operator(qkv):
    sla = pytest.importorskip("scipy.sparse.linalg")
    q, k, _ = qkv
    m = attnlab.Method("nystrom", landmarks=16).fit(q, k)
    op = m.aslinearoperator()
    s = np.sort(sla.svds(op, k=3, return_singular_vectors=False))[::-1]
    np.testing.assert_allclose(s, m.spectrum(3), rtol=1e-8)


# ---- spec and keywords ---------------------------------------------------------------------------------------------

def test_keywords_equal_the_spec_string(qkv):
    q, k, v = qkv
    pairs = [(attnlab.Method("nystrom", landmarks=16, pinv="newton"), "nystrom:landmarks=16,pinv=newton"),
             (attnlab.Method("performer", features=32, orthogonal=False), "performer:features=32,orthogonal=false"),
             (attnlab.Method("vq:codes=8", temperature=0.5, assign="soft"), "vq:codes=8,temperature=0.5,assign=soft"),
             (attnlab.Method("cur", columns=np.int64(16), rcond=1e-7), "cur:columns=16,rcond=1e-07"),
             (attnlab.Method("local", window=8, causal=True), "local:window=8")]
    for m, spec in pairs:
        s = attnlab.Method(spec, causal=m.causal)
        assert m.spec == s.spec == attnlab.canonical(spec), spec
        np.testing.assert_array_equal(m.fit(q, k).output(v), s.fit(q, k).output(v))
    assert attnlab.Method("nystrom", landmarks=32).spec.startswith("nystrom:landmarks=32,")
    assert attnlab.Method("nystrom").name == "nystrom"
    assert "landmarks=16" in repr(attnlab.Method("nystrom", landmarks=16))


def test_repr_and_properties(batched):
    q, k, v = batched
    m = attnlab.Method("local", window=4, causal=True, scale=0.5)
    assert repr(m) == "<attnlab.Method('local:window=4', causal=True, scale=0.5), not fitted>"
    assert m.dtype is None and m.shape is None and m.heads is None and not m.fitted
    m.fit(q.astype(np.float32), k.astype(np.float32))
    assert repr(m) == ("<attnlab.Method('local:window=4', causal=True, scale=0.5), fitted: float32, 3 heads, "
                       "n_q=96, n_k=96, d=8>")
    assert m.dtype == np.float32 and m.causal and m.scale == 0.5 and m.supports_causal


# ---- dtypes ---------------------------------------------------------------------------------------------------------

def test_float32_is_float32(qkv):
    q, k, v = (x.astype(np.float32) for x in qkv)
    for spec in ("exact", "nystrom:landmarks=16", "performer:features=32"):
        m = attnlab.Method(spec).fit(q, k)
        assert m.dtype == np.float32
        out, p = m.output(v), m.matrix()
        assert out.dtype == np.float32 and p.dtype == np.float32
        assert m.apply(v).dtype == np.float32 and m.apply_transpose(v).dtype == np.float32
        assert m.spectrum(3).dtype == np.float64
        np.testing.assert_array_equal(out, attnlab.apply(spec, q, k, v))
        # Really computed in float32: not float64's numbers rounded.
        out64 = attnlab.Method(spec).fit(*(x.astype(np.float64) for x in (q, k))).output(v.astype(np.float64))
        assert 0 < np.max(np.abs(out - out64)) <= 1e-4, spec
    # dtype= converts the inputs of fit.
    assert attnlab.Method("exact").fit(qkv[0], k, dtype="float32").dtype == np.float32


def test_torch_tensors_in_numpy_out(qkv):
    torch = pytest.importorskip("torch")
    q, k, v = qkv
    m = attnlab.Method("nystrom", landmarks=16).fit(torch.from_numpy(q), torch.from_numpy(k))
    out = m.output(torch.from_numpy(v))
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, attnlab.Method("nystrom", landmarks=16).fit(q, k).output(v))


# ---- errors ----------------------------------------------------------------------------------------------------------

SHORT = 300


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: attnlab.Method("nystromm"), "did you mean nystrom"),
        (lambda: attnlab.Method("nystrom", landmark=3), "did you mean landmarks"),
        (lambda: attnlab.Method("nystrom:landmarks=8", landmarks=16), "given twice"),
        (lambda: attnlab.Method("performer:seed=1", seed=2), "seed is given twice"),
        (lambda: attnlab.Method("nystrom", landmarks=0), "landmarks"),
        (lambda: attnlab.Method("nystrom", pinv="exact"), "pinv"),
        (lambda: attnlab.Method("nystrom", landmarks=[1, 2]), "landmarks must be a number"),
        (lambda: attnlab.Method("nystrom", pinv="svd,iters=3"), "not a value a spec can hold"),
        (lambda: attnlab.Method("nystrom", causal=True), "cannot honour a causal mask"),
        (lambda: attnlab.Method("linformer", causal=True), "leak the future"),
        (lambda: attnlab.Method("exact", scale=-1.0), "scale must be finite and positive"),
        (lambda: attnlab.Method("exact", seed=-1), "seed must be a non-negative integer"),
        (lambda: attnlab.Method(3), "spec must be a string"),
    ],
)
def test_construction_errors(make, message):
    with pytest.raises(ValueError) as e:
        make()
    text = str(e.value)
    assert message in text, text
    assert len(text) < SHORT and "\n" not in text, text


def test_keyword_typo_keeps_the_library_message():
    with pytest.raises(ValueError) as e:
        attnlab.Method("nystrom", landmark=3)
    with pytest.raises(ValueError) as f:
        attnlab.apply("nystrom:landmark=3", *(np.ones((4, 2)),) * 3)
    assert str(e.value) == str(f.value)


def test_use_errors(qkv):
    q, k, v = qkv
    m = attnlab.Method("nystrom", landmarks=16)
    for call in (lambda: m.output(v), lambda: m.apply(v), lambda: m.apply_transpose(v), lambda: m.matrix(),
                 lambda: m.spectrum(3), lambda: m.diagnostics, lambda: m.rank_bound):
        with pytest.raises(ValueError, match=r"call fit\(q, k\) first"):
            call()
    m.fit(q, k)
    cases = [
        (lambda: m.output(v[:100]), "v has 100 rows"),
        (lambda: m.output(v[None]), "fitted on (n, d) inputs"),
        (lambda: m.output(v.astype(np.float32)), "fitted in float64"),
        (lambda: m.output(np.where(v > 1, np.nan, v)), "v: has NaN"),
        (lambda: m.apply_transpose(v[:7]), "n_q = 128 rows"),
        (lambda: m.spectrum(0), "top = 0 is out of range"),
        (lambda: m.spectrum(129), "top = 129 is out of range"),
        (lambda: m.spectrum(3, solver="svd"), "svd"),
        (lambda: m.spectrum("3"), "top must be an integer"),
        (lambda: attnlab.Method("exact").fit(q, k.astype(np.float32)), "(q float64, k float32)"),
        (lambda: attnlab.Method("exact").fit(q, k[:, :5]), "head dimensions differ"),
        (lambda: attnlab.Method("exact").fit(q[None], k), "q, k: give both"),
        (lambda: attnlab.Method("exact").fit(q, None), "k: an array is required"),
        (lambda: attnlab.Method("exact").fit(q.astype(np.int32), k), "dtype int32 is not supported"),
        (lambda: attnlab.Method("exact")(q, k, v[:5]), "different lengths"),
        (lambda: attnlab.Method("nystrom", landmarks=200).fit(q, k), "landmarks = 200 exceeds the sequence"),
        (lambda: attnlab.Method("exact", causal=True).fit(q, k[:50]), "causal"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        text = str(e.value)
        assert message in text, (message, text)
        assert len(text) < SHORT and "\n" not in text and "array(" not in text, text
    # None of these broke the fit.
    np.testing.assert_array_equal(m.output(v), attnlab.apply("nystrom:landmarks=16", q, k, v))


def test_batched_use_errors(batched):
    q, k, v = batched
    m = attnlab.Method("exact").fit(q, k)
    with pytest.raises(ValueError, match="fitted on 3 heads"):
        m.output(v[0])
    with pytest.raises(ValueError, match="fitted on 3 heads"):
        m.output(v[:2])
    with pytest.raises(ValueError, match="aslinearoperator"):
        m.aslinearoperator()


def test_non_finite_output_is_refused():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((30, 4)) for _ in range(3))
    m = attnlab.Method("exact").fit(q * 1e300, k * 1e300)  # finite inputs whose scores overflow
    for call in (lambda: m.output(v), m.matrix, lambda: m.apply(v), lambda: m.spectrum(), lambda: m.spectrum(3)):
        with pytest.raises(ValueError, match="non-finite values"):
            call()


# ---- help, threads, Ctrl-C ----------------------------------------------------------------------------------------

def test_help_shows_the_docstrings():
    text = pydoc.render_doc(attnlab.Method, renderer=pydoc.plaintext)
    for member in ("fit", "output", "apply", "apply_transpose", "matrix", "spectrum", "diagnostics", "rank_bound",
                   "aslinearoperator", "__call__"):
        doc = getattr(attnlab.Method, member).__doc__
        assert doc and doc.split("\n")[0].strip() in text, member
    assert "fitted once on (Q, K), then applied to many V" in text
    assert 'Method("nystrom", landmarks=64)' in text
    assert "Method" in attnlab.__all__


def test_threads_share_a_method_safely():
    q, k, v = attnlab.generate("gaussian", 400, 16, seed=4)
    m = attnlab.Method("performer", features=64).fit(q, k)
    want = m.output(v)
    errors, results = [], []

    def work():
        try:
            for _ in range(5):
                results.append(m.output(v))
                m.fit(q, k)  # refits while the other threads read: each call keeps the fit it started with
                m.spectrum(3)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert all(np.array_equal(r, want) for r in results)


def test_a_refit_keeps_the_previous_fit_usable_meanwhile():
    # While one thread refits (the GIL released for the whole fit), calls on other threads use the previous fit:
    # they never find the method unfitted. The fits here take most of the refitting thread's time, so a window in
    # which the method looked unfitted would be hit on nearly every read.
    q, k, v = attnlab.generate("gaussian", 3000, 32, seed=5)
    m = attnlab.Method("nystrom", landmarks=256, iters=40).fit(q, k)
    want = m.output(v)
    done, errors, reads = threading.Event(), [], []

    def refit():
        try:
            for _ in range(6):
                m.fit(q, k)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=refit)
    t.start()
    while not done.is_set():
        try:
            reads.append(np.array_equal(m.output(v), want))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            break
    t.join()
    assert not errors, errors
    assert reads and all(reads)
    with pytest.raises(ValueError, match="must be finite|NaN|finite"):
        m.fit(np.full_like(q, np.nan), k)
    with pytest.raises(ValueError, match="not fitted"):  # a failed refit leaves the method unfitted
        m.output(v)


def test_gil_released_and_ctrl_c_during_a_spectrum(ticking, ctrl_c):
    q, k, _ = attnlab.generate("gaussian", 3000, 64, seed=1)
    m = attnlab.Method("exact").fit(q, k)
    with ticking() as ticks:
        m.spectrum(8)
    assert len(ticks) >= 5, "the other thread did not run: the GIL was held"
    with ctrl_c(within=20):
        for _ in range(200):
            m.spectrum(32, tol=1e-12)
    assert m.fitted and m.spectrum(2).shape == (2,)
