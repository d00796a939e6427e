"""Storage formats of reduced precision (core/formats.hpp): attnlab's rounding from double to fp16, bf16 and fp32,
bit for bit — fp16 against numpy's float16 over all 2¹⁶ patterns, the midpoints between neighbours (ties) and the
doubles just beside them, overflow and subnormals; bf16 against a reference written here in exact rational
arithmetic (fractions.Fraction: nearest representable value, ties to the even pattern, overflow to ±inf at
max + ½ulp); fp32 against numpy's float32."""
import math
from fractions import Fraction

import numpy as np
import pytest

import attnlab
from attnlab import _core

ALL = np.arange(1 << 16, dtype=np.uint16)


def probes(values):
    """Every finite value, the midpoints between consecutive ones (of one sign: the grid is symmetric), and the
    doubles just below and above each midpoint and each value."""
    v = np.unique(values[np.isfinite(values)])
    pos = v[v > 0]
    mids = (pos[:-1] + pos[1:]) / 2           # exact in double: neighbours differ in the format's few bits
    mids = np.concatenate([[pos[0] / 2], mids])   # half the smallest subnormal: a tie with zero
    core = np.concatenate([v, mids, -mids])
    return np.concatenate([core, np.nextafter(core, np.inf), np.nextafter(core, -np.inf)])


def test_fp16_equals_numpy_bit_for_bit():
    values = ALL.view(np.float16).astype(np.float64)
    x = np.concatenate([probes(values), [65504.0, 65519.99, 65520.0, 65536.0, 1e6, -65520.0, 2.0 ** -25,
                                         2.0 ** -25 * (1 + 2 ** -40), 3 * 2.0 ** -26, 0.0, -0.0, np.inf, -np.inf]])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    got = _core._round_to(x, "fp16")
    assert np.array_equal(got, want.astype(np.float64))
    assert np.array_equal(np.signbit(got), np.signbit(want))   # −0 stays −0: rounding keeps the sign
    assert np.array_equal(_core._half_bits(x, "fp16"), want.view(np.uint16))
    assert np.isnan(_core._round_to(np.array([np.nan]), "fp16")).all()
    # every pattern read back: numpy's value; and written again: the same pattern (NaNs apart)
    back = _core._from_half_bits(ALL, "fp16")
    ok = ~np.isnan(values)
    assert np.array_equal(back[ok], values[ok]) and np.isnan(back[~ok]).all()
    assert np.array_equal(_core._half_bits(back[ok], "fp16"), ALL[ok])


def bf16_values():
    """The value of every bf16 pattern, written here from the format's definition (not from attnlab)."""
    out = []
    for b in range(1 << 16):
        sign, exp, frac = (-1) ** (b >> 15), (b >> 7) & 0xFF, b & 0x7F
        if exp == 0xFF:
            out.append(math.nan if frac else sign * math.inf)
        elif exp == 0:
            out.append(sign * math.ldexp(frac, -126 - 7))
        else:
            out.append(sign * math.ldexp(128 + frac, exp - 127 - 7))
    return np.array(out)


def bf16_reference(x, finite_sorted, patterns):
    """x rounded to bf16 in exact arithmetic: the nearest finite value, a tie to the even pattern, ±inf from
    max + ½ulp on."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    big = Fraction(finite_sorted[-1])
    half_ulp = Fraction(2) ** (127 - 8)   # half of the top binade's step 2^(127 − 7)
    fx = Fraction(x)
    if abs(fx) >= big + half_ulp:
        return math.copysign(math.inf, x)
    i = int(np.searchsorted(finite_sorted, x))
    cands = [finite_sorted[j] for j in (i - 1, i) if 0 <= j < len(finite_sorted)]
    dist = [abs(Fraction(c) - fx) for c in cands]
    best = min(dist)
    tied = [c for c, d in zip(cands, dist) if d == best]
    if len(tied) == 2:
        tied = [c for c in tied if patterns[c] % 2 == 0]
    r = tied[0]
    return math.copysign(0.0, x) if r == 0 else r


def test_bf16_equals_an_exact_reference_bit_for_bit():
    values = bf16_values()
    assert np.array_equal(_core._from_half_bits(ALL, "bf16")[~np.isnan(values)], values[~np.isnan(values)])
    finite = np.unique(values[np.isfinite(values)])
    patterns = {}
    for b, v in zip(ALL, values):
        if np.isfinite(v) and (v not in patterns or v == 0):
            patterns[float(v)] = int(b) & 0x7FFF if v >= 0 else int(b)   # the magnitude's pattern decides the tie
    x = np.concatenate([probes(values), [3.4e38, 3.3895313892515355e38, 3.3961775292304513e38, 1e39, 2.0 ** -134,
                                         2.0 ** -134 * 1.5, 2.0 ** -133, 0.0, -0.0]])
    got = _core._round_to(x, "bf16")
    want = np.array([bf16_reference(float(v), finite, patterns) for v in x])
    assert np.array_equal(got, want), x[got != want][:5]
    assert np.array_equal(np.signbit(got), np.signbit(want))
    # the stored pattern of each rounded value is the pattern of that value
    ok = np.isfinite(values)
    assert np.array_equal(_core._half_bits(values[ok], "bf16"), ALL[ok])


def test_fp32_equals_numpy_and_fp64_is_the_identity():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000) * 10.0 ** rng.integers(-45, 39, 10000), [3.4028235677973366e38,
                        3.4028235677973366e38 * (1 + 2 ** -25), 1e39, 2.0 ** -150, 2.0 ** -149, 1.5 * 2.0 ** -149]])
    x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)])
    with np.errstate(over="ignore"):
        want = x.astype(np.float32).astype(np.float64)
    assert np.array_equal(_core._round_to(x, "fp32"), want)
    assert np.array_equal(_core._round_to(x, "fp64"), x)


def test_a_format_is_named_or_refused():
    assert np.array_equal(_core._round_to(np.array([1 + 2 ** -9]), "bfloat16"), [1.0])
    with pytest.raises(Exception, match="unknown format 'fp8'"):
        _core._round_to(np.array([1.0]), "fp8")
    with pytest.raises(Exception, match="not a 16-bit format"):
        _core._half_bits(np.array([1.0]), "fp32")
