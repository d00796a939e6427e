"""The module computes the same bits on every CPU: Eigen's blocking (the cache sizes its products assume, and with
them the order in which a long product's terms are summed) is pinned when the module loads, by the library's own
initializer (lib/src/core/reproducible.cpp), as in the command; not left to the sizes Eigen detects on the CPU.

Run by ctest (python.module) with PYTHONPATH=build/python and Debian's pytest.
"""
import subprocess
import sys

import numpy as np

import attnlab
from attnlab import _core

PINNED = (48 * 1024, 1024 * 1024, 384 * 1024 * 1024)
ZEN4 = (32 * 1024, 1024 * 1024, 32 * 1024 * 1024)  # a CPU with another L1 (the Zen 4)


def test_the_module_runs_with_the_pinned_blocking():
    assert _core._pinned_cache_sizes() == PINNED
    assert _core._eigen_cache_sizes() == PINNED


def test_a_fresh_process_is_pinned_on_import_before_any_call():
    code = "from attnlab import _core; print(*_core._eigen_cache_sizes())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert tuple(int(x) for x in out.split()) == PINNED


def nystrom_svd():
    """The drop-in study's Nyström-SVD on one (2048, 64) float32 head: its products sum over n = 2048 keys, longer
    than a block of either L1's, so their bits follow the blocking."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2048, 64)).astype(np.float32) for _ in range(3))
    return attnlab.apply("nystrom:pinv=svd", q, k, v)


def test_other_detected_caches_give_the_pinned_bits_once_pinned():
    pinned = nystrom_svd()
    try:
        _core._set_eigen_cache_sizes(*ZEN4)
        assert _core._eigen_cache_sizes() == ZEN4
        other = nystrom_svd()
    finally:
        _core._pin_eigen_blocking()
    assert _core._eigen_cache_sizes() == PINNED
    again = nystrom_svd()
    # The computation depends on the blocking (else the equality below would prove nothing) ...
    assert not np.array_equal(other, pinned)
    # ... and under the pin it is the pinned run's, bit for bit, whatever sizes were set before.
    assert np.array_equal(again, pinned)


def test_the_thread_count_changes_no_bit():
    """Eigen split a long product made outside attnlab's parallel regions among the OpenMP threads, with another
    blocking depth than on one thread: Linformer's and Nyström's outputs differed in their last bits between
    set_threads(1) and 2 (as the command's did between OMP_NUM_THREADS=1 and 2). The library keeps Eigen's products on
    one thread, so a user's thread count (or PyTorch's, or a 1-CPU machine) changes no value."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1024, 64)).astype(np.float32) for _ in range(3))
    before = attnlab.threads()
    try:
        for spec in ("linformer:k=64", "nystrom:landmarks=64"):
            attnlab.set_threads(1)
            one = attnlab.apply(spec, q, k, v)
            attnlab.set_threads(2)
            two = attnlab.apply(spec, q, k, v)
            assert np.array_equal(one, two), spec
    finally:
        attnlab.set_threads(before)
