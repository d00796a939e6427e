// Storage formats of reduced precision, emulated exactly: a value rounded to the format as the hardware stores it
// (IEEE 754 round to nearest, ties to even; overflow to ±inf; subnormals as the format has them), held in a wider
// type. The first piece of per-call precision (issue "Reduced precision"): methods will round the tensors they
// materialise with round_to while products and reductions accumulate in float32.
//
//   format   significand bits p (with the implicit one)   exponents of normals   largest finite      subnormal step
//   fp64     53                                           −1022 … 1023           (2 − 2⁻⁵²)·2¹⁰²³    2⁻¹⁰⁷⁴
//   fp32     24                                           −126 … 127             (2 − 2⁻²³)·2¹²⁷     2⁻¹⁴⁹
//   bf16     8  (bfloat16: float32's exponent)            −126 … 127             (2 − 2⁻⁷)·2¹²⁷      2⁻¹³³
//   fp16     11 (IEEE binary16)                           −14 … 15               65504               2⁻²⁴
#pragma once

#include <cstdint>
#include <string>

namespace attnlab {

enum class Format { fp64, fp32, bf16, fp16 };

/// The format's name as specs and the command write it: "fp64", "fp32", "bf16", "fp16".
std::string format_name(Format f);
/// The format a name gives (also "float64", "float32", "bfloat16", "float16"); an unknown name is an Error.
Format parse_format(const std::string& name);

/// The format's unit roundoff u = 2^−p (bf16 2⁻⁸, fp16 2⁻¹¹: |fl(x) − x| ≤ u·|x| in the normal range), half its
/// smallest subnormal η (bf16 2⁻¹³⁴, fp16 2⁻²⁵: the absolute error below it) and its largest finite value (bf16
/// 3.39e38, fp16 65504) — the constants the rounding-error bounds take (analysis/rounding_bound.hpp).
double unit_roundoff(Format f);
double half_min_subnormal(Format f);
double largest_finite(Format f);

/// x rounded to the format, directly from double (never through float32: rounding twice can differ from rounding
/// once), returned as a double that the format represents exactly. NaN stays NaN, ±inf and ±0 stay.
double round_to(Format f, double x);

/// The format's 16-bit pattern of x (bf16 and fp16 only): sign, exponent, fraction as the format stores them.
std::uint16_t half_bits(Format f, double x);
/// The value of a 16-bit pattern of bf16 or fp16.
double from_half_bits(Format f, std::uint16_t bits);

}  // namespace attnlab
