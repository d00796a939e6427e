// Emulated storage precision: names, the float32 → bf16 / fp16 rounding by bit operations, the tallies
// (core/precision.hpp).
#include "attnlab/core/precision.hpp"

#include "attnlab/core/error.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace attnlab {

std::string storage_name(Storage s) {
  switch (s) {
    case Storage::native: return "native";
    case Storage::bf16: return "bf16";
    case Storage::fp16: return "fp16";
  }
  return "native";
}

Storage parse_storage(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return Storage::bf16;
  if (name == "fp16" || name == "float16") return Storage::fp16;
  if (name == "native" || name == "fp32" || name == "float32" || name == "fp64" || name == "float64")
    return Storage::native;
  throw Error("unknown precision '" + name + "'; valid: fp64, fp32, bf16, fp16");
}

std::string policy_name(Policy p) { return p == Policy::eager ? "eager" : "careful"; }

Policy parse_policy(const std::string& name) {
  if (name == "eager") return Policy::eager;
  if (name == "careful") return Policy::careful;
  throw Error("unknown policy '" + name + "'; valid: eager (every intermediate stored in the format), careful "
              "(accumulators, normalisers, softmax statistics and states kept in float32)");
}

Format storage_format(Storage s) {
  require(s != Storage::native, "storage_format: native storage has no reduced format");
  return s == Storage::bf16 ? Format::bf16 : Format::fp16;
}

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// bfloat16 keeps float32's sign and exponent and the top 7 fraction bits: add half an ulp of the kept part (less
/// one, plus the kept part's last bit: ties to even) and clear the 16 low bits. A carry into the exponent is the
/// correct rounding up, to ±inf past the largest finite value; subnormals are bfloat16's own. NaN stays NaN (its
/// quiet bit is kept).
float round_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // ±inf, NaN
  const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return from_bits(r);
}

/// IEEE binary16: the quantum (last bit) of the format near x is 2^(max(e, −14) − 10) for x's exponent e; x over the
/// quantum is exact in float32 (a power-of-two scaling, below 2^11 in magnitude) and nearbyint rounds it to nearest,
/// ties to even (the default rounding mode); times the quantum it is exact again. Past 65504 (the largest finite),
/// ±inf.
float round_fp16(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // ±inf, NaN
  const int e = int((u >> 23) & 0xffu) - 127;  // float32 subnormals (field 0) give −127: below fp16's range
  const int q = (e < -14 ? -14 : e) - 10;      // −24 … 117: 2^q and 2^−q are normal float32
  const float up = from_bits(std::uint32_t(127 - q) << 23), down = from_bits(std::uint32_t(127 + q) << 23);
  const float r = std::nearbyint(x * up) * down;
  if (std::fabs(r) > 65504.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return r;
}

}  // namespace

float round_stored(Storage s, float x) {
  switch (s) {
    case Storage::native: return x;
    case Storage::bf16: return round_bf16(x);
    case Storage::fp16: return round_fp16(x);
  }
  return x;
}

RoundingTally round_in_place(Storage s, float* x, std::size_t n) {
  RoundingTally t;
  t.entries = n;
  if (s == Storage::native) return t;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = x[i];
    const float r = s == Storage::bf16 ? round_bf16(a) : round_fp16(a);
    if (std::isnan(a)) ++t.nan;
    else if (std::isinf(r) && std::isfinite(a)) ++t.overflow;
    else if (r == 0.0f && a != 0.0f) ++t.underflow;
    x[i] = r;
  }
  return t;
}

void RoundingLog::clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
}

void RoundingLog::add(const char* what, Held held, const RoundingTally& t) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (Entry& e : entries_)
    if (e.what == what) {
      e.tally += t;
      return;
    }
  entries_.push_back({what, held, t});
}

std::vector<RoundingLog::Entry> RoundingLog::entries() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

}  // namespace attnlab
