// Storage formats of reduced precision: exact rounding from double (formats.hpp).
#include "attnlab/core/formats.hpp"

#include "attnlab/core/error.hpp"

#include <algorithm>
#include <cmath>
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

}  // namespace

double unit_roundoff(Format f) { return std::ldexp(1.0, -layout(f).p); }
double half_min_subnormal(Format f) { return std::ldexp(1.0, layout(f).emin - layout(f).p); }
double largest_finite(Format f) {
  const Layout l = layout(f);
  return std::ldexp(2.0 - std::ldexp(1.0, 1 - l.p), l.emax);
}

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
  int e2 = 0;
  std::frexp(x, &e2);  // |x| = m·2^e2, m in [0.5, 1): the leading bit's exponent is e2 − 1
  // The quantum (last significand bit) of the format's values near x: normals p − 1 bits below the leading bit,
  // subnormals the fixed step 2^(emin − p + 1).
  const int q = std::max(e2 - 1, l.emin) - (l.p - 1);
  // x·2^−q is exact (a power of two) and at most 2^p in magnitude: nearbyint rounds it to nearest, ties to even, in
  // the default rounding mode, exactly as the format stores it; the result times 2^q is exact too.
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
  const double largest = largest_finite(f);
  if (std::fabs(r) > largest) return std::copysign(std::numeric_limits<double>::infinity(), x);
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
