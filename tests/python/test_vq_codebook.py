"""attnlab.vq_codebook and vq's fixed codebook (codebook=PATH.npy): the method's own k-means, fitted on training
keys and held on the evaluated window, with no look-ahead.

Run by ctest (python.module, with the rest of tests/python) with PYTHONPATH=build/python and Debian's pytest.
"""
import pathlib

import numpy as np
import pytest

import attnlab

N, D = 192, 16


def keys(seed, n=N, d=D):
    return np.random.default_rng(seed).standard_normal((n, d))


def test_codebook_is_what_the_method_fits(tmp_path):
    """On one window's keys, vq_codebook is the codebook 'vq:codes=C,seed=S' fits there: the fixed form with it
    gives the window form's output bit for bit (float64, and float32 with a float32 codebook)."""
    q, k, v = keys(1), keys(2), keys(3, d=8)
    for dt in (np.float64, np.float32):
        qd, kd, vd = q.astype(dt), k.astype(dt), v.astype(dt)
        cb = attnlab.vq_codebook(kd, codes=12, iters=20, seed=7)
        assert cb.shape == (12, D) and cb.dtype == dt
        path = tmp_path / f"cb_{np.dtype(dt).name}.npy"
        np.save(path, cb)
        for causal in (False, True):
            window = attnlab.apply("vq:codes=12,seed=7", qd, kd, vd, causal=causal)
            fixed = attnlab.apply(f"vq:codes=12,codebook={path}", qd, kd, vd, causal=causal)
            assert np.array_equal(window, fixed), (dt, causal)
    # Seeded: the same seed the same codebook, another seed (usually) another.
    assert np.array_equal(attnlab.vq_codebook(k, 12, seed=3), attnlab.vq_codebook(k, 12, seed=3))
    assert not np.array_equal(attnlab.vq_codebook(k, 12, seed=3), attnlab.vq_codebook(k, 12, seed=4))


def test_stacked_windows_are_their_rows():
    train = np.random.default_rng(4).standard_normal((3, 64, D))
    assert np.array_equal(attnlab.vq_codebook(train, codes=8, seed=1),
                          attnlab.vq_codebook(train.reshape(-1, D), codes=8, seed=1))


def leak(spec, q, k, v):
    """The largest change of an output row i < t when keys and values at positions ≥ t are redrawn, over t."""
    out = attnlab.apply(spec, q, k, v, causal=True)
    rng = np.random.default_rng(9)
    worst = 0.0
    for t in (16, 48, 96, 144, 176):
        k2, v2 = k.copy(), v.copy()
        k2[t:] = 3 * rng.standard_normal(k2[t:].shape)
        v2[t:] = 3 * rng.standard_normal(v2[t:].shape)
        out2 = attnlab.apply(spec, q, k2, v2, causal=True)
        worst = max(worst, float(np.abs(out2[:t] - out[:t]).max()))
    return worst


def test_fixed_codebook_is_causal(tmp_path):
    """Fitted on other windows (training keys) and saved, the codebook makes vq causal: no output before t moves
    when anything at or after t changes; codebook=window (k-means on the call's keys) looks ahead."""
    train = np.random.default_rng(5).standard_normal((4, N, D))
    path = tmp_path / "cb.npy"
    np.save(path, attnlab.vq_codebook(train, codes=64, seed=0))
    q, k, v = keys(6), keys(7), keys(8, d=8)
    fixed, window = f"vq:codebook={path}", "vq"
    assert attnlab.Method(fixed, causal=True).lookahead == ""
    assert attnlab.Method(window, causal=True).lookahead  # accepted, its look-ahead stated
    assert leak(fixed, q, k, v) == 0.0
    assert leak(window, q, k, v) > 1e-3
    # The same through Method, the path given as a keyword (a pathlib.Path too).
    m = attnlab.Method("vq", codebook=pathlib.Path(path), causal=True)
    assert m.spec.endswith(f"codebook={path},seed=0")
    assert np.array_equal(m(q, k, v), attnlab.apply(fixed, q, k, v, causal=True))


def test_errors(tmp_path):
    k = keys(10)
    with pytest.raises(ValueError, match="codes must be an integer ≥ 1"):
        attnlab.vq_codebook(k, codes=0)
    with pytest.raises(ValueError, match="codes = 500 exceeds the 192 keys"):
        attnlab.vq_codebook(k, codes=500)
    with pytest.raises(ValueError, match="iters"):
        attnlab.vq_codebook(k, codes=4, iters=-1)
    with pytest.raises(ValueError, match="keys: dtype"):
        attnlab.vq_codebook(k.astype(np.int64), codes=4)
    path = tmp_path / "cb.npy"
    np.save(path, attnlab.vq_codebook(k, codes=32))
    with pytest.raises(ValueError, match="holds 32 codes, but codes = 64"):
        attnlab.Method(f"vq:codebook={path}")
    with pytest.raises(ValueError, match="window or the path of a .npy file"):
        attnlab.Method("vq:codebook=cb.txt")
    with pytest.raises(ValueError, match="cannot read the codebook"):
        attnlab.Method(f"vq:codes=32,codebook={tmp_path / 'missing.npy'}")
    q8 = np.random.default_rng(11).standard_normal((20, 8))
    with pytest.raises(ValueError, match="has d = 16, but the keys have d = 8"):
        attnlab.apply(f"vq:codes=32,codebook={path}", q8, q8, q8, causal=True)
