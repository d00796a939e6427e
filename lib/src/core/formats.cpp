// Storage formats of reduced precision: exact rounding from double (formats.hpp).
#include "attnlab/core/formats.hpp"

#include "attnlab/core/error.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace attnlab {
namespace {

struct Layout {
  int p;     // significand bits, the implicit one included
  int emin;  // exponent of the smallest normal
  int emax;  // exponent of the largest normal
  int ebits;
};

Layout layout(Format f) {
  switch (f) {
    case Format::fp64: return {53, -1022, 1023, 11};
    case Format::fp32: return {24, -126, 127, 8};
    case Format::bf16: return {8, -126, 127, 8};
    case Format::fp16: return {11, -14, 15, 5};
  }
  return {53, -1022, 1023, 11};
}

/// The format's constants, computed once: round_to runs once per stored entry of the bounds' analyses (ldexp's calls
/// were a tenth of the precision experiment's time).
struct Constants {
  double unit_roundoff, half_min_subnormal, largest_finite;
};
const Constants& constants(Format f) {
  static const auto table = [] {
    std::array<Constants, 4> t{};
    for (Format g : {Format::fp64, Format::fp32, Format::bf16, Format::fp16}) {
      const Layout l = layout(g);
      t[std::size_t(g)] = {std::ldexp(1.0, -l.p), std::ldexp(1.0, l.emin - l.p),
                           std::ldexp(2.0 - std::ldexp(1.0, 1 - l.p), l.emax)};
    }
    return t;
  }();
  return table[std::size_t(f)];
}

}  // namespace

double unit_roundoff(Format f) { return constants(f).unit_roundoff; }
double half_min_subnormal(Format f) { return constants(f).half_min_subnormal; }
double largest_finite(Format f) { return constants(f).largest_finite; }

std::string format_name(Format f) {
  switch (f) {
    case Format::fp64: return "fp64";
    case Format::fp32: return "fp32";
    case Format::bf16: return "bf16";
    case Format::fp16: return "fp16";
  }
  return "fp64";
}

Format parse_format(const std::string& name) {
  if (name == "fp64" || name == "float64") return Format::fp64;
  if (name == "fp32" || name == "float32") return Format::fp32;
  if (name == "bf16" || name == "bfloat16") return Format::bf16;
  if (name == "fp16" || name == "float16") return Format::fp16;
  throw Error("unknown format '" + name + "'; valid: fp64, fp32, bf16, fp16");
}

double round_to(Format f, double x) {
  if (f == Format::fp64 || x == 0 || !std::isfinite(x)) return x;
  const Layout l = layout(f);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  // The leading bit's exponent (a subnormal double, below every format's range, reads as −1023 and rounds to ±0).
  const int e = int((bits >> 52) & 0x7ff) - 1023;
  if (e > l.emax) return std::copysign(std::numeric_limits<double>::infinity(), x);  // ≥ 2^(emax+1): rounds past
  // The quantum (last significand bit) of the format's values near x: normals p − 1 bits below the leading bit,
  // subnormals the fixed step 2^(emin − p + 1).
  const int q = std::max(e, l.emin) - (l.p - 1);
  // |x| rounded to a multiple of 2^q, ties to even, in the default rounding mode, by one addition: c = 1.5·2^(q+52)
  // puts |x| + c in [2^(q+52), 2^(q+53)) (|x| < 2^(e+1) ≤ 2^(q+p) ≤ 0.5·2^(q+52) for p ≤ 51), whose doubles are
  // exactly the multiples of 2^q, and c/2^q is even, so the tie goes where |x|/2^q's even neighbour is; subtracting
  // c is exact. The same value as nearbyint(|x|·2^−q)·2^q without libm's calls (tests/test_precision.cpp:
  // RoundTo.OneAdditionIsTheQuantumRounding).
  const std::uint64_t c_bits = (std::uint64_t(q + 52 + 1023) << 52) | (std::uint64_t(1) << 51);
  double c = 0;
  std::memcpy(&c, &c_bits, sizeof c);
  const double r = std::copysign((std::fabs(x) + c) - c, x);
  if (std::fabs(r) > constants(f).largest_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

std::uint16_t half_bits(Format f, double x) {
  require(f == Format::bf16 || f == Format::fp16, "half_bits: {} is not a 16-bit format", format_name(f));
  const Layout l = layout(f);
  const int fbits = l.p - 1;
  const double r = round_to(f, x);
  const std::uint16_t sign = std::signbit(r) ? std::uint16_t(0x8000) : std::uint16_t(0);
  const std::uint16_t inf_exp = std::uint16_t(((1u << l.ebits) - 1u) << fbits);
  if (std::isnan(r)) return std::uint16_t(sign | inf_exp | (1u << (fbits - 1)));  // a quiet NaN
  if (std::isinf(r)) return std::uint16_t(sign | inf_exp);
  const double a = std::fabs(r);
  if (a == 0) return sign;
  int e2 = 0;
  std::frexp(a, &e2);
  const int e = e2 - 1;
  if (e < l.emin)  // subnormal: fraction = a / 2^(emin − fbits), exponent field 0
    return std::uint16_t(sign | std::uint16_t(std::ldexp(a, -(l.emin - fbits))));
  const int bias = (1 << (l.ebits - 1)) - 1;
  const auto frac = std::uint16_t(std::ldexp(a, fbits - e) - std::ldexp(1.0, fbits));
  return std::uint16_t(sign | std::uint16_t((e + bias) << fbits) | frac);
}

double from_half_bits(Format f, std::uint16_t bits) {
  require(f == Format::bf16 || f == Format::fp16, "from_half_bits: {} is not a 16-bit format", format_name(f));
  const Layout l = layout(f);
  const int fbits = l.p - 1, bias = (1 << (l.ebits - 1)) - 1;
  const int exp = (bits >> fbits) & ((1 << l.ebits) - 1);
  const int frac = bits & ((1 << fbits) - 1);
  const double s = (bits & 0x8000) ? -1.0 : 1.0;
  if (exp == (1 << l.ebits) - 1) return frac ? std::numeric_limits<double>::quiet_NaN() : s * HUGE_VAL;
  if (exp == 0) return s * std::ldexp(double(frac), l.emin - fbits);
  return s * std::ldexp(double(frac) + std::ldexp(1.0, fbits), exp - bias - fbits);
}

}  // namespace attnlab
