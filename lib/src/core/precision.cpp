// Emulated storage precision: names, the float32 → bf16 / fp16 rounding by bit operations, the tallies
// (core/precision.hpp).
#include "attnlab/core/precision.hpp"

#include "attnlab/core/error.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

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

namespace {

/// One entry's tally, as RoundingTally says: NaN when stored, ±inf when stored (rounded there, or already from the
/// float32 arithmetic: an overflow all the same, which counting only the rounding's would hide in bf16), nonzero to 0.
void tally_one(float a, float r, RoundingTally& t) {
  if (std::isnan(a)) ++t.nan;
  else if (std::isinf(r)) ++t.overflow;
  else if (r == 0.0f && a != 0.0f) ++t.underflow;
}

#if defined(__AVX2__) && defined(__F16C__)
/// Eight entries at a time (x86-64-v3 and later: AVX2 and F16C), the same bits as round_bf16 / round_fp16 per entry
/// (tests/test_precision.cpp, RoundInPlace.EqualsTheScalarRounding): the storing sits inside every emulated kernel, so
/// its speed is the emulation's (a fifth of the precision experiment's time, scalar). bf16 is round_bf16's integer
/// rounding on eight lanes; fp16 is the hardware's IEEE conversion to binary16 and back (vcvtps2ph, round to nearest
/// even from the float32 value — one rounding, as round_fp16's; subnormals, ±0 and the overflow to ±inf as binary16
/// has them), with a NaN's own bits kept as round_fp16 keeps them.
__m256 round8(Storage s, __m256 a) {
  if (s == Storage::bf16) {
    const __m256i u = _mm256_castps_si256(a), exp = _mm256_set1_epi32(0x7f800000);
    const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(u, exp), exp);  // ±inf, NaN: kept
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd),
                                       _mm256_set1_epi32(int(0xffff0000u)));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(r, u, special));
  }
  const __m256 r = _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

/// The tally of eight entries: lane masks, counted.
void tally8(__m256 a, __m256 r, RoundingTally& t) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000)), zero = _mm256_setzero_ps();
  const __m256 nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
  const __m256 r_inf = _mm256_cmp_ps(_mm256_and_ps(r, abs_mask), inf, _CMP_EQ_OQ);
  const __m256 under = _mm256_and_ps(_mm256_cmp_ps(r, zero, _CMP_EQ_OQ), _mm256_cmp_ps(a, zero, _CMP_NEQ_OQ));
  t.nan += std::uint64_t(__builtin_popcount(unsigned(_mm256_movemask_ps(nan))));
  t.overflow += std::uint64_t(__builtin_popcount(unsigned(_mm256_movemask_ps(r_inf))));
  // (a NaN stays NaN, never ±inf nor 0: the three masks are disjoint, as tally_one's branches)
  t.underflow += std::uint64_t(__builtin_popcount(unsigned(_mm256_movemask_ps(under))));
}
#endif

}  // namespace

RoundingTally round_in_place(Storage s, float* x, std::size_t n) {
  RoundingTally t;
  t.entries = n;
  if (s == Storage::native) return t;
  std::size_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i), r = round8(s, a);
    tally8(a, r, t);
    _mm256_storeu_ps(x + i, r);
  }
#endif
  for (; i < n; ++i) {
    const float a = x[i], r = s == Storage::bf16 ? round_bf16(a) : round_fp16(a);
    tally_one(a, r, t);
    x[i] = r;
  }
  return t;
}

void RoundingLog::clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  fitted_.clear();
  output_.clear();
}

void RoundingLog::fitted() {
  const std::lock_guard<std::mutex> lock(mutex_);
  fitted_ = output_ = entries_;
}

void RoundingLog::begin_output() {
  const std::lock_guard<std::mutex> lock(mutex_);
  entries_ = fitted_;
}

void RoundingLog::end_output() {
  const std::lock_guard<std::mutex> lock(mutex_);
  output_ = entries_;
}

void RoundingLog::begin_backward() {
  const std::lock_guard<std::mutex> lock(mutex_);
  entries_ = output_;
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
