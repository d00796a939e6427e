"""attnlab: exact softmax attention, its efficient approximations, and their error, spectra and cost.

Inputs q, k, v are (n, d) or (heads, n, d) arrays: numpy arrays, CPU PyTorch tensors, or anything exposing the
buffer protocol or ``__array__``.

- float32 or float64, kept as given: a float32 call computes in float32. A C-contiguous input is read in place
  (no copy; a CPU tensor shares its memory); a non-contiguous one is copied once.
- One dtype for all inputs: arrays of different dtypes are refused unless ``dtype=`` ("float32", "float64" or a
  numpy dtype) names the one to compute in; then every input is converted to it (a copy where it differs).
- A tensor that requires grad is refused while autograd is on (these functions return arrays, not tensors in the
  graph): call .detach(), run under torch.no_grad(), or use attnlab.torch.attention, which is differentiable. A
  tensor on another device is refused (pass t.cpu()).
- Inputs with NaN or infinities are refused before the work; an output that is not finite (a numerical failure,
  e.g. float64 inputs of 1e300) is refused after it.

Method(spec) fits a method once on (Q, K) and applies it to many V; it also gives the method's operator P̃
(apply, apply_transpose), P̃ itself, its diagnostics and its spectrum. The functions are one-call conveniences.

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
__all__ = ["Method", "apply", "backward", "budget_families", "canonical", "compare", "cost", "generate", "methods",
           "report", "set_threads", "sources", "spectrum", "threads", "vq_codebook"]

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
    # `is None` first: numpy compares np.dtype('float64') == None as True, so an unknown name ("bfloat16", "fp32")
    # once passed `dt not in _FLOATS` and was computed in float64.
    if dt is None or dt not in _FLOATS:
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
                             "torch.no_grad(): these functions return arrays outside autograd (for gradients: "
                             "attnlab.torch.attention, or Method.backward)")
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
        hint = ""
        if "bfloat16" in str(getattr(x, "dtype", "")):   # numpy has no bfloat16; its values are exact in float32
            hint = (f" ({name}.float() holds the same values: pass it with precision='bf16' to compute in bfloat16, "
                    "or use attnlab.torch.attention, which takes bfloat16 tensors)")
        raise ValueError(f"{name}: cannot be read as an array ({type(e).__name__}: {_first_line(e)}); give a "
                         f"float32 or float64 numpy array or CPU tensor{hint}") from None


def _inputs(dtype, half="hint", **arrays):
    """The named inputs as numpy arrays of one dtype: theirs (when float32 or float64 and all equal) or `dtype`.
    float16 arrays (np.load of a '<f2' file): half='hint' refuses them naming precision='fp16' (the functions that
    take it), 'plain' naming dtype='float32' (the others), 'convert' converts them to float32, exactly (a reduced
    precision given, without dtype=)."""
    out = {name: _array(x, name) for name, x in arrays.items()}
    if dtype is None and half == "convert" and any(a.dtype == np.float16 for a in out.values()):
        dtype = np.float32
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
            hint = (" (float16 arrays, e.g. np.load of a '<f2' file: precision='fp16' computes them as float16 "
                    "stores them, as `attnlab apply` does such files)") if half != "plain" else (
                    " (float16 arrays: dtype='float32' holds their values exactly)")
            half_hint = hint if a.dtype == np.float16 else ""
            raise ValueError(f"{name}: dtype {a.dtype} is not supported; give float32 or float64 arrays, or pass "
                             f"dtype='float32' or dtype='float64' to convert (a copy){half_hint}")
    if len({a.dtype for a in out.values()}) > 1:
        listed = ", ".join(f"{name} {a.dtype}" for name, a in out.items())
        raise ValueError(f"{', '.join(out)}: different dtypes ({listed}); give one dtype, or pass "
                         "dtype='float32' or dtype='float64' to compute in it (the others are converted: a copy)")
    return list(out.values())


# Emulated storage precision (the library's core/precision.hpp): fp64 and fp32 compute natively in float64 and
# float32; bf16 and fp16 store the method's tensors in that format over float32 accumulation, the intermediates the
# policy names included (attnlab.methods()' 'storage').
_PRECISIONS = {"fp64": ("native", np.float64), "fp32": ("native", np.float32),
               "bf16": ("bf16", np.float32), "fp16": ("fp16", np.float32)}
_POLICIES = ("eager", "careful")


def _precision(precision, policy, dtype):
    """(storage, policy, dtype) for the core: precision None keeps the inputs' dtype (dtype=, if given)."""
    if policy not in _POLICIES:
        raise ValueError(f"policy: {policy!r} is not one of {', '.join(_POLICIES)} (eager: every intermediate stored "
                         "in the format, as a straightforward transcription; careful: accumulators, normalisers, "
                         "softmax statistics and states kept in float32)")
    if precision is not None and (not isinstance(precision, str) or precision not in _PRECISIONS):
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(_PRECISIONS)}")
    if policy != "eager" and _PRECISIONS.get(precision, ("native",))[0] == "native":
        # as the command's --policy: a policy says which intermediates bf16/fp16 round; elsewhere nothing rounds
        raise ValueError(f"policy={policy!r} needs precision='bf16' or 'fp16' (under precision={precision!r} nothing "
                         "is rounded, so a policy would change nothing)")
    if precision is None:
        return "native", policy, dtype
    storage, dt = _PRECISIONS[precision]
    if dtype is not None and _dtype(dtype) != np.dtype(dt):
        raise ValueError(f"dtype={dtype!r} contradicts precision={precision!r}, which computes in {np.dtype(dt)}; "
                         "give one of them")
    return storage, policy, dt


def _split_precision(spec, precision, policy):
    """A spec may end in '@bf16', '@fp16', '@bf16-careful', '@fp16-eager' (...): the method in that emulated storage
    (`policy` unless named), the form a swap spec or a drop-in row carries. (spec without it, precision, policy);
    giving the precision both ways, or two policies, is refused. An '@' in a parameter's value (a path: vq's
    codebook=) is not a precision."""
    if not isinstance(spec, str) or "@" not in spec:
        return spec, precision, policy
    base, _, tail = spec.rpartition("@")
    fmt, dash, pol = tail.partition("-")
    if fmt not in _PRECISIONS or (dash and pol not in _POLICIES):
        if any(c in tail for c in "/\\.=,:"):   # a path's or a value's '@', not a misspelt precision
            return spec, precision, policy
        raise ValueError(f"spec {spec!r}: '@{tail}' is not a precision; write SPEC@FORMAT or SPEC@FORMAT-POLICY with "
                         f"FORMAT one of {', '.join(_PRECISIONS)} and POLICY one of {', '.join(_POLICIES)}")
    if _split_precision(base, None, "eager")[1] is not None:
        raise ValueError(f"spec {spec!r} names two precisions; give one")
    if precision is not None:
        raise ValueError(f"spec {spec!r} names its precision, and precision={precision!r} is given too; give it once")
    if pol and policy not in ("eager", pol):
        raise ValueError(f"spec {spec!r} names its policy, and policy={policy!r} is given too; give it once")
    return base, fmt, pol or policy


def _native_spec(spec):
    """A '@bf16' / '@fp16' spec's own method, native: what P̃ is read from (the emulation rounds outputs and gradients,
    not P̃; apply(matrix=True) refuses it). Other specs as given."""
    base, precision, _ = _split_precision(spec, None, "eager")
    return base if precision in ("bf16", "fp16") else spec


def _overflowed(heads):
    """'; overflowed: WHAT, ...' of the intermediates stored with ±inf in any head's diagnostics, or ''."""
    over = sorted({k[9:-1] for d in heads for k, x in d.items() if k.startswith("overflow[") and x > 0})
    return f"; overflowed: {', '.join(over)}" if over else ""


def _warn_reduced(m, what):
    """Under bf16/fp16 a non-finite or all-zero output is the finding: returned, and said (never silent)."""
    if m._storage == "native":
        return
    diags = m._m.diagnostics
    heads = diags if isinstance(diags, list) else [diags]
    nonfinite = int(sum(d.get("output_nonfinite", 0) for d in heads))
    zero = int(sum(d.get("output_zero_rows", 0) for d in heads))
    if nonfinite or zero:
        import warnings
        # the first intermediate stored with a NaN (diagnostics keep the order of storing): where 0/0 or inf − inf arose
        nan = next((k[4:-1] for d in heads for k, x in d.items() if k.startswith("nan[") and x > 0), None)
        warnings.warn(f"{what}: {m._m.spec} under {m._storage} storage ({m._policy}): {nonfinite} non-finite output "
                      f"entries, {zero} all-zero output rows" + _overflowed(heads)
                      + (f"; NaN first stored in: {nan}" if nan else "")
                      + " (Method.diagnostics has the counts per intermediate)", RuntimeWarning, stacklevel=3)


def _warn_gradients(m, what, grads, do):
    """Under bf16/fp16 non-finite gradients, and gradients zero everywhere where dV is while ∂L/∂O is not (fp16 eager
    linear attention's: its normaliser overflowed), are the finding: returned, and said (never silent). dV = P̃ᵀ·∂L/∂O
    with P̃'s rows summing to 1 is not zero where ∂L/∂O is not; dQ and dK may be, exactly (one key: dS = 0), so they
    are named beside a zero dV, never alone."""
    if m._storage == "native":
        return
    diags = m._m.diagnostics
    heads = diags if isinstance(diags, list) else [diags]
    bad = int(sum(d.get("gradient_nonfinite", 0) for d in heads))
    do = np.asarray(do)
    live = np.any(do != 0, axis=(-2, -1)) if do.ndim >= 2 else np.any(do != 0)   # per head
    def dead(g):   # per head: zero everywhere where ∂L/∂O is not
        g = np.asarray(g)
        return live & ~np.any(g != 0, axis=(-2, -1) if g.ndim >= 2 else None)
    failed = dead(grads[2])
    zero = [name for name, g in zip(("dQ", "dK", "dV"), grads) if np.any(failed & dead(g))]
    if bad or zero:
        import warnings
        said = [f"{bad} non-finite gradient entries (dQ, dK, dV together)"] if bad else []
        if zero:
            said.append(f"{', '.join(zero)} zero everywhere while ∂L/∂O is not")
        warnings.warn(f"{what}: {m._m.spec} under {m._storage} storage ({m._policy}): {'; '.join(said)}"
                      + _overflowed(heads)
                      + " (Method.diagnostics has the counts per intermediate)", RuntimeWarning, stacklevel=3)


# ---- the functions ------------------------------------------------------------------------------------------------

def methods():
    """Every registered method: name, summary, reference (the equation it implements), causal support, and its
    parameters (name, type, default, help)."""
    return _core.methods()


def canonical(spec, *, causal=False):
    """`spec` in canonical form (every parameter, defaults filled in), e.g. 'nystrom' -> 'nystrom:landmarks=64,...':
    checks it without running anything. ValueError for an unknown method or parameter, a value out of range, or
    (causal=True) a method that cannot honour the causal mask."""
    spec = _str("spec", spec, "nystrom:landmarks=64")
    base, precision, policy = _split_precision(spec, None, "eager")
    text = _core.canonical(base, _bool("causal", causal))
    if precision is None:
        return text
    storage, policy, _ = _precision(precision, policy, None)
    _core.Method(base, [], False, None, None, False, storage, policy)   # refused where the method does not emulate it
    return f"{text}@{precision}-{policy}"


def budget_families():
    """The method families swept against a budget, as error_vs_budget and the report sweep them: dicts with label,
    spec (prefix), param (the budget parameter), budgets, specs (one per budget), deployable (False for the
    analysis floors svd and cur) and causal (the method honours a causal mask)."""
    return _core.budget_families()


def sources():
    """The generated sources' names (generate())."""
    return _core.sources()


def apply(spec, q, k, v, *, causal=False, scale=None, seed=None, matrix=False, dtype=None, precision=None,
          policy="eager"):
    """The output of method `spec` (e.g. 'nystrom:landmarks=32') on Q, K, V: softmax attention's approximation
    P̃·V, shaped like Q with V's last dimension, in the inputs' dtype (or `dtype`).

    matrix=True also returns P̃ (memory-guarded): (output, P̃). seed (a non-negative integer) fills the spec's
    seed when it gives none; scale defaults to 1/sqrt(d). An output that is not finite raises ValueError.

    Method(spec).fit(q, k).output(v) in one call, the fit not kept (heads one at a time: memory holds one head's
    work); to apply one fit to many V, or to get its operator, diagnostics or spectrum, use Method.

    precision ('fp64', 'fp32', 'bf16', 'fp16') and policy ('eager', 'careful'): as for Method. Under bf16/fp16 a
    non-finite or all-zero output is returned with a RuntimeWarning (it is the finding), not raised.
    """
    spec = _str("spec", spec, "nystrom:landmarks=64")
    spec, precision, policy = _split_precision(spec, precision, policy)
    causal, matrix = _bool("causal", causal), _bool("matrix", matrix)
    scale, seed = _real("scale", scale, none=True), _seed(seed, none=True)
    storage, policy, dtype = _precision(precision, policy, dtype)
    if matrix and storage != "native":
        raise ValueError(f"apply(matrix=True): not under {storage} storage (the emulation rounds the output, not P̃, "
                         "which would be float32's); ask for the matrix without precision=")
    q, k, v = _inputs(dtype, q=q, k=k, v=v)
    m = Method._once(spec, causal, scale, seed, storage, policy)
    out = m._m.call(q, k, v, matrix, storage != "native")
    _warn_reduced(m, "apply")
    return out


def backward(spec, q, k, v, do, *, causal=False, scale=None, seed=None, dtype=None, precision=None, policy="eager"):
    """The gradients (dq, dk, dv) of method `spec`'s output P̃·V for the upstream gradient do = ∂L/∂O (shaped as the
    output): Method(spec).fit(q, k).backward(v, do) in one call. Exact attention's ('exact') is FlashAttention-2's
    backward in O(n) memory; see Method.backward for what the approximations hold fixed.

    precision and policy: as for apply (the backward emulated where the method's is: `attnlab methods` says which);
    under bf16/fp16 non-finite gradients are returned with a RuntimeWarning, not raised."""
    spec = _str("spec", spec, "nystrom:landmarks=64")
    spec, precision, policy = _split_precision(spec, precision, policy)
    causal = _bool("causal", causal)
    scale, seed = _real("scale", scale, none=True), _seed(seed, none=True)
    storage, policy, dtype = _precision(precision, policy, dtype)
    q, k, v, do = _inputs(dtype, q=q, k=k, v=v, do=do)
    m = Method._once(spec, causal, scale, seed, storage, policy)
    m._m.fit(q, k)
    grads = m._m.backward(v, do)
    _warn_gradients(m, "backward", grads, do)
    return grads


def compare(q, k, v, methods=None, *, causal=False, scale=None, seed=0, matrix_metrics="auto", matrix_limit=4096,
            spectral=True, repeats=5, warmup=1, frame=True, dtype=None, precision=None, policy="eager"):
    """Every method in `methods` (a spec, a list of specs, or None: every registered method, the causal ones when
    causal=True) against exact attention, per head: one row per (head, method).

    Columns: head_index (the head of a (heads, n, d) input; not "head", which would hide DataFrame.head), method,
    spec, dtype, n_q, n_k; the cost — time_s (the fastest of `repeats` timed calls after `warmup` untimed ones,
    compute + output, by the library's cost harness as the command and the benchmark time it), time_median_s,
    exact_time_s (exact attention on the same head, timed alike) and speedup = exact_time_s / time_s (> 1: faster
    than exact); the output errors (out_rel_fro, out_max_abs, cosines), the method's diagnostics and, for
    n ≤ matrix_limit (matrix_metrics='auto'; 'on', 'off'), the errors of P̃ (P_rel_fro, P_rel_spectral,
    P_mean_kl, P_mean_tv). A pandas DataFrame when pandas is installed and frame=True, else a list of dicts.

    precision='bf16' or 'fp16' (policy 'eager' or 'careful'; as for apply): every method runs in that emulated
    storage over float32 (the inputs taken as float32) against exact attention in float32: out_rel_fro and the
    cosines (left NaN where the output is not finite), round_rel_fro (against the method's own float32 run: the
    format's rounding), output_nonfinite, output_zero_rows and per intermediate overflow[...], underflow[...],
    nan[...]; columns precision and policy. No times and no P̃ errors there (the emulation's time is not the
    format's). A method whose output fails is a row, not an exception, and a RuntimeWarning names it. Specs may
    name their own precision instead ('linear@fp16', 'linear@fp16-careful', 'linear': one table, each compared in
    its own).
    """
    specs = _specs("methods", methods, "nystrom:landmarks=64", "every method")
    causal, spectral, frame = _bool("causal", causal), _bool("spectral", spectral), _bool("frame", frame)
    scale, seed = _real("scale", scale, none=True), _seed(seed)
    matrix_metrics = _str("matrix_metrics", matrix_metrics, "auto")
    matrix_limit = _int("matrix_limit", matrix_limit, 0)
    repeats, warmup = _int("repeats", repeats, 1), _int("warmup", warmup, 0)
    parts = [_split_precision(s, None, policy) for s in specs]
    if any(p is not None for _, p, _ in parts):
        # Specs naming their precision ('linear@fp16', 'linear@fp16-careful', beside a plain 'linear'): one table,
        # each group of one precision and policy compared on its own, the rows in the order given (head by head).
        if precision is not None:
            raise ValueError(f"methods: {', '.join(s for s in specs if '@' in s)} name their precision and "
                             f"precision={precision!r} is given too; give it one way")
        groups = {}
        for i, (base, p, pol) in enumerate(parts):   # policy= is for the specs naming a format: the plain ones
            groups.setdefault((p, pol if p is not None else "eager"), []).append((i, base))   # round nothing
        keyed = []
        for (p, pol), members in groups.items():
            got = compare(q, k, v, [b for _, b in members], causal=causal, scale=scale, seed=seed,
                          matrix_metrics=matrix_metrics, matrix_limit=matrix_limit, spectral=spectral,
                          repeats=repeats, warmup=warmup, frame=False, dtype=dtype, precision=p, policy=pol)
            keyed += [((r["head_index"], members[j % len(members)][0]), r) for j, r in enumerate(got)]
        records = [r for _, r in sorted(keyed, key=lambda x: x[0])]
        if frame:
            try:
                import pandas
                return pandas.DataFrame(records)
            except ImportError:
                pass
        return records
    storage, policy, dtype = _precision(precision, policy, dtype)
    q, k, v = _inputs(dtype, q=q, k=k, v=v)
    rows = _core.compare(q, k, v, specs, causal, scale, seed, matrix_metrics, matrix_limit, spectral, repeats,
                         warmup, frame, storage, policy)
    if storage != "native":
        records = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
        failed = sorted({r["spec"] for r in records
                         if r.get("output_nonfinite", 0) > 0 or r.get("output_zero_rows", 0) > 0})
        if failed:
            import warnings
            warnings.warn(f"compare: under {storage} storage ({policy}) the output of {', '.join(failed)} has "
                          "non-finite entries or all-zero rows (the columns output_nonfinite, output_zero_rows)",
                          RuntimeWarning, stacklevel=2)
    return rows


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
    q, k, v = _inputs(dtype, "plain", q=q, k=k, v=v)
    return _core.cost(q, k, v, spec, causal, scale, seed, repeats, warmup, memory)


def spectrum(q, k, *, top=None, causal=False, scale=None, solver="auto", tol=1e-9, dtype=None):
    """Singular values of the exact attention matrix P = softmax(scale·QKᵀ), descending, in float64: all of them
    (dense SVD, P materialized; memory-guarded) or the top `top`, matrix-free (block Krylov; solver 'block',
    'lanczos', 'dense' or 'auto'; tol relative to σ₁). Shape (top,) or (heads, top)."""
    top = _int("top", top, None, none=True)
    causal, scale = _bool("causal", causal), _real("scale", scale, none=True)
    solver, tol = _str("solver", solver, "auto"), _real("tol", tol)
    q, k = _inputs(dtype, "plain", q=q, k=k)
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
           seq=0, repeats=3, causal=False, quiet=False, threads=0, dtype=None, precision=None, policy="eager",
           costs="", costs_dtype="", exact_peer=""):
    """Writes a report directory (index.html, report.csv, summary.md) answering 'which approximation for my
    model?': per head the entropy, spectrum, every method's error against its measured cost at several budgets,
    the Pareto frontier and the cheapest method under `target` output error; per layer × head the recommendation
    and its speed-up. Input: q, k, v ((heads, n, d), one layer) or model_dir (an export such as
    data/attention/trained, several layers). Returns the path of index.html.

    precision='bf16' or 'fp16' (policy 'eager' or 'careful'): the recommendation for the format the model runs —
    every method's error is its emulated run in that format against exact float64 attention, a method that fails
    there is no candidate, and the summary says so (costs stay float32 on this CPU).

    costs='FILE.csv': recommend for the device the costs were measured on (tools/bench_gpu.py's table, or yours:
    columns method, budget, n, ms; optional d, dtype, pass, causal, status, device_name) instead of timing here;
    costs_dtype picks the table's format (default: precision's, else its only one, else fp32). Every sentence that
    quotes a cost names the device it was measured on.

    exact_peer='FILE.csv': tools/bench_exact_peer.py's table (attnlab's exact against PyTorch's fused
    scaled_dot_product_attention, measured on this CPU at the report's threads): the speed-ups and the keep-exact
    rule are then over the faster of the two, named in the summary."""
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
    storage, policy, dtype = _precision(precision, policy, dtype)
    if not model_dir:   # float16 arrays under bf16/fp16: converted to float32, exactly (as apply converts them);
        # 'fp32' / 'fp64' take the inputs in that dtype, as apply does (the report's errors are float64's on them)
        q, k, v = _inputs(dtype, "convert" if storage != "native" else "hint", q=q, k=k, v=v)
    costs, costs_dtype = _path("costs", costs), _str("costs_dtype", costs_dtype, "bf16")
    if costs and not os.path.isfile(costs):
        raise ValueError(f"report: costs={costs!r} is not a file")
    exact_peer = _path("exact_peer", exact_peer)
    if exact_peer and not os.path.isfile(exact_peer):
        raise ValueError(f"report: exact_peer={exact_peer!r} is not a file")
    return _core.report(q, k, v, model_dir, out, target, families, layers, seq, repeats, causal, quiet, threads,
                        storage, policy, costs, costs_dtype, exact_peer)


def vq_codebook(keys, codes=64, *, iters=20, seed=0, dtype=None):
    """A codebook for the `vq` method, fitted on training keys by the method's own k-means (k-means++ then up to
    `iters` Lloyd iterations, seeded by `seed`): a (codes, d) array in the keys' dtype (or `dtype`).

    keys is (n, d), or (m, n, d): m training windows, stacked as m·n keys. On one window's keys it is the codebook
    that 'vq:codes=C,seed=S' fits on that window (codebook=window, which sees the window's future keys). Fitted on
    other windows and saved, it is a fixed codebook held as a trained Transformer-VQ holds its own, with no
    look-ahead — the form for causal use:

        cb = attnlab.vq_codebook(train_keys, codes=64, seed=0)
        np.save("/tmp/cb.npy", cb)
        attnlab.apply("vq:codes=64,codebook=/tmp/cb.npy", q, k, v, causal=True)   # codes = cb.shape[0]

    The method reads the file once (again when it is rewritten); its d must be the keys'.
    """
    codes, iters, seed = _int("codes", codes, 1), _int("iters", iters, 0), _seed(seed)
    (keys,) = _inputs(dtype, "plain", keys=keys)
    return _core.vq_codebook(keys, codes, iters, seed)


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
    (a,) = _inputs(dtype, "plain", a=a)
    return _core._data_address(a)


# ---- Method: fit once, apply to many V ----------------------------------------------------------------------------

def _option(name, x):
    """A method parameter given as a keyword, as a spec writes it: true/false, an integer, a number (the shortest
    string that reads back the same float), or a choice's name."""
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, numbers.Integral):
        return str(int(x))
    if isinstance(x, numbers.Real):
        return repr(float(x))
    if isinstance(x, str):
        return x
    if isinstance(x, os.PathLike) and isinstance(os.fspath(x), str):
        return os.fspath(x)  # a file parameter (vq's codebook=PATH.npy)
    raise ValueError(f"{name} must be a number, True/False, a string or a path (a parameter of the method), got "
                     f"{_show(x)}")


def _core_attribute(name, doc):
    """A read-only property of Method: the compiled method's attribute `name` (attnlab._core.Method), with `doc`."""
    return property(lambda self: getattr(self._m, name), doc=doc)


class Method:
    """One attention method, built once from its spec, fitted once on (Q, K), then applied to many V.

    A method sees attention as a linear map of V: fitting it on Q and K builds the attention matrix it implies,
    P̃ (landmarks, random features, a codebook, a sparsity pattern: the data-dependent state); its output for
    values V is then P̃·V by the method's own fast path, for as many V as wanted without refitting.

        m = attnlab.Method("nystrom", landmarks=64)      # or Method("nystrom:landmarks=64")
        m.fit(q, k)                                      # returns m: Method(...).fit(q, k).output(v)
        o1, o2 = m.output(v1), m.output(v2)              # P̃·V, one fit
        y = m.apply(x); z = m.apply_transpose(x)         # P̃·X, P̃ᵀ·X: the operator, never forming P̃
        p = m.matrix()                                   # P̃ itself (memory-guarded)
        s = m.spectrum(top=8)                            # the top singular values of P̃
        m.diagnostics                                    # e.g. {'pinv_residual': 3.1e-07}

    spec is a method's spec string, `name[:key=value,...]` (methods() lists the names and parameters); the
    parameters may also be given as keywords, Method("nystrom", landmarks=64, pinv="svd") being
    Method("nystrom:landmarks=64,pinv=svd"): numbers, True/False, a choice's name, or a path (vq's codebook=).
    A parameter given both ways, an unknown method or parameter (with a did-you-mean suggestion), or a value out
    of its range is a ValueError here, before any data. causal=True asks for the causal mask (refused, with the
    reason, by a method that cannot honour it: it would leak the future); scale is the logit scale (default
    1/sqrt(d)); seed fills the spec's seed when it gives none (randomized methods; ignored by the others; giving it
    both ways is refused).

    Inputs are as for every attnlab function: (n, d) arrays, or (heads, n, d) to fit one method per head;
    numpy arrays, CPU tensors or array-likes; float32 or float64 (fit's q and k of one dtype, or dtype= to
    convert), kept: a float32 fit computes and answers in float32. V and X must then have the fitted dtype and
    layout; a 1-D v or x (after an (n, d) fit) is one column, and its result is 1-D. Results are numpy arrays.
    The GIL is released while C++ runs and Ctrl-C raises KeyboardInterrupt. A Method may be shared by threads:
    a call keeps the fit it started with even if another thread refits.
    """

    def __init__(self, spec, *, causal=False, scale=None, seed=None, precision=None, policy="eager", **options):
        """Builds the method from `spec` and the keyword parameters, checking them (nothing is fitted yet).

        precision: None (compute in the inputs' dtype), 'fp64', 'fp32' (natively in float64, float32: the inputs
        converted), or 'bf16', 'fp16': the method run as users run it in bfloat16 or float16, emulated exactly — its
        inputs and the tensors it materialises rounded to the format, products and sums accumulated in float32 —
        under `policy`: 'eager' (every intermediate stored in the format, as a straightforward transcription under
        .half() stores it) or 'careful' (accumulators, normalisers, softmax statistics and states kept in float32, as
        FlashAttention keeps them; 'careful' needs bf16 or fp16, where something is rounded). Which intermediates
        each policy rounds: attnlab.methods()' 'storage'; a method
        that does not emulate one refuses it here (ValueError). Results come back in float32, their values exact in
        the format; diagnostics gains per intermediate the entries that overflowed, underflowed to 0 or were NaN,
        and the output's non-finite entries and all-zero rows (a non-finite or zero output is returned with a
        RuntimeWarning, not raised: it is the finding)."""
        spec = _str("spec", spec, "nystrom:landmarks=64")
        spec, precision, policy = _split_precision(spec, precision, policy)
        causal = _bool("causal", causal)
        scale, seed = _real("scale", scale, none=True), _seed(seed, none=True)
        self._storage, self._policy, self._dtype = _precision(precision, policy, None)
        self._precision_name = precision
        opts = [(name, _option(name, value)) for name, value in options.items()]
        self._m = _core.Method(spec, opts, causal, scale, seed, True, self._storage, self._policy)

    @classmethod
    def _once(cls, spec, causal, scale, seed, storage="native", policy="eager"):
        """attnlab.apply's method: seed fills the spec's seed when it gives none (the spec's wins otherwise)."""
        self = cls.__new__(cls)
        spec, precision, spec_policy = _split_precision(spec, None, policy)
        dtype = np.float32 if storage != "native" else None   # the emulation accumulates in float32
        if precision is not None:   # a spec with '@FORMAT[-POLICY]' (attnlab.torch's swaps): '@fp64' computes in
            storage, policy, dtype = _precision(precision, spec_policy, None)   # float64, as apply() does
        self._storage, self._policy, self._dtype = storage, policy, dtype
        self._precision_name = precision if precision is not None else {"bf16": "bf16", "fp16": "fp16"}.get(storage)
        self._m = _core.Method(spec, [], causal, scale, seed, False, storage, policy)
        return self

    # ---- what it is --------------------------------------------------------------------------------------------

    @property
    def spec(self):
        """The canonical spec, every parameter written out (defaults and the seed included), and the precision
        when one was given ('...@bf16-careful', as canonical() writes it): replays this method."""
        if self._precision_name is None:
            return self._m.spec
        return f"{self._m.spec}@{self._precision_name}-{self._policy}"

    name = _core_attribute("name", "The method's name ('nystrom', ...).")

    causal = _core_attribute("causal", "Whether the causal mask is applied (the constructor's causal=).")

    scale = _core_attribute("scale", "The logit scale given to the constructor, or None for the default 1/sqrt(d).")

    supports_causal = _core_attribute(
        "supports_causal",
        "Whether this method (with these parameters) can honour a causal mask.")

    lookahead = _core_attribute(
        "lookahead",
        """State fitted on all keys before the attention (VQ's codebook with codebook=window, by k-means on every
        key), described; '' when there is none (VQ with a fixed codebook=PATH.npy: vq_codebook()). With
        causal=True the attention given that state is causal; the state is not.""")

    # ---- the fit -----------------------------------------------------------------------------------------------

    fitted = _core_attribute(
        "fitted",
        "True once fit(q, k) (or a call m(q, k, v)) has succeeded; a failed fit leaves the method unfitted.")

    @property
    def dtype(self):
        """The dtype of the fit (numpy float32 or float64: q's), or None before fit()."""
        dt = self._m.dtype
        return None if dt is None else np.dtype(dt)

    def _fit_shape(self):
        return self._m.fit_shape or (None, None, None, None, None)

    @property
    def n_q(self):
        """The number of queries fitted on (P̃'s rows), or None before fit()."""
        return self._fit_shape()[1]

    @property
    def n_k(self):
        """The number of keys fitted on (P̃'s columns; the rows V and X need), or None before fit()."""
        return self._fit_shape()[2]

    @property
    def heads(self):
        """The number of heads of a (heads, n, d) fit; None after an (n, d) fit or before fit()."""
        return self._fit_shape()[0]

    @property
    def shape(self):
        """P̃'s shape: (n_q, n_k), or (heads, n_q, n_k) after a batched fit; None before fit()."""
        h, n_q, n_k, _, _ = self._fit_shape()
        if n_q is None:
            return None
        return (n_q, n_k) if h is None else (h, n_q, n_k)

    diagnostics = _core_attribute(
        "diagnostics",
        """The method's own numbers, name -> float (Nyström's pinv_residual ‖I − AZ‖_F, ...; {} for methods that
        have none); after a (heads, n, d) fit, a list of such dicts, one per head. Needs fit().""")

    rank_bound = _core_attribute(
        "rank_bound",
        """An upper bound on rank(P̃) (landmarks, features, ...; the largest over heads), or None when the method
        is not rank-limited. Needs fit().""")

    status = _core_attribute(
        "status",
        """'success', or what went wrong in the fit without an error (an inner iteration that did not converge,
        a numerical issue), with the heads it happened on. Needs fit().""")

    def fit(self, q, k, *, dtype=None):
        """Fits the method on Q (n_q, d) and K (n_k, d) — or (heads, n, d) each, one fit per head — and returns
        self. Refits when called again (the previous fit is dropped). Refused before any work, as a ValueError:
        shapes that disagree, NaN or infinite inputs, a budget beyond the sequence (landmarks > n, ...), more
        memory than is available. Computes in q's dtype; dtype= ('float32', 'float64') converts both."""
        q, k = _inputs(self._dtype_for(dtype), q=q, k=k)
        self._m.fit(q, k)
        return self

    def __call__(self, q, k, v, *, dtype=None):
        """fit(q, k), then output(v): P̃·V, every input checked before the work. The fit stays for more V."""
        q, k, v = _inputs(self._dtype_for(dtype), q=q, k=k, v=v)
        out = self._m.call(q, k, v, False, True)
        _warn_reduced(self, "Method")
        return out

    def _dtype_for(self, dtype):
        """The dtype the constructor's precision fixes (dtype= must agree), else dtype=."""
        if self._dtype is None:
            return dtype
        if dtype is not None and _dtype(dtype) != np.dtype(self._dtype):
            raise ValueError(f"dtype={dtype!r} contradicts the method's precision, which computes in "
                             f"{np.dtype(self._dtype)}; leave dtype out")
        return self._dtype

    # ---- the fitted method -------------------------------------------------------------------------------------

    def _native_operator(self, what):
        """The operator's calls (apply, apply_transpose, matrix, spectrum) are native: refused under bf16/fp16,
        where they would answer for float32, not for the format the method was asked to run in."""
        if self._storage != "native":
            raise ValueError(f"{what}: not under {self._storage} storage: the emulation covers output() and "
                             "backward(), not the operator (it would be float32's P̃, not the format's); fit a "
                             "Method without precision= (or with 'fp32') for it")

    def _on_operand(self, x, name, what, call):
        """call(x) on the fitted method, x checked first: fitted, x in the fitted dtype; a 1-D x after an (n, d) fit
        is one column, and the result is then 1-D too."""
        if not self._m.fitted:
            raise ValueError(f"{what}: the method is not fitted; call fit(q, k) first")
        a = _array(x, name)
        dt = np.dtype(self._m.dtype)
        if self._dtype is not None and (a.dtype in _FLOATS or a.dtype == np.float16):
            a = a.astype(dt, copy=False)  # the precision says how it is stored
        if a.dtype != dt:
            raise ValueError(f"{what}: {name} is {a.dtype} but the method was fitted in {dt}; pass "
                             f"{name}.astype('{dt}'), or fit on {a.dtype} q and k")
        vector = a.ndim == 1 and self.heads is None
        out = call(a[:, None] if vector else a)
        return out[:, 0] if vector else out

    def output(self, v):
        """The output for values V: P̃·V by the method's fast path, (n_q, d_v) from V (n_k, d_v) — (heads, n_q,
        d_v) after a batched fit — in the fitted dtype. V needs n_k rows and the fitted dtype. Needs fit()."""
        out = self._on_operand(v, "v", "output(v)", self._m.output)
        _warn_reduced(self, "output(v)")
        return out

    def backward(self, v, do):
        """The backward pass of output(v): for the upstream gradient do = ∂L/∂O (n_q, d_v), the vector–Jacobian
        products (dq, dk, dv) of this method's own forward, shaped as the fit's Q, K and as V — (heads, n, ·) after
        a batched fit — in the fitted dtype. Random parameters (features, projections, sampled landmarks) and
        discrete choices (buckets, top-u rows, codeword assignments) are held at the fit's values; each method's
        conventions are in attnlab.methods() ('backward') and the README. Methods without one (svd, cur: analysis
        floors) raise ValueError saying why. Needs fit()."""
        if not self._m.fitted:
            raise ValueError("backward(v, do): the method is not fitted; call fit(q, k) first")
        dt = np.dtype(self._m.dtype)
        arrays = []
        for name, x in (("v", v), ("do", do)):
            a = _array(x, name)
            if self._dtype is not None and (a.dtype in _FLOATS or a.dtype == np.float16):
                a = a.astype(dt, copy=False)  # the precision says how it is stored
            if a.dtype != dt:
                raise ValueError(f"backward(v, do): {name} is {a.dtype} but the method was fitted in {dt}; pass "
                                 f"{name}.astype('{dt}'), or fit on {a.dtype} q and k")
            arrays.append(a)
        grads = self._m.backward(*arrays)
        _warn_gradients(self, "backward(v, do)", grads, arrays[1])
        return grads

    def apply(self, x):
        """P̃·X for X (n_k, b) — or (heads, n_k, b) — through the method's operator, never forming P̃: equal to
        output(x) up to rounding (output may take a faster path). Needs fit(); native only (not under bf16/fp16)."""
        self._native_operator("apply(x)")
        return self._on_operand(x, "x", "apply(x)", lambda a: self._m.apply(a, False))

    def apply_transpose(self, x):
        """P̃ᵀ·X for X (n_q, b) — or (heads, n_q, b) — through the method's operator, never forming P̃: with
        apply(), what iterative solvers (svds, LSQR) need. Needs fit(); native only (not under bf16/fp16)."""
        self._native_operator("apply_transpose(x)")
        return self._on_operand(x, "x", "apply_transpose(x)", lambda a: self._m.apply(a, True))

    def matrix(self):
        """P̃ materialized, (n_q, n_k) — or (heads, n_q, n_k) — in the fitted dtype: for small problems; refused
        (ValueError) when it would not fit in memory. Needs fit(); native only (not under bf16/fp16)."""
        self._native_operator("matrix()")
        return self._m.matrix()

    def spectrum(self, top=None, *, solver="auto", tol=1e-9):
        """Singular values of P̃, descending, in float64: all of them (top=None: a dense SVD of P̃, memory-guarded)
        or the top `top`, matrix-free on the method's operator (block Krylov; solver 'block', 'lanczos', 'dense'
        or 'auto': dense for n_k ≤ 512; tol relative to σ₁). Shape (top,), or (heads, top) after a batched fit.
        Needs fit(); native only (not under bf16/fp16)."""
        self._native_operator("spectrum()")
        top = _int("top", top, None, none=True)
        solver, tol = _str("solver", solver, "auto"), _real("tol", tol)
        return self._m.spectrum(top, solver, tol)

    def aslinearoperator(self):
        """P̃ as a scipy.sparse.linalg.LinearOperator (matvec/matmat: apply, rmatvec/rmatmat: apply_transpose),
        for scipy's solvers (svds, eigs, lsqr, ...). Needs an (n, d) fit and scipy."""
        self._native_operator("aslinearoperator()")
        from scipy.sparse.linalg import LinearOperator
        if not self._m.fitted:
            raise ValueError("aslinearoperator(): the method is not fitted; call fit(q, k) first")
        if self.heads is not None:
            raise ValueError(f"aslinearoperator(): the method was fitted on {self.heads} heads; a LinearOperator is "
                             "one matrix: fit one head (q[h], k[h])")
        dt = self.dtype
        return LinearOperator((self.n_q, self.n_k), dtype=dt,
                              matvec=lambda x: self.apply(np.ascontiguousarray(x, dtype=dt)),
                              rmatvec=lambda x: self.apply_transpose(np.ascontiguousarray(x, dtype=dt)),
                              matmat=lambda x: self.apply(np.ascontiguousarray(x, dtype=dt)),
                              rmatmat=lambda x: self.apply_transpose(np.ascontiguousarray(x, dtype=dt)))

    def __repr__(self):
        args = [repr(self._m.short_spec)]
        if self.causal:
            args.append("causal=True")
        if self.scale is not None:
            args.append(f"scale={self.scale!r}")
        if self._precision_name is not None:
            args.append(f"precision={self._precision_name!r}")
        if self._policy != "eager":
            args.append(f"policy={self._policy!r}")
        text = f"attnlab.Method({', '.join(args)})"
        if not self.fitted:
            return f"<{text}, not fitted>"
        h, n_q, n_k, d, _ = self._fit_shape()
        heads = "" if h is None else f"{h} heads, "
        return f"<{text}, fitted: {self.dtype}, {heads}n_q={n_q}, n_k={n_k}, d={d}>"
