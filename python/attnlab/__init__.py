"""attnlab: exact softmax attention, its efficient approximations, and their error, spectra and cost.

Inputs q, k, v are (n, d) or (heads, n, d) arrays: numpy arrays, CPU PyTorch tensors, or anything exposing the
buffer protocol or ``__array__``.

- float32 or float64, kept as given: a float32 call computes in float32. A C-contiguous input is read in place
  (no copy; a CPU tensor shares its memory); a non-contiguous one is copied once.
- One dtype for all inputs: arrays of different dtypes are refused unless ``dtype=`` ("float32", "float64" or a
  numpy dtype) names the one to compute in; then every input is converted to it (a copy where it differs).
- A tensor that requires grad is refused while autograd is on: attnlab has no backward pass yet; call .detach()
  or run under torch.no_grad(). A tensor on another device is refused (pass t.cpu()).
- Inputs with NaN or infinities are refused before the work; an output that is not finite (a numerical failure,
  e.g. float64 inputs of 1e300) is refused after it.

Every error about the arguments or the library's checks is a ValueError with a one-line message (never the arrays);
Ctrl-C during a call raises KeyboardInterrupt. The GIL is released while C++ runs. Calls run on the module's own
OpenMP thread count (threads()), whatever another library in the process (PyTorch) has set.
"""
import numbers
import operator
import os
import sys

import numpy as np

from . import _core

__version__ = _core.__version__
__all__ = ["apply", "budget_families", "canonical", "compare", "cost", "generate", "methods", "report", "set_threads", "sources", "spectrum",
           "threads"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_SEED_LIMIT = 2**64


# ---- argument checks: one line each, naming the argument, what it got and what is valid --------------------------

def _show(x):
    """A value as an error message quotes it: short, never an array's contents."""
    if isinstance(x, (bool, numbers.Number, str)) and len(repr(x)) <= 60:
        return repr(x)
    kind = type(x).__name__
    kind = ("an " if kind[:1].lower() in "aeiou" else "a ") + kind
    shape = getattr(x, "shape", None)
    return f"{kind} of shape {tuple(shape)}" if shape is not None else kind


def _first_line(e):
    text = str(e).strip().splitlines()
    return text[0][:160] if text else type(e).__name__


def _bool(name, x):
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    raise ValueError(f"{name} must be True or False, got {_show(x)}")


def _int(name, x, minimum=None, none=False):
    if x is None and none:
        return None
    what = ("a non-negative integer" if minimum == 0 else "an integer" if minimum is None
            else f"an integer ≥ {minimum}")
    try:
        if isinstance(x, (bool, np.bool_)):
            raise TypeError
        x = operator.index(x)  # int, numpy integers; not floats, strings, or arrays of more than one value
    except TypeError:
        raise ValueError(f"{name} must be {what}{' or None' if none else ''}, got {_show(x)}") from None
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be {what}, got {x}")
    return x


def _seed(x, none=False):
    x = _int("seed", x, 0, none)
    if x is not None and x >= _SEED_LIMIT:
        raise ValueError(f"seed must be below 2**64, got {x}")
    return x


def _real(name, x, none=False):
    if x is None and none:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a number{' or None' if none else ''}, got {_show(x)}")
    return float(x)


def _str(name, x, example):
    if isinstance(x, str):
        return x
    raise ValueError(f"{name} must be a string such as {example!r}, got {_show(x)}")


def _path(name, x):
    if isinstance(x, (str, os.PathLike)):
        return os.fspath(x)
    raise ValueError(f"{name} must be a path (str or os.PathLike), got {_show(x)}")


def _specs(name, x, example, none_means):
    """A list of strings; a single string is a list of one (compare(q, k, v, "nystrom"))."""
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if isinstance(x, (list, tuple)):
        bad = [s for s in x if not isinstance(s, str)]
        if bad:
            raise ValueError(f"{name}: every entry must be a string such as {example!r}, got {_show(bad[0])}")
        if not x:
            raise ValueError(f"{name}: an empty list; give specs or None for {none_means}")
        return list(x)
    raise ValueError(f"{name} must be a string such as {example!r}, a list of them, or None ({none_means}), "
                     f"got {_show(x)}")


def _dtype(x):
    """float32 or float64 from a name, a numpy dtype or scalar type, or a torch dtype (by name: no torch import)."""
    if str(x).startswith("torch."):
        x = str(x)[len("torch."):]
    try:
        dt = np.dtype(x)
    except (TypeError, ValueError):
        dt = None
    if dt not in _FLOATS:
        raise ValueError(f"dtype must be 'float32' or 'float64' (or a numpy dtype of either), got {_show(x)}")
    return dt


# ---- inputs: tensors and other array-likes, without copies ------------------------------------------------------

def _from_tensor(t, name):
    """A PyTorch tensor (duck-typed: attnlab does not import torch) as something numpy can read in place."""
    device = getattr(t, "device", None)
    if getattr(device, "type", "cpu") != "cpu":
        raise ValueError(f"{name}: a tensor on {device}; attnlab computes on the CPU: pass {name}.cpu()")
    if getattr(t, "requires_grad", False):
        torch = sys.modules.get("torch")
        if torch is None or torch.is_grad_enabled():
            raise ValueError(f"{name}: a tensor that requires grad; call {name}.detach() or run under "
                             "torch.no_grad(): attnlab has no backward pass yet")
        t = t.detach()  # autograd is off, so no gradient is wanted; detach() shares the memory
    return t


def _array(x, name):
    """x as a numpy array without a copy where numpy can avoid one (buffer protocol, __array__, CPU tensors)."""
    if x is None:
        raise ValueError(f"{name}: an array is required, got None")
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "requires_grad") and hasattr(x, "detach"):
        x = _from_tensor(x, name)
    try:
        return np.asarray(x)
    except Exception as e:  # numpy's or the tensor's own refusal (bfloat16, a conjugate view, a ragged list, ...)
        raise ValueError(f"{name}: cannot be read as an array ({type(e).__name__}: {_first_line(e)}); give a "
                         "float32 or float64 numpy array or CPU tensor") from None


def _inputs(dtype, **arrays):
    """The named inputs as numpy arrays of one dtype: theirs (when float32 or float64 and all equal) or `dtype`."""
    out = {name: _array(x, name) for name, x in arrays.items()}
    if dtype is not None:
        dt = _dtype(dtype)
        for name, a in out.items():
            try:
                out[name] = a.astype(dt, copy=False)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{name}: cannot be converted from {a.dtype} to {dt} ({_first_line(e)})") from None
        return list(out.values())
    for name, a in out.items():
        if a.dtype not in _FLOATS:
            raise ValueError(f"{name}: dtype {a.dtype} is not supported; give float32 or float64 arrays, or pass "
                             "dtype='float32' or dtype='float64' to convert (a copy)")
    if len({a.dtype for a in out.values()}) > 1:
        listed = ", ".join(f"{name} {a.dtype}" for name, a in out.items())
        raise ValueError(f"{', '.join(out)}: different dtypes ({listed}); give one dtype, or pass "
                         "dtype='float32' or dtype='float64' to compute in it (the others are converted: a copy)")
    return list(out.values())


# ---- the functions ------------------------------------------------------------------------------------------------

def methods():
    """Every registered method: name, summary, reference (the equation it implements), causal support, and its
    parameters (name, type, default, help)."""
    return _core.methods()


def canonical(spec, *, causal=False):
    """`spec` in canonical form (every parameter, defaults filled in), e.g. 'nystrom' -> 'nystrom:landmarks=64,...':
    checks it without running anything. ValueError for an unknown method or parameter, a value out of range, or
    (causal=True) a method that cannot honour the causal mask."""
    return _core.canonical(_str("spec", spec, "nystrom:landmarks=64"), _bool("causal", causal))


def budget_families():
    """The method families swept against a budget, as error_vs_budget and the report sweep them: dicts with label,
    spec (prefix), param (the budget parameter), budgets, specs (one per budget), deployable (False for the
    analysis floors svd and cur) and causal (the method honours a causal mask)."""
    return _core.budget_families()


def sources():
    """The generated sources' names (generate())."""
    return _core.sources()


def apply(spec, q, k, v, *, causal=False, scale=None, seed=None, matrix=False, dtype=None):
    """The output of method `spec` (e.g. 'nystrom:landmarks=32') on Q, K, V: softmax attention's approximation
    P̃·V, shaped like Q with V's last dimension, in the inputs' dtype (or `dtype`).

    matrix=True also returns P̃ (memory-guarded): (output, P̃). seed (a non-negative integer) fills the spec's
    seed when it gives none; scale defaults to 1/sqrt(d). An output that is not finite raises ValueError.
    """
    spec = _str("spec", spec, "nystrom:landmarks=64")
    causal, matrix = _bool("causal", causal), _bool("matrix", matrix)
    scale, seed = _real("scale", scale, none=True), _seed(seed, none=True)
    q, k, v = _inputs(dtype, q=q, k=k, v=v)
    return _core.apply(spec, q, k, v, causal, scale, seed, matrix)


def compare(q, k, v, methods=None, *, causal=False, scale=None, seed=0, matrix_metrics="auto", matrix_limit=4096,
            spectral=True, repeats=5, warmup=1, frame=True, dtype=None):
    """Every method in `methods` (a spec, a list of specs, or None: every registered method, the causal ones when
    causal=True) against exact attention, per head: one row per (head, method).

    Columns: head_index (the head of a (heads, n, d) input; not "head", which would hide DataFrame.head), method,
    spec, dtype, n_q, n_k; the cost — time_s (the fastest of `repeats` timed calls after `warmup` untimed ones,
    compute + output, by the library's cost harness as the command and the benchmark time it), time_median_s,
    exact_time_s (exact attention on the same head, timed alike) and speedup = exact_time_s / time_s (> 1: faster
    than exact); the output errors (out_rel_fro, out_max_abs, cosines), the method's diagnostics and, for
    n ≤ matrix_limit (matrix_metrics='auto'; 'on', 'off'), the errors of P̃ (P_rel_fro, P_rel_spectral,
    P_mean_kl, P_mean_tv). A pandas DataFrame when pandas is installed and frame=True, else a list of dicts.
    """
    specs = _specs("methods", methods, "nystrom:landmarks=64", "every method")
    causal, spectral, frame = _bool("causal", causal), _bool("spectral", spectral), _bool("frame", frame)
    scale, seed = _real("scale", scale, none=True), _seed(seed)
    matrix_metrics = _str("matrix_metrics", matrix_metrics, "auto")
    matrix_limit = _int("matrix_limit", matrix_limit, 0)
    repeats, warmup = _int("repeats", repeats, 1), _int("warmup", warmup, 0)
    q, k, v = _inputs(dtype, q=q, k=k, v=v)
    return _core.compare(q, k, v, specs, causal, scale, seed, matrix_metrics, matrix_limit, spectral, repeats,
                         warmup, frame)


def cost(q, k, v, spec, *, causal=False, scale=None, seed=0, repeats=5, warmup=1, memory=True, dtype=None):
    """What method `spec` costs on Q, K, V, measured exactly as the benchmark, the experiments and the command
    measure it (the library's cost harness, attnlab/cost.hpp).

    Steady state, as a model runs a layer again and again: `warmup` untimed calls first (page faults, caches,
    lazily built state), then `repeats` timed calls of the same method object, each compute() + output().
    Memory (memory=True) is measured in a separate, untimed call on a fresh method object, so that it never
    perturbs the timed ones. A (heads, n, d) input is timed as one call running every head in turn.

    Returns a dict: min_s (the figure to quote), median_s, max_s, repeats, warmup, peak_bytes (the peak resident
    memory the call added; None with memory=False), spec (canonical) and context (threads, products, ISA).
    """
    spec = _str("spec", spec, "nystrom:landmarks=64")
    causal, memory = _bool("causal", causal), _bool("memory", memory)
    scale, seed = _real("scale", scale, none=True), _seed(seed)
    repeats, warmup = _int("repeats", repeats, 1), _int("warmup", warmup, 0)
    q, k, v = _inputs(dtype, q=q, k=k, v=v)
    return _core.cost(q, k, v, spec, causal, scale, seed, repeats, warmup, memory)


def spectrum(q, k, *, top=None, causal=False, scale=None, solver="auto", tol=1e-9, dtype=None):
    """Singular values of the exact attention matrix P = softmax(scale·QKᵀ), descending, in float64: all of them
    (dense SVD, P materialized; memory-guarded) or the top `top`, matrix-free (block Krylov; solver 'block',
    'lanczos', 'dense' or 'auto'; tol relative to σ₁). Shape (top,) or (heads, top)."""
    top = _int("top", top, None, none=True)
    causal, scale = _bool("causal", causal), _real("scale", scale, none=True)
    solver, tol = _str("solver", solver, "auto"), _real("tol", tol)
    q, k = _inputs(dtype, q=q, k=k)
    return _core.spectrum(q, k, top, causal, scale, solver, tol)


def generate(source="gaussian", n=1024, d=64, *, n_k=None, d_v=None, seed=0, dtype="float64", temperature=1.0,
             centres=32, spread=0.3, rank=8):
    """A generated problem (the experiments' sources), seeded: returns (q, k, v), each (n, d) (v: (n_k, d_v)).
    gaussian: iid N(0,1), logits divided by temperature; clustered: around `centres` shared centres with `spread`;
    lowrank: Q, K in a random rank-`rank` subspace."""
    source = _str("source", source, "gaussian")
    n, d = _int("n", n, 1), _int("d", d, 1)
    n_k, d_v = _int("n_k", n_k, 1, none=True), _int("d_v", d_v, 1, none=True)
    seed, dt = _seed(seed), _dtype(dtype)
    temperature, spread = _real("temperature", temperature), _real("spread", spread)
    centres, rank = _int("centres", centres, 1), _int("rank", rank, 1)
    return _core.generate(source, n, d, n_k, d_v, seed, dt.name, temperature, centres, spread, rank)


def report(q=None, k=None, v=None, *, model_dir="", out="attnlab_report", target=0.05, families=None, layers="all",
           seq=0, repeats=3, causal=False, quiet=False, threads=0, dtype=None):
    """Writes a report directory (index.html, report.csv, summary.md) answering 'which approximation for my
    model?': per head the entropy, spectrum, every method's error against its measured cost at several budgets,
    the Pareto frontier and the cheapest method under `target` output error; per layer × head the recommendation
    and its speed-up. Input: q, k, v ((heads, n, d), one layer) or model_dir (an export such as
    data/attention/trained, several layers). Returns the path of index.html."""
    model_dir, out = _path("model_dir", model_dir), _path("out", out)
    target = _real("target", target)
    families = _specs("families", families, "nystrom", "every family")
    layers = _str("layers", layers, "all")
    seq, repeats = _int("seq", seq, 0), _int("repeats", repeats, 1)
    causal, quiet = _bool("causal", causal), _bool("quiet", quiet)
    threads = _int("threads", threads, 0)
    if model_dir:
        if q is not None or k is not None or v is not None:
            raise ValueError("report: give q, k, v or model_dir, not both")
    else:
        q, k, v = _inputs(dtype, q=q, k=k, v=v)
    return _core.report(q, k, v, model_dir, out, target, families, layers, seq, repeats, causal, quiet, threads)


def threads():
    """The OpenMP threads every attnlab call runs on: set_threads(n) when called, else the process's OpenMP
    default as the environment gives it (OMP_NUM_THREADS, else the CPUs this process may use), read when the
    module is imported. Another library's setting does not change it: importing PyTorch, which sets the main
    thread's OpenMP count to its own choice, no longer halves it. Each call sets its thread's OpenMP count to this
    for its duration and restores the previous one after, so attnlab does not change PyTorch's count either."""
    return _core.threads()


def set_threads(n):
    """Sets the OpenMP threads every attnlab call runs on, from any Python thread (threads())."""
    return _core.set_threads(_int("n", n, 1))


# For the tests: the calling thread's OpenMP setting (PyTorch's, once imported), which calls leave as they found it.
_omp_max_threads = _core._omp_max_threads


def _data_address(a, dtype=None):
    """For the tests: the address the C++ side reads an input at (the input's own when it is not copied)."""
    (a,) = _inputs(dtype, a=a)
    return _core._data_address(a)
