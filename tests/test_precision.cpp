// Emulated storage precision (core/precision.hpp): the float32 → bf16 / fp16 rounding against the exact rounding from
// double (core/formats.hpp, itself tested bit for bit against numpy and an exact-fraction reference), the tallies, the
// methods' refusals, and the failure linear attention shows in float16 (its normaliser overflows: x/inf = 0).
#include "attnlab/analysis/rounding_bound.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/formats.hpp"
#include "attnlab/core/precision.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/io/npy.hpp"
#include "attnlab/io/sources.hpp"
#include "attnlab/methods/cur.hpp"
#include "attnlab/methods/linear.hpp"
#include "attnlab/methods/linformer.hpp"
#include "attnlab/methods/nystrom.hpp"
#include "attnlab/methods/performer.hpp"
#include "attnlab/methods/probsparse.hpp"
#include "attnlab/methods/reformer.hpp"
#include "attnlab/methods/scatterbrain.hpp"
#include "attnlab/methods/svd.hpp"
#include "attnlab/methods/vq.hpp"
#include "attnlab/operators/codebook.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/operators/sparse.hpp"

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace attnlab;

namespace {

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// round_stored's bits equal round_to's (the exact rounding from double) for x, NaN for NaN.
void expect_same(Storage s, float x) {
  const float got = round_stored(s, x);
  const double want = round_to(storage_format(s), double(x));
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << x;
    return;
  }
  ASSERT_EQ(bits(got), bits(float(want))) << storage_name(s) << ": x = " << x << " (bits " << std::hex << bits(x)
                                          << ")";
}

/// A generated problem for a source kind in float32 (what the emulation reads), its queries sharpened by the logit
/// temperature t (Q·t).
Qkv<float> tempered(const char* kind, Index nq, Index nk, Index d, Index dv, std::uint64_t seed, double t = 1.0) {
  SourceOptions src;
  src.kind = kind;
  Qkv<float> p = generate_problem<float>(src, nq, nk, d, dv, seed);
  if (t != 1.0) p.q *= float(t);
  return p;
}

/// ‖a − b‖_F / ‖b‖_F of an emulated float32 result against the float64 one.
double rel(const MatrixR<float>& a, const MatrixR<double>& b) { return (a.cast<double>() - b).norm() / b.norm(); }

/// Entries of |out − ref| not within a rounding bound (a NaN counts as outside).
Index outside(const MatrixR<double>& out, const MatrixR<double>& ref, const MatrixR<double>& bound) {
  Index n = 0;
  for (Index i = 0; i < out.size(); ++i) n += !(std::abs(out.data()[i] - ref.data()[i]) <= bound.data()[i]);
  return n;
}

/// The same on the entries the bound holds for: +inf there means no guarantee, and any value (NaN, ±inf) is allowed.
Index outside_guaranteed(const MatrixR<double>& out, const MatrixR<double>& ref, const MatrixR<double>& bound) {
  Index n = 0;
  for (Index i = 0; i < out.size(); ++i)
    n += !(std::isinf(bound.data()[i]) || std::abs(out.data()[i] - ref.data()[i]) <= bound.data()[i]);
  return n;
}

/// A method run in float32 under a storage format and policy (the options): the method (for its discrete choices)
/// and its output in float64, as the rounding-bound tests compare it with the float64 method.
struct Emulated {
  std::unique_ptr<Method<float>> method;
  MatrixR<double> out;
};
Emulated emulated(const std::string& spec, std::optional<std::uint64_t> seed, const MatrixR<float>& q,
                  const MatrixR<float>& k, const MatrixR<float>& v, const AttentionOptions& o) {
  Emulated e{make_method<float>(spec, seed), {}};
  e.method->compute(q, k, o);
  e.out = e.method->output(v).cast<double>();
  return e;
}


MatrixR<float> gaussian(Index n, Index d, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  MatrixR<float> x(n, d);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = scale * float(rng.normal());
  return x;
}

}  // namespace

// Every value of each format, the midpoints between neighbours (ties: to even) and the floats either side of them,
// the overflow threshold, float32's subnormals, and a million random float32 bit patterns.
// The formats' constants the bounds take, against their definitions: u = 2^−p, η half the smallest subnormal (the
// value round_to sends the next subnormal's half to), the largest finite value (what rounds to itself just below
// overflow).
TEST(Precision, FormatConstants) {
  EXPECT_EQ(unit_roundoff(Format::bf16), std::ldexp(1.0, -8));
  EXPECT_EQ(unit_roundoff(Format::fp16), std::ldexp(1.0, -11));
  EXPECT_EQ(half_min_subnormal(Format::bf16), std::ldexp(1.0, -134));
  EXPECT_EQ(half_min_subnormal(Format::fp16), std::ldexp(1.0, -25));
  EXPECT_EQ(largest_finite(Format::fp16), 65504.0);
  EXPECT_EQ(largest_finite(Format::bf16), 3.3895313892515355e38);
  for (const Format f : {Format::bf16, Format::fp16}) {
    EXPECT_EQ(round_to(f, largest_finite(f)), largest_finite(f));
    EXPECT_EQ(round_to(f, 3 * half_min_subnormal(f)), 4 * half_min_subnormal(f));  // to the even subnormal
  }
}

/// round_to's definition as libm states it, the reference of RoundTo.OneAdditionIsTheQuantumRounding: |x| scaled by the
/// format's quantum near it, rounded to the nearest integer (ties to even: nearbyint), scaled back; past the largest
/// finite value ±inf.
double round_to_by_scaling(Format f, double x) {
  if (f == Format::fp64 || x == 0 || !std::isfinite(x)) return x;
  const int p = f == Format::fp32 ? 24 : f == Format::bf16 ? 8 : 11;
  const int emin = f == Format::fp16 ? -14 : -126;
  int e2 = 0;
  std::frexp(x, &e2);
  const int q = std::max(e2 - 1, emin) - (p - 1);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
  return std::fabs(r) > largest_finite(f) ? std::copysign(HUGE_VAL, x) : r;
}

// round_to adds and subtracts 1.5·2^(q+52) instead of calling frexp, ldexp and nearbyint: the same value for every
// double, checked on the edges (the midpoints between a format's neighbours and the doubles either side, around the
// subnormal and overflow thresholds, double subnormals, ±0) and on two million random bit patterns spread over the
// exponents every format meets (and beyond, both ways).
TEST(RoundTo, OneAdditionIsTheQuantumRounding) {
  Rng rng(20261129);
  auto same = [](Format f, double x) {
    const double got = round_to(f, x), want = round_to_by_scaling(f, x);
    std::uint64_t a = 0, b = 0;
    std::memcpy(&a, &got, 8);
    std::memcpy(&b, &want, 8);
    ASSERT_EQ(a, b) << format_name(f) << ": x = " << std::hexfloat << x << " gave " << got << ", want " << want;
  };
  for (const Format f : {Format::fp32, Format::bf16, Format::fp16}) {
    const double u = unit_roundoff(f), eta = half_min_subnormal(f), big = largest_finite(f);
    for (double x : {eta, 2 * eta, 3 * eta, 5 * eta, eta * (1 + u), eta * (1 - u), big, big * (1 + u),
                     big * (1 + u) * (1 - 1e-16), big * (1 + u) * (1 + 1e-16), 2 * big, 1e308, 4.9e-324, 1e-310, 0.0,
                     1.0, 1 + u, 1 + 3 * u, 1 + u * (1 + 1e-15), 1 + u * (1 - 1e-15)})
      for (double sign : {1.0, -1.0}) {
        same(f, sign * x);
        same(f, sign * std::nextafter(x, 0.0));
        same(f, sign * std::nextafter(x, HUGE_VAL));
      }
    for (int i = 0; i < 700000; ++i) {
      // exponents from 2^-160 to 2^140: every format's subnormals, normals and overflow
      const double m = 1 + rng.uniform();
      const int e = int(rng.uniform() * 300) - 160;
      double x = std::ldexp(m, e) * (rng.uniform() < 0.5 ? -1 : 1);
      // half the draws exactly halfway between two of the format's neighbours at exponent e, (2j + 1)·2^(e−p): a
      // tie wherever e is in the format's normal range (ties to even)
      const int p = f == Format::fp32 ? 24 : f == Format::bf16 ? 8 : 11;
      if (i % 2) x = std::copysign(std::ldexp(std::nearbyint(std::ldexp(m, p - 1)) + 0.5, e - (p - 1)), x);
      same(f, x);
    }
  }
}

TEST(Precision, RoundStoredEqualsExactRounding) {
  for (Storage s : {Storage::bf16, Storage::fp16}) {
    const Format f = storage_format(s);
    for (std::uint32_t b = 0; b < 0x10000u; ++b) {
      const double a = from_half_bits(f, std::uint16_t(b));
      if (!std::isfinite(a)) continue;
      expect_same(s, float(a));
      const double next = from_half_bits(f, std::uint16_t(b + 1));
      if ((b & 0x7fffu) == 0x7fffu || !std::isfinite(next)) continue;
      const float mid = float((a + next) / 2);  // exact: one bit more than the format holds
      expect_same(s, mid);
      expect_same(s, std::nextafter(mid, std::numeric_limits<float>::infinity()));
      expect_same(s, std::nextafter(mid, -std::numeric_limits<float>::infinity()));
    }
    for (std::uint32_t u = 1; u < 0x800000u; u += 4099) expect_same(s, from_bits(u));  // float32 subnormals
    expect_same(s, std::numeric_limits<float>::max());
    expect_same(s, -std::numeric_limits<float>::infinity());
    Rng rng(11);
    for (int i = 0; i < 1000000; ++i) {
      const auto u = std::uint32_t(rng.next_u64() >> 32);
      expect_same(s, from_bits(u));
    }
  }
  // fp16's overflow threshold: 65520, the midpoint of 65504 and 2^16, ties to the even 2^16, past the largest.
  EXPECT_EQ(round_stored(Storage::fp16, 65519.99f), 65504.0f);
  EXPECT_TRUE(std::isinf(round_stored(Storage::fp16, 65520.0f)));
  EXPECT_EQ(round_stored(Storage::native, 0.1f), 0.1f);
}

TEST(Precision, TalliesCountOverflowUnderflowAndNaN) {
  std::vector<float> x = {1.0f, 1e5f, -7e4f, 1e-9f, 0.0f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(), 2e-8f};
  const RoundingTally t = round_in_place(Storage::fp16, x.data(), x.size());
  EXPECT_EQ(t.entries, 8u);
  EXPECT_EQ(t.overflow, 3u);   // 1e5 and −7e4, and inf (±inf as stored: float32's overflow counts too)
  EXPECT_EQ(t.underflow, 2u);  // 1e-9 and 2e-8: below half of 2^−24 (2.98e-8)
  EXPECT_EQ(t.nan, 1u);
  EXPECT_TRUE(std::isinf(x[1]) && x[2] < 0 && std::isinf(x[2]) && x[3] == 0.0f);
  // bfloat16 has float32's range: nothing of these overflows or underflows.
  std::vector<float> y = {1e5f, 1e-9f, 3e-38f};
  const RoundingTally b = round_in_place(Storage::bf16, y.data(), y.size());
  EXPECT_EQ(b.overflow + b.underflow, 0u);
}

// round_in_place takes eight entries at a time where the CPU has AVX2 and F16C (the hardware's binary16 conversion):
// the same bits as the scalar round_stored, NaN's own bits included, and the same tallies, for every sign, exponent
// and top fraction bits (all 2^16 upper halves) with low halves at the rounding's edges (ties, one either side, the
// extremes), at every offset of an 8-lane group and a ragged tail.
TEST(RoundInPlace, EqualsTheScalarRounding) {
  const std::uint32_t lows[] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  std::vector<float> x;
  for (std::uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (const std::uint32_t lo : lows) x.push_back(from_bits((hi << 16) | lo));
  x.push_back(65519.99f);
  x.push_back(65520.0f);
  x.push_back(-65520.0f);  // a ragged tail: the scalar path for the last entries
  for (const Storage s : {Storage::bf16, Storage::fp16}) {
    SCOPED_TRACE(storage_name(s));
    std::vector<float> got = x;
    const RoundingTally t = round_in_place(s, got.data(), got.size());
    RoundingTally want;
    want.entries = x.size();
    std::size_t differ = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float a = x[i], r = round_stored(s, a);
      differ += bits(r) != bits(got[i]);
      if (std::isnan(a)) ++want.nan;
      else if (std::isinf(r)) ++want.overflow;
      else if (r == 0.0f && a != 0.0f) ++want.underflow;
    }
    EXPECT_EQ(differ, 0u);
    EXPECT_EQ(t.entries, want.entries);
    EXPECT_EQ(t.nan, want.nan);
    EXPECT_EQ(t.overflow, want.overflow);
    EXPECT_EQ(t.underflow, want.underflow);
    EXPECT_GT(want.overflow, 0u);
    EXPECT_GT(want.underflow, 0u);
    // Every start offset of the 8-lane groups: a span from x + o rounds as the scalar does.
    for (std::size_t o = 1; o < 8; ++o) {
      std::vector<float> y(x.begin() + std::ptrdiff_t(o), x.begin() + std::ptrdiff_t(o + 4096 + o));
      round_in_place(s, y.data(), y.size());
      for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits(y[i]), bits(round_stored(s, x[o + i])));
    }
  }
}

// Rows of zeros are a finding where V had something to average: a V of zeros gives them by right (not counted), a V
// that float16 flushes to zero (1e-10 < its smallest subnormal, 6e-8) is the silent failure (counted).
TEST(Precision, ZeroRowsCountOnlyWhereVHadValues) {
  const Index n = 64, d = 16;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2);
  AttentionOptions fp16;
  fp16.storage = Storage::fp16;
  for (const char* spec : {"exact", "linear"}) {
    auto m = make_method<float>(spec);
    m->compute(q, k, fp16);
    const MatrixR<float> zero = m->output(MatrixR<float>::Zero(n, d));
    EXPECT_TRUE((zero.array() == 0.0f).all()) << spec;
    EXPECT_EQ(m->output_check().zero_rows, 0u) << spec;
    const MatrixR<float> tiny = m->output(MatrixR<float>::Constant(n, d, 1e-10f));
    EXPECT_TRUE((tiny.array() == 0.0f).all()) << spec;
    EXPECT_EQ(m->output_check().zero_rows, std::uint64_t(n)) << spec;
  }
}

// Issue 39's first GPU observation, emulated: linear attention (elu + 1) in float16, eager, at n = 1024, d = 64 on
// Gaussian inputs: φ(q)ᵀΣφ(k) ≈ 64 · 1024 · E[φ]² passes 65504, the normalisers overflow to inf and the rows are zeros
// — no NaN, no error: the output check and the tallies say it. The careful policy keeps the normalisers in float32.
TEST(Precision, LinearFloat16EagerReturnsZeroRowsAndSaysSo) {
  const Index n = 1024, d = 64;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2), v = gaussian(n, d, 3);
  AttentionOptions eager;
  eager.storage = Storage::fp16;
  auto m = make_method<float>("linear");
  m->compute(q, k, eager);
  const MatrixR<float> o = m->output(v);
  const auto c = m->output_check();
  EXPECT_GT(c.zero_rows, std::uint64_t(n) * 9 / 10);
  EXPECT_EQ(c.nonfinite, 0u);
  bool normalisers_overflowed = false;
  for (const auto& e : m->rounding())
    if (e.what == "normalisers φ(q)ᵀΣφ(k)") normalisers_overflowed = e.tally.overflow > std::uint64_t(n) * 9 / 10;
  EXPECT_TRUE(normalisers_overflowed);

  AttentionOptions careful = eager;
  careful.policy = Policy::careful;
  m->compute(q, k, careful);
  const MatrixR<float> oc = m->output(v);
  EXPECT_EQ(m->output_check().zero_rows, 0u);
  EXPECT_EQ(m->output_check().nonfinite, 0u);
  for (const auto& e : m->rounding()) EXPECT_EQ(e.held, Held::tensor) << e.what;  // careful rounds tensors only
  // Within a few fp16 units of the float32 output.
  auto native = make_method<float>("linear");
  native->compute(q, k);
  const MatrixR<float> on = native->output(v);
  EXPECT_LT((oc - on).norm() / on.norm(), 8 * std::ldexp(1.0, -11));
}

// What a reduced storage is refused for, before any work, with the reason.
TEST(Precision, RefusalsSayWhy) {
  const MatrixR<float> q = gaussian(64, 8, 1), k = gaussian(64, 8, 2), v = gaussian(64, 8, 3);
  AttentionOptions o;
  o.storage = Storage::bf16;
  const auto message = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Float64 inputs: the emulation accumulates in float32.
  EXPECT_NE(message([&] { make_method<double>("exact")->compute(q.cast<double>(), k.cast<double>(), o); })
                .find("float32"),
            std::string::npos);
  // A method that declares no emulation (every registered one declares one now: a descriptor without it) is refused
  // by the registry's check, and a variant outside a method's declared emulation by the method.
  MethodDescriptor none;
  none.name = "undeclared";
  EXPECT_NE(message([&] { check_storage(none, Storage::bf16, Policy::eager); }).find("does not emulate"),
            std::string::npos);
  // Performer's eager emulation transcribes the reference code's positive features only.
  EXPECT_NE(message([&] { make_method<float>("performer:features=16,kernel=trig")->compute(q, k, o); })
                .find("positive"),
            std::string::npos);
  // A method without any backward (SVD's rank truncation) says that, not "not emulated".
  auto sv = make_method<float>("svd:rank=4");
  sv->compute(q, k, o);
  EXPECT_NE(message([&] { sv->backward(v, v); }).find("has no backward pass"), std::string::npos);
  auto m = make_method<float>("exact");
  // Native storage: nothing tallied, nothing rounded.
  m->compute(q, k);
  m->output(v);
  EXPECT_TRUE(m->rounding().empty());
  EXPECT_THROW(parse_storage("fp8"), Error);
  EXPECT_THROW(parse_policy("lazy"), Error);
}

// The worst-case rounding bound of exact attention (analysis/rounding_bound.hpp), against the emulation: every entry of
// the output within its bound and, materialised, every probability within its own, over sources, temperatures, masks,
// formats, policies, both output paths and lengths that leave a partial key tile. The bound is derived, not fitted:
// a violation is a bug in the emulation or in the derivation. How tight it is gets printed (measured ÷ bound).
TEST(RoundingBound, ExactAttentionRespectsItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {0.5, 1.0, 4.0})
      for (const Index n : {Index(200), Index(600)}) {
        Qkv<float> p = tempered(kind, n, n, 32, 32, 5, t);
        const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
        for (const bool causal : {false, true})
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::eager, Policy::careful})
              for (const bool streaming : {true, false}) {
                SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " n=" << n << (causal ? " causal " : " ")
                                                  << storage_name(st) << " " << policy_name(pol)
                                                  << (streaming ? " streaming" : " materialized"));
                AttentionOptions o;
                o.storage = st;
                o.policy = pol;
                o.causal = causal;
                const Emulated run =
                    emulated(streaming ? "exact" : "exact:impl=materialized", std::nullopt, p.q, p.k, p.v, o);
                const MatrixR<double>& out = run.out;
                const SoftmaxRoundingBound b = softmax_rounding_bound(q, k, v, o, streaming);
                AttentionOptions exact_opts;
                exact_opts.causal = causal;
                const MatrixR<double> ref = exact_output<double>(q, k, v, exact_opts);
                EXPECT_EQ(outside(out, ref, b.output), 0)
                    << "worst excess " << ((out - ref).cwiseAbs() - b.output).maxCoeff();
                double worst_p = 0, bound_p = 0;
                if (!streaming) {
                  const MatrixR<double> pe = run.method->matrix().cast<double>();
                  const MatrixR<double> pr = exact_matrix<double>(q, k, exact_opts);
                  Index pv = 0;
                  for (Index i = 0; i < n; ++i)
                    for (Index j = 0; j < n; ++j) {
                      const double e = std::abs(pe(i, j) - pr(i, j));
                      pv += !(e <= b.probability(i, pr(i, j)));
                      if (pr(i, j) > 1e-3) worst_p = std::max(worst_p, e / pr(i, j));
                    }
                  bound_p = b.ratio.maxCoeff() - 1;
                  EXPECT_EQ(pv, 0) << "probabilities outside their bound";
                }
                if (n == 600 && !causal)
                  std::printf("  %-9s t=%-3g %s %-7s %-12s |ΔO|_F / bound %.3f, bound / |O|_F %.3g%s\n", kind, t,
                              storage_name(st).c_str(), policy_name(pol).c_str(),
                              streaming ? "streaming" : "materialized", (out - ref).norm() / b.output_norm(),
                              b.output_norm() / ref.norm(),
                              streaming ? ""
                                        : fmt::format(", max rel. P error {:.2e} (bound {:.2e})", worst_p, bound_p)
                                              .c_str());
              }
      }
}

// The pattern methods' bound: local windows and the sparse patterns emulate the materialised transcription restricted
// to their pattern, so exact attention's materialised bound over that pattern (SoftmaxRoundingAnalysis's pattern form)
// must hold entry by entry. The pattern is read from the float64 method's own sparse P̃.
TEST(RoundingBound, PatternMethodsRespectItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 4.0}) {
      const Index n = 300;
      Qkv<float> p = tempered(kind, n, n, 32, 32, 9, t);
      const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
      for (const char* spec : {"local:window=8", "local:window=40", "sparse:window=3,stride=5,globals=3,random=4"})
        for (const bool causal : {false, true}) {
          AttentionOptions o64;
          o64.causal = causal;
          auto m64 = make_method<double>(spec, 3);
          m64->compute(q, k, o64);
          const auto* sp = dynamic_cast<const SparseOperator<double>*>(&m64->op());
          ASSERT_NE(sp, nullptr) << spec;
          const SoftmaxRoundingAnalysis analysis(q, k, v, sp->row_keys(), o64.resolved_scale(q.cols()));
          const MatrixR<double> own = m64->output(v);
          EXPECT_LT((own - analysis.o).norm(), 1e-12 * own.norm()) << "the pattern read back is not the method's";
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::eager, Policy::careful}) {
              SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " " << spec << (causal ? " causal " : " ")
                                                << storage_name(st) << " " << policy_name(pol));
              AttentionOptions o = o64;
              o.storage = st;
              o.policy = pol;
              const Emulated run = emulated(spec, 3, p.q, p.k, p.v, o);
              const MatrixR<double>& out = run.out;
              const SoftmaxRoundingBound b = analysis.bound(o, false);
              EXPECT_EQ(outside(out, own, b.output), 0)
                  << "worst excess " << ((out - own).cwiseAbs() - b.output).maxCoeff();
              if (t == 1.0 && !causal && std::string(kind) == "gaussian")
                std::printf("  %-44s %s %-7s |ΔO|_F / bound %.3f, bound / |O|_F %.3g\n", spec,
                            storage_name(st).c_str(), policy_name(pol).c_str(), (out - own).norm() / b.output_norm(),
                            b.output_norm() / own.norm());
            }
        }
    }
}

// Linformer's bound (linformer_rounding_bound): exact attention's materialised bound over the projected keys EK and
// values FV, with the envelopes of their float32 formation and storage, against the emulation entry by entry —
// Gaussian, uniform and pooled projections, shared or not, sources and temperatures, a length past fp16's reach for
// the keys' envelope (no guarantee: +inf, and the emulation does overflow there).
TEST(RoundingBound, LinformerRespectsItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 4.0}) {
      const Index n = 300;
      Qkv<float> p = tempered(kind, n, n, 32, 32, 11, t);
      const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
      for (const char* spec : {"linformer:k=32", "linformer:k=64,projection=pool",
                               "linformer:k=16,projection=uniform,share_kv=true"}) {
        auto m64 = make_method<double>(spec, 5);
        m64->compute(q, k);
        const auto* l64 = dynamic_cast<const LinformerMethod<double>*>(m64.get());
        ASSERT_NE(l64, nullptr) << spec;
        const MatrixR<double> own = m64->output(v);
        for (const Storage st : {Storage::bf16, Storage::fp16})
          for (const Policy pol : {Policy::eager, Policy::careful}) {
            SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " " << spec << " " << storage_name(st) << " "
                                              << policy_name(pol));
            AttentionOptions o;
            o.storage = st;
            o.policy = pol;
            const Emulated run = emulated(spec, 5, p.q, p.k, p.v, o);
            const auto* l32 = dynamic_cast<const LinformerMethod<float>*>(run.method.get());
            ASSERT_NE(l32, nullptr);
            const MatrixR<double>& out = run.out;
            const SoftmaxRoundingBound b =
                linformer_rounding_bound(q, k, v, l64->projections().first, l64->projections().second,
                                         l32->projections().first.cast<double>(),
                                         l32->projections().second.cast<double>(), o);
            EXPECT_EQ(outside(out, own, b.output), 0)
                << "worst excess " << ((out - own).cwiseAbs() - b.output).maxCoeff();
            EXPECT_TRUE(std::isfinite(b.output_norm()));
            if (t == 1.0 && std::string(kind) == "gaussian")
              std::printf("  %-48s %s %-7s |ΔO|_F / bound %.3f, bound / |O|_F %.3g\n", spec, storage_name(st).c_str(),
                          policy_name(pol).c_str(), (out - own).norm() / b.output_norm(), b.output_norm() / own.norm());
          }
      }
    }
  // Keys of 30000 in fp16, one ±1 projection: E·K passes its largest value (65504) — the bound gives up, and the
  // emulation's stored EK is ±inf there.
  const Index n = 256;
  MatrixR<double> q = MatrixR<double>::Constant(n, 8, 0.01), k = MatrixR<double>::Constant(n, 8, 30000.0);
  const MatrixR<double> v = MatrixR<double>::Ones(n, 8);
  auto m64 = make_method<double>("linformer:k=1,projection=uniform", 1);
  m64->compute(q, k);
  AttentionOptions o;
  o.storage = Storage::fp16;
  auto m = make_method<float>("linformer:k=1,projection=uniform", 1);
  m->compute(q.cast<float>(), k.cast<float>(), o);
  (void)m->output(v.cast<float>());
  RoundingTally all;
  for (const auto& r : m->rounding()) all += r.tally;
  EXPECT_GT(all.overflow, 0u) << "the emulation stores E·K overflowing";
  const auto* l64 = dynamic_cast<const LinformerMethod<double>*>(m64.get());
  const auto* l32 = dynamic_cast<const LinformerMethod<float>*>(m.get());
  const SoftmaxRoundingBound b = linformer_rounding_bound(
      q, k, v, l64->projections().first, l64->projections().second, l32->projections().first.cast<double>(),
      l32->projections().second.cast<double>(), o);
  EXPECT_TRUE(std::isinf(b.output_norm()));
  AttentionOptions causal = o;
  causal.causal = true;
  EXPECT_THROW(linformer_rounding_bound(q, k, v, l64->projections().first, l64->projections().second,
                                        l32->projections().first.cast<double>(),
                                        l32->projections().second.cast<double>(), causal),
               Error);
}

// The trigonometric kernel's bound rests on float32's sin and cos (Eigen's vectorised ones, as the features call them)
// within kTrigAbs = 2⁻²² of the exact value of their argument below 65536 (rounding_bound.cpp): checked on 2²² evenly
// spaced arguments in [−64, 64] and 2²² random ones up to 65536, against float64's sin and cos. (Eigen's comment
// states an absolute error below 5.9605e-08 = 2⁻²⁴; measured here, up to 8.1e-08 = 2^−23.55: hence the margin.)
TEST(RoundingBound, Float32SinCosWithinTheTrigBoundsError) {
  const Index n = Index(1) << 22;
  Eigen::ArrayXf x(2 * n);
  for (Index i = 0; i < n; ++i) x(i) = float(-64.0 + 128.0 * double(i) / double(n));
  Rng rng(3);
  for (Index i = n; i < 2 * n; ++i) x(i) = float(65536.0 * (2 * rng.uniform() - 1));
  const Eigen::ArrayXf s = x.sin(), c = x.cos();
  double worst = 0;
  for (Index i = 0; i < 2 * n; ++i) {
    const double xi = double(x(i));
    worst = std::max({worst, std::abs(double(s(i)) - std::sin(xi)), std::abs(double(c(i)) - std::cos(xi))});
  }
  EXPECT_LE(worst, std::ldexp(1.0, -22));
  std::printf("  float32 sin, cos: largest absolute error %.3g (2^%.2f)\n", worst, std::log2(worst));
}

// Performer's trigonometric kernel under careful (performer_rounding_bound's trigonometric form): signed features
// [sin p, cos p], the keys weighted by e^{½‖s^½k‖² − C} (causal: against the running maximum, the state rescaled, in
// the chunked transcription; 250 queries after 80 keys of context); entry by entry against the emulation where the
// bound gives a guarantee — a row whose normaliser estimate may vanish (signed features make it small or negative)
// has none, and at the lower temperature every row must keep its guarantee.
TEST(RoundingBound, PerformerTrigRespectsItWhereTheNormaliserIsClear) {
  for (const bool causal : {false, true})
    for (const char* kind : {"gaussian", "clustered"})
      for (const double t : {0.5, 1.0})
        for (const char* spec : {"performer:features=64,kernel=trig", "performer:features=16,kernel=trig,chunk=48"}) {
          Qkv<float> p = tempered(kind, causal ? 250 : 300, causal ? 330 : 340, 32, 24, 43, t);
          p.k *= float(t);
          const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
          const Index chunk = std::string(spec).find("chunk=48") != std::string::npos ? 48 : 64;
          AttentionOptions mask;
          mask.causal = causal;
          auto m64 = make_method<double>(spec, 7);
          m64->compute(q, k, mask);
          const MatrixR<double> own = m64->output(v);
          for (const Storage st : {Storage::bf16, Storage::fp16}) {
            SCOPED_TRACE(::testing::Message() << (causal ? "causal " : "") << kind << " t=" << t << " " << spec << " "
                                              << storage_name(st));
            AttentionOptions o = mask;
            o.storage = st;
            o.policy = Policy::careful;
            const Emulated run = emulated(spec, 7, p.q, p.k, p.v, o);
            const auto* p64 = dynamic_cast<const PerformerMethod<double>*>(m64.get());
            const auto* p32 = dynamic_cast<const PerformerMethod<float>*>(run.method.get());
            ASSERT_NE(p64, nullptr);
            ASSERT_NE(p32, nullptr);
            const KernelRoundingBound b = performer_rounding_bound(q, k, v, p64->omega(), p32->omega().cast<double>(),
                                                                   PerformerKernel::Trig, o, chunk);
            EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
            Index with = 0;
            for (Index i = 0; i < own.rows(); ++i) with += std::isfinite(b.output(i, 0));
            EXPECT_EQ(with + b.rows_without_guarantee, own.rows());
            EXPECT_EQ(outside_guaranteed(run.out, own, b.output), 0);
            double measured = 0, bounded = 0;
            for (Index i = 0; i < own.rows(); ++i)
              if (std::isfinite(b.output(i, 0))) {
                measured += (run.out.row(i) - own.row(i)).squaredNorm();
                bounded += b.output.row(i).squaredNorm();
              }
            if (t == 0.5) {
              EXPECT_EQ(with, own.rows()) << "a vacuous bound: rows without a guarantee at the lower temperature";
            }
            std::printf("  %s%s %s t=%.1f %s: %lld of %lld rows with a guarantee, |ΔO| / bound %.3g there, bound / "
                        "|O| %.3g\n", causal ? "causal " : "", spec, kind, t, storage_name(st).c_str(),
                        static_cast<long long>(with), static_cast<long long>(own.rows()),
                        bounded > 0 ? std::sqrt(measured / bounded) : 0.0,
                        with == own.rows() ? b.output_norm() / own.norm() : 0.0);
          }
        }
}

// Performer's bound (performer_rounding_bound: careful's stabilised features, eager's reference-code features with
// every step stored; eager also causal, through linear's chunked transcription) against the emulation entry by
// entry: sources, temperatures, feature counts and chunks, both formats and policies, both masks (causal: 250 queries
// after 80 keys of context, so that the chunks start off the diagonal); the O it is built around is the float64
// method's own output; the hyperbolic kernel under careful (the one policy that emulates it). Careful holds
// everywhere here; eager may give up on a row (its fp16 features underflow,
// e^{−‖x‖²/2}; at t = 2 its bf16 exponents' rounding), but where it gives up the failure is real or the row is
// counted, and at t = 1 most rows keep a guarantee.
// The trig kernel's bound is refused under eager (which does not emulate it).
TEST(RoundingBound, PerformerRespectsItEntryByEntry) {
  Index rows = 0, given_up = 0, rows_t1 = 0, given_up_t1 = 0;
  for (const bool causal : {false, true})
    for (const char* kind : {"gaussian", "clustered"})
      for (const double t : {1.0, 2.0}) {
        const Index nq = causal ? 250 : 300, nk = causal ? 330 : 300;
        Qkv<float> p = tempered(kind, nq, nk, 32, 32, 13, t);
        const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
        for (const char* spec : {"performer:features=64", "performer:features=16,orthogonal=false,chunk=48",
                                 "performer:features=32,kernel=hyperbolic,chunk=48"}) {
          const Index chunk = std::string(spec).find("chunk=48") != std::string::npos ? 48 : 64;
          const bool hyperbolic = std::string(spec).find("hyperbolic") != std::string::npos;
          AttentionOptions mask;
          mask.causal = causal;
          auto m64 = make_method<double>(spec, 7);
          m64->compute(q, k, mask);
          const auto* p64 = dynamic_cast<const PerformerMethod<double>*>(m64.get());
          ASSERT_NE(p64, nullptr) << spec;
          const MatrixR<double> own = m64->output(v);
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::careful, Policy::eager}) {
              SCOPED_TRACE(::testing::Message() << (causal ? "causal " : "") << kind << " t=" << t << " " << spec
                                                << " " << storage_name(st) << " " << policy_name(pol));
              AttentionOptions o = mask;
              o.storage = st;
              o.policy = pol;
              if (hyperbolic && pol == Policy::eager) {  // eager transcribes the reference's positive features only
                EXPECT_THROW(emulated(spec, 7, p.q, p.k, p.v, o), Error);
                continue;
              }
              const Emulated run = emulated(spec, 7, p.q, p.k, p.v, o);
              const auto* p32 = dynamic_cast<const PerformerMethod<float>*>(run.method.get());
              ASSERT_NE(p32, nullptr);
              if (pol == Policy::eager) {  // the trigonometric kernel's: careful only (eager does not emulate it)
                EXPECT_THROW(performer_rounding_bound(q, k, v, p64->omega(), p32->omega().cast<double>(),
                                                      PerformerKernel::Trig, o, chunk),
                             Error);
              }
              const MatrixR<double>& out = run.out;
              const KernelRoundingBound b = performer_rounding_bound(
                  q, k, v, p64->omega(), p32->omega().cast<double>(),
                  hyperbolic ? PerformerKernel::Hyperbolic : PerformerKernel::Positive, o, chunk);
              EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
              EXPECT_EQ(outside_guaranteed(out, own, b.output), 0);
              if (pol == Policy::careful) {
                EXPECT_EQ(outside(out, own, b.output), 0)
                    << "worst excess " << ((out - own).cwiseAbs() - b.output).maxCoeff();
                EXPECT_EQ(b.rows_without_guarantee, 0);
              }
              rows += nq;
              given_up += b.rows_without_guarantee;
              if (t == 1.0) {
                rows_t1 += nq;
                given_up_t1 += b.rows_without_guarantee;
              }
              if (t == 1.0 && std::string(kind) == "gaussian")
                std::printf("  %s%-40s %s %-7s |ΔO|_F / |O|_F %.2e, / bound %.3f, bound / |O|_F %.3g, %lld rows "
                            "without\n",
                            causal ? "causal " : "", spec, storage_name(st).c_str(), policy_name(pol).c_str(),
                            (out - own).norm() / own.norm(),
                            b.rows_without_guarantee ? 0.0 : (out - own).norm() / b.output_norm(),
                            b.rows_without_guarantee ? 0.0 : b.output_norm() / own.norm(),
                            static_cast<long long>(b.rows_without_guarantee));
            }
        }
      }
  std::printf("  performer: %lld of %lld rows without a guarantee (t = 1: %lld of %lld)\n",
              static_cast<long long>(given_up), static_cast<long long>(rows), static_cast<long long>(given_up_t1),
              static_cast<long long>(rows_t1));
  // At t = 1 most rows keep one (measured: 210 of 8800, both masks, positive and hyperbolic); at t = 2 eager's
  // gives up on most bf16 rows — the queries' exponents ωᵀx − ‖x‖²/2 grow up to fourfold, and their rounding in
  // bf16's 8 bits, e^θ, swamps the normaliser's margin — and on the fp16 rows whose features underflow.
  EXPECT_LT(given_up_t1, rows_t1 / 10) << "the bound holds vacuously";
}

// Taylor attention's bound (taylor_rounding_bound: signed features [1, x/‖x‖]) against the emulation entry by entry:
// sources, temperatures, a zero query row and a key row that rounds to zero in the format, both formats and policies;
// the O it is built around is the float64 method's own.
TEST(RoundingBound, TaylorRespectsItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 8.0}) {
      const Index n = 300;
      Qkv<float> p = tempered(kind, n, n, 32, 32, 17, t);
      p.q.row(3).setZero();
      p.k.row(5).setConstant(1e-45f);  // a float32 subnormal, zero in both formats: its direction is lost
      const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
      auto m64 = make_method<double>("taylor", 0);
      m64->compute(q, k);
      const MatrixR<double> own = m64->output(v);
      for (const Storage st : {Storage::bf16, Storage::fp16})
        for (const Policy pol : {Policy::eager, Policy::careful}) {
          SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " " << storage_name(st) << " "
                                            << policy_name(pol));
          AttentionOptions o;
          o.storage = st;
          o.policy = pol;
          const Emulated run = emulated("taylor", 0, p.q, p.k, p.v, o);
          const MatrixR<double>& out = run.out;
          const KernelRoundingBound b = taylor_rounding_bound(q, k, v, o);
          EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
          EXPECT_EQ(b.rows_without_guarantee, 0);
          EXPECT_EQ(outside(out, own, b.output), 0)
              << "worst excess " << ((out - own).cwiseAbs() - b.output).maxCoeff();
          if (t == 1.0 && std::string(kind) == "gaussian")
            std::printf("  taylor %s %-7s |ΔO|_F / bound %.3f, bound / |O|_F %.3g\n", storage_name(st).c_str(),
                        policy_name(pol).c_str(), (out - own).norm() / b.output_norm(), b.output_norm() / own.norm());
        }
    }
}

// The kernel methods' causal bound (linear_rounding_bound and taylor_rounding_bound under a causal mask: the chunked
// transcription's state, stored after every absorb under eager, and its stored scores) against the emulation entry by
// entry: elu + 1, relu and taylor, chunks of 64 and 48 (a partial last chunk), n_k > n_q (keys before the first
// query, absorbed first), long enough in fp16 eager for the state to overflow (no guarantee there, and every failed
// row is one of those).
TEST(RoundingBound, CausalKernelMethodsRespectItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const auto& [nq, nk] : {std::pair<Index, Index>{300, 300}, {250, 330}, {1500, 1500}}) {
      Qkv<float> p = tempered(kind, nq, nk, 32, 32, 19);
      const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
      for (const char* spec : {"linear", "linear:feature=relu,chunk=48", "taylor:chunk=48"}) {
        const std::string name = spec;
        const Index chunk = name.find("chunk=48") != std::string::npos ? 48 : 64;
        AttentionOptions c64;
        c64.causal = true;
        auto m64 = make_method<double>(spec);
        m64->compute(q, k, c64);
        const MatrixR<double> own = m64->output(v);
        for (const Storage st : {Storage::bf16, Storage::fp16})
          for (const Policy pol : {Policy::eager, Policy::careful}) {
            SCOPED_TRACE(::testing::Message() << kind << " " << nq << "×" << nk << " " << spec << " "
                                              << storage_name(st) << " " << policy_name(pol));
            AttentionOptions o = c64;
            o.storage = st;
            o.policy = pol;
            const Emulated run = emulated(spec, std::nullopt, p.q, p.k, p.v, o);
            const MatrixR<double>& out = run.out;
            const KernelRoundingBound b =
                name.rfind("taylor", 0) == 0
                    ? taylor_rounding_bound(q, k, v, o, chunk)
                    : linear_rounding_bound(q, k, v,
                                            name.find("relu") != std::string::npos ? LinearFeature::Relu
                                                                                   : LinearFeature::Elu,
                                            o, chunk);
            Index failed_outside = 0;
            for (Index i = 0; i < nq; ++i) failed_outside += !out.row(i).allFinite() && !std::isinf(b.output(i, 0));
            EXPECT_EQ(outside_guaranteed(out, own, b.output), 0)
                << "rows without a guarantee " << b.rows_without_guarantee;
            EXPECT_EQ(failed_outside, 0);
            EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
            if (!(st == Storage::fp16 && pol == Policy::eager) && name != "linear:feature=relu,chunk=48") {
              EXPECT_EQ(b.rows_without_guarantee, 0);
            }
            if (nq == 1500 && std::string(kind) == "gaussian")
              std::printf("  causal %-30s %s %-7s bound / |O|_F %.3g, rows without a guarantee %lld\n", spec,
                          storage_name(st).c_str(), policy_name(pol).c_str(),
                          b.rows_without_guarantee == 0 ? b.output_norm() / own.norm() : -1.0,
                          static_cast<long long>(b.rows_without_guarantee));
          }
      }
    }
}

// Efficient attention's bound (efficient_rounding_bound) against the emulation entry by entry: sources, temperatures
// (sharp softmaxes over the features and over the positions), both formats and policies; its O is the method's own.
TEST(RoundingBound, EfficientRespectsItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 6.0}) {
      Qkv<float> p = tempered(kind, 300, 340, 32, 24, 23, t);
      p.k *= float(t);
      const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
      auto m64 = make_method<double>("efficient", 0);
      m64->compute(q, k);
      const MatrixR<double> own = m64->output(v);
      for (const Storage st : {Storage::bf16, Storage::fp16})
        for (const Policy pol : {Policy::eager, Policy::careful}) {
          SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " " << storage_name(st) << " "
                                            << policy_name(pol));
          AttentionOptions o;
          o.storage = st;
          o.policy = pol;
          const Emulated run = emulated("efficient", 0, p.q, p.k, p.v, o);
          const MatrixR<double>& out = run.out;
          const KernelRoundingBound b = efficient_rounding_bound(q, k, v, o);
          EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
          EXPECT_EQ(b.rows_without_guarantee, 0);
          EXPECT_EQ(outside(out, own, b.output), 0)
              << "worst excess " << ((out - own).cwiseAbs() - b.output).maxCoeff();
          if (t == 1.0 && std::string(kind) == "gaussian")
            std::printf("  efficient %s %-7s |ΔO|_F / bound %.3f, bound / |O|_F %.3g\n", storage_name(st).c_str(),
                        policy_name(pol).c_str(), (out - own).norm() / b.output_norm(), b.output_norm() / own.norm());
        }
    }
}

// Scatterbrain's bound (scatterbrain_rounding_bound): the Performer estimate off the band, the exact entries on it,
// normalised by their row sums, entry by entry against the emulation: sources, temperatures, feature counts and band
// widths, square and rectangular (the band's centre moves), both formats and policies; its O is the float64 method's
// own. Every row must keep its guarantee on these moderate inputs (none may overflow), and the bound must say
// something (below ‖O‖ in bf16 at temperature 1); with V scaled past fp16's range the stored numerators overflow
// under eager, and those rows must lose their guarantee.
TEST(RoundingBound, ScatterbrainRespectsItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 4.0})
      for (const char* spec : {"scatterbrain:features=64,window=16", "scatterbrain:features=16,window=3"})
        for (const Index nq : {Index(300), Index(260)}) {
          Qkv<float> p = tempered(kind, nq, 300, 32, 24, 37, t);
          const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
          auto m64 = make_method<double>(spec, 5);
          m64->compute(q, k);
          const MatrixR<double> own = m64->output(v);
          const auto* s64 = dynamic_cast<const ScatterbrainMethod<double>*>(m64.get());
          ASSERT_NE(s64, nullptr);
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::eager, Policy::careful}) {
              SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " " << spec << " n_q=" << nq << " "
                                                << storage_name(st) << " " << policy_name(pol));
              AttentionOptions o;
              o.storage = st;
              o.policy = pol;
              const Emulated run = emulated(spec, 5, p.q, p.k, p.v, o);
              const auto* s32 = dynamic_cast<const ScatterbrainMethod<float>*>(run.method.get());
              ASSERT_NE(s32, nullptr);
              const Index window = std::string(spec).find("window=3") != std::string::npos ? 3 : 16;
              const KernelRoundingBound b = scatterbrain_rounding_bound(q, k, v, s64->omega(),
                                                                        s32->omega().cast<double>(), window, o);
              EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
              EXPECT_EQ(b.rows_without_guarantee, 0);
              EXPECT_EQ(outside(run.out, own, b.output), 0)
                  << "worst excess " << ((run.out - own).cwiseAbs() - b.output).maxCoeff();
              if (t == 1.0 && st == Storage::bf16) {
                EXPECT_LT(b.output_norm(), own.norm()) << "a vacuous bound";
              }
              if (t == 1.0 && nq == 300 && std::string(kind) == "gaussian" && window == 16)
                std::printf("  %s %s %-7s |ΔO|_F / bound %.3f, bound / |O|_F %.3g\n", spec, storage_name(st).c_str(),
                            policy_name(pol).c_str(), (run.out - own).norm() / b.output_norm(),
                            b.output_norm() / own.norm());
            }
        }
  // Past fp16's range: V ≈ 60000 (each entry below 65504) makes eager's stored sums overflow — the numerators of every
  // row whose weights, in its units e^{R̂} (its largest is 1), add up to more than 1.09 (the diffuse rows, queries
  // ×0.01), and here the key–value state Σψ̂v̂ᵀ too, so every row's output is non-finite. The bound must give up
  // wherever the emulation's output is not finite, and hold elsewhere.
  Qkv<float> p = tempered("gaussian", 200, 200, 32, 24, 41);
  p.q.topRows(100) *= 0.01f;
  p.q.bottomRows(100) *= 8.0f;
  p.v.array() += 60000.0f;
  const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
  auto m64 = make_method<double>("scatterbrain:features=32,window=8", 5);
  m64->compute(q, k);
  const MatrixR<double> own = m64->output(v);
  AttentionOptions o;
  o.storage = Storage::fp16;
  o.policy = Policy::eager;
  const Emulated run = emulated("scatterbrain:features=32,window=8", 5, p.q, p.k, p.v, o);
  const KernelRoundingBound b = scatterbrain_rounding_bound(
      q, k, v, dynamic_cast<const ScatterbrainMethod<double>*>(m64.get())->omega(),
      dynamic_cast<const ScatterbrainMethod<float>*>(run.method.get())->omega().cast<double>(), 8, o);
  Index nonfinite_rows = 0;
  for (Index i = 0; i < 200; ++i) nonfinite_rows += !run.out.row(i).allFinite();
  EXPECT_GE(nonfinite_rows, 100) << "the diffuse rows did not overflow: the case does not test the overflow";
  EXPECT_GE(b.rows_without_guarantee, nonfinite_rows);
  EXPECT_EQ(outside_guaranteed(run.out, own, b.output), 0) << "a non-finite row kept its guarantee, or one failed";
  std::printf("  scatterbrain fp16 eager, V ≈ 60000: %lld rows overflowed, %lld of 200 without a guarantee\n",
              static_cast<long long>(nonfinite_rows), static_cast<long long>(b.rows_without_guarantee));
}

namespace {

/// The low-rank bounds given both runs' pseudo-inverses (Nyström's, CUR's), entry by entry against the emulation:
/// sources, temperatures, each spec, square and rectangular (n_q 300 or 256 against 340 keys), both formats and
/// policies; the bound's O must be the float64 method's own, and every row must keep its guarantee on these moderate
/// inputs but where `may_lose(storage)`: there a row that overflowed in the emulation must have lost it, and at most
/// 1 row in 20 beside those may. `bound(q, k, v, m64, m32, opts)` gives the bound from the two runs and how far the
/// emulated run's pseudo-inverse moved, |Ẑ − Z|_F / |Z|_F (printed), or nothing where the two runs sampled different
/// rows (a discrete choice, not rounding: counted; at most a quarter of the cases).
template <typename M, typename Bound>
void pinv_bound_cases(const std::vector<const char*>& specs, Bound bound,
                      bool (*may_lose)(Storage) = [](Storage) { return false; }) {
  Index cases = 0, resampled = 0;
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 4.0})
      for (const char* spec : specs)
        for (const Index nq : {Index(300), Index(256)}) {
          Qkv<float> p = tempered(kind, nq, 340, 32, 24, 47, t);
          const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
          auto m64 = make_method<double>(spec, 0);
          m64->compute(q, k);
          const MatrixR<double> own = m64->output(v);
          const auto* r64 = dynamic_cast<const M*>(m64.get());
          ASSERT_NE(r64, nullptr);
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::eager, Policy::careful}) {
              SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " " << spec << " n_q=" << nq << " "
                                                << storage_name(st) << " " << policy_name(pol));
              AttentionOptions o;
              o.storage = st;
              o.policy = pol;
              const Emulated run = emulated(spec, 0, p.q, p.k, p.v, o);
              ++cases;
              const auto bd = bound(q, k, v, *r64, *run.method, o);
              if (!bd) {
                ++resampled;
                continue;
              }
              const auto& [b, dz] = *bd;
              EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
              if (may_lose(st)) {
                const Index overflowed = (!run.out.array().isFinite()).rowwise().any().count();
                EXPECT_LE(b.rows_without_guarantee, overflowed + nq / 20);
                EXPECT_EQ(outside_guaranteed(run.out, own, b.output), 0);
                if (b.rows_without_guarantee > 0)
                  std::printf("  %s %s t=%g %s %-7s n_q=%lld: %lld rows without a guarantee, %lld non-finite\n", kind,
                              spec, t, storage_name(st).c_str(), policy_name(pol).c_str(), static_cast<long long>(nq),
                              static_cast<long long>(b.rows_without_guarantee), static_cast<long long>(overflowed));
              } else {
                EXPECT_EQ(b.rows_without_guarantee, 0);
                EXPECT_EQ(outside(run.out, own, b.output), 0)
                    << "worst excess " << ((run.out - own).cwiseAbs() - b.output).maxCoeff();
              }
              if (t == 1.0 && nq == 300 && std::string(kind) == "gaussian")
                std::printf("  %s %s %-7s |ΔO|_F / |O|_F %.2e, / bound %.3f, bound / |O|_F %.3g, |Ẑ − Z|_F / |Z|_F "
                            "%.2e\n", spec, storage_name(st).c_str(), policy_name(pol).c_str(),
                            (run.out - own).norm() / own.norm(), (run.out - own).norm() / b.output_norm(),
                            b.output_norm() / own.norm(), dz);
            }
        }
  EXPECT_LE(4 * resampled, cases) << "most cases sampled other rows: the test would hold vacuously";
  if (resampled > 0)
    std::printf("  %lld of %lld cases sampled other rows in the two runs (no bound)\n",
                static_cast<long long>(resampled), static_cast<long long>(cases));
}

/// |Ẑ − Z|_F / |Z|_F of two runs' pseudo-inverses.
double pinv_moved(const MatrixR<double>& z, const MatrixR<float>& z32) {
  return (z32.cast<double>() - z).norm() / z.norm();
}

}  // namespace

// Nyström's bound given both runs' pseudo-inverses (nystrom_rounding_bound): the landmarks, the two materialised
// softmaxes F and B, and the products (F·Ẑ)·(B·V), each stored, with Ẑ − Z entering as computed; the iteration (the
// paper's 6 steps, 20) and the SVD, segment-mean and sampled landmarks (the same rows in both runs: one seed).
TEST(RoundingBound, NystromRespectsItGivenBothPseudoinverses) {
  pinv_bound_cases<NystromMethod<double>>(
      {"nystrom:landmarks=32", "nystrom:landmarks=16,iters=20", "nystrom:landmarks=16,pinv=svd",
       "nystrom:landmarks=24,select=random"},
      [](const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v,
         const NystromMethod<double>& n64, const Method<float>& m32, const AttentionOptions& o) {
        const auto& n32 = dynamic_cast<const NystromMethod<float>&>(m32);
        EXPECT_EQ(n32.query_landmark_rows(), n64.query_landmark_rows());
        return std::optional(std::pair(nystrom_rounding_bound(q, k, v, n64.settings().landmarks, n64.pseudoinverse(),
                                                n32.pseudoinverse().cast<double>(), o, n64.query_landmark_rows(),
                                                n64.key_landmark_rows()),
                         pinv_moved(n64.pseudoinverse(), n32.pseudoinverse())));
      });
}

// CUR's bound given both runs' pseudo-inverses (cur_rounding_bound): C and R read through the streaming log-sum-exp
// in float32 from the stored rows, A = C·Ẑ and R stored, R·V (stored under eager) and O = A·(R·V), with Ẑ − Z
// entering as computed; uniform and leverage-score sampling (leverage scores come from each run's own singular
// vectors, so the runs may sample other rows: no bound, counted). In fp16 rows of A = C·Ẑ pass 65504 where Ẑ inverts
// an ill-conditioned P[I, J] (clustered keys, t = 4: up to 44% of the rows overflow in the emulation): those rows lose
// their guarantee, and at most 1 in 20 others may.
TEST(RoundingBound, CurRespectsItGivenBothPseudoinverses) {
  pinv_bound_cases<CurMethod<double>>(
      {"cur:columns=32", "cur:columns=16,select=leverage"},
      [](const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v, const CurMethod<double>& c64,
         const Method<float>& m32, const AttentionOptions& o) {
        const auto& c32 = dynamic_cast<const CurMethod<float>&>(m32);
        using Result = std::optional<std::pair<KernelRoundingBound, double>>;
        if (c32.sampled_rows() != c64.sampled_rows() || c32.sampled_columns() != c64.sampled_columns())
          return Result();  // leverage scores from each run's own singular vectors: a discrete change
        return Result(std::pair(cur_rounding_bound(q, k, v, c64.sampled_rows(), c64.sampled_columns(),
                                                   c64.pseudoinverse(), c32.pseudoinverse().cast<double>(), o),
                                pinv_moved(c64.pseudoinverse(), c32.pseudoinverse())));
      },
      [](Storage st) { return st == Storage::fp16; });
}

// The SVD oracle's bound given both runs' singular vectors (svd_rounding_bound): A = P̂·V̂_R through the streaming
// log-sum-exp in float32 from the stored rows, A and V̂_R stored, W = V̂_Rᵀ·V̂ (stored under eager) and O = A·W, with
// V̂_R − V_R (the float64 basis rotated to the emulated one's) entering as computed; the dense SVD and the block
// Krylov solver. A is a convex combination of V_R's rows (|A| ≤ 1): no row may lose its guarantee.
TEST(RoundingBound, SvdRespectsItGivenBothSingularVectors) {
  pinv_bound_cases<SvdMethod<double>>(
      {"svd:rank=16", "svd:rank=32,solver=block"},
      [](const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v, const SvdMethod<double>& s64,
         const Method<float>& m32, const AttentionOptions& o) {
        const auto& f64 = dynamic_cast<const LowRankOperator<double>&>(s64.op());
        const auto& f32 = dynamic_cast<const LowRankOperator<float>&>(m32.op());
        const MatrixR<double> vr32 = f32.right().cast<double>();
        // How far the subspace moved: |V̂_R − V_R| over the projectors, |V̂V̂ᵀ − VVᵀ|_F / |VVᵀ|_F.
        const MatrixR<double> pr = f64.right() * f64.right().transpose(), pr32 = vr32 * vr32.transpose();
        return std::optional(std::pair(svd_rounding_bound(q, k, v, f64.right(), vr32, o),
                                       (pr32 - pr).norm() / pr.norm()));
      });
}

// ProbSparse's bound (probsparse_rounding_bound): where both runs chose alike, exact's streaming bound on the exact
// rows and the lazy rows' own (mean(V); causal: the prefix mean, or the prefix sum under lazy=cumsum); a flipped row
// is counted, not bounded. Entry by entry against the emulation: sources, temperatures, factors, both masks, both lazy
// forms, both formats and policies; its O is the float64 method's own. Most rows must keep a guarantee (else the test
// would hold vacuously), and fp16's cumsum rows past 65504 must lose theirs (the storing overflows there).
TEST(RoundingBound, ProbSparseRespectsItWhereTheChoicesAgree) {
  Index flips = 0, rows = 0, without = 0;
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 4.0})
      for (const bool causal : {false, true}) {
        Qkv<float> p = tempered(kind, 400, 400, 32, 32, 29, t);
        if (causal) p.v.array() += 200.0f;  // so that fp16's cumsum rows overflow after about 300 keys
        const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
        AttentionOptions mask;
        mask.causal = causal;
        const SoftmaxRoundingAnalysis analysis(q, k, v, mask);
        for (const char* spec : {"probsparse", "probsparse:factor=2", "probsparse:lazy=cumsum"}) {
          auto m64 = make_method<double>(spec, 3);
          m64->compute(q, k, mask);
          const MatrixR<double> own = m64->output(v);
          const auto* s64 = dynamic_cast<const ProbSparseMethod<double>*>(m64.get());
          ASSERT_NE(s64, nullptr);
          const bool cumsum = s64->settings().lazy == ProbSparseLazy::Cumsum;
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::eager, Policy::careful}) {
              SCOPED_TRACE(::testing::Message() << kind << " t=" << t << (causal ? " causal " : " ") << spec << " "
                                                << storage_name(st) << " " << policy_name(pol));
              AttentionOptions o = mask;
              o.storage = st;
              o.policy = pol;
              const Emulated run = emulated(spec, 3, p.q, p.k, p.v, o);
              const auto* s32 = dynamic_cast<const ProbSparseMethod<float>*>(run.method.get());
              ASSERT_NE(s32, nullptr);
              const MatrixR<double>& out = run.out;
              const KernelRoundingBound b = probsparse_rounding_bound(analysis, v, s64->selected_queries(),
                                                                      s32->selected_queries(), o, cumsum);
              EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
              EXPECT_EQ(outside_guaranteed(out, own, b.output), 0);
              Index flipped = 0;
              for (Index i = 0; i < own.rows(); ++i) {
                const bool a = std::binary_search(s64->selected_queries().begin(), s64->selected_queries().end(), i),
                           c = std::binary_search(s32->selected_queries().begin(), s32->selected_queries().end(), i);
                flipped += a != c;
              }
              flips += flipped;
              rows += own.rows();
              without += b.rows_without_guarantee;
              if (causal && cumsum && st == Storage::fp16) {
                // fp16 cumsum: the stored prefix sums of V + 200 pass 65504 near key 330; the bound gives those up,
                // and the emulation's stored output is inf there (the overflow the tallies report).
                EXPECT_GT(b.rows_without_guarantee, flipped + 50);
                EXPECT_GT((out.array().isInf()).rowwise().any().count(), 50);
              } else if (!causal) {
                EXPECT_EQ(b.rows_without_guarantee, flipped) << "a row lost its guarantee without a flip";
              } else {  // (fp16 eager: exact rows whose stored running sum of p·(V + 200) may pass 65504, too)
                EXPECT_GE(b.rows_without_guarantee, flipped);
              }
            }
        }
      }
  EXPECT_LT(without, rows / 5) << "the bound holds vacuously: most rows without a guarantee";
  std::printf("  probsparse: %lld rows chosen differently in the format, %lld of %lld rows without a guarantee\n",
              static_cast<long long>(flips), static_cast<long long>(without), static_cast<long long>(rows));
}

// Reformer's bound (reformer_rounding_bound): where both runs hashed every key of a row alike, exact's streaming bound
// over the row's key set in `rounds` pieces (non-causal) or the pattern softmax's (causal); a row whose key set moved
// is counted, not bounded. Entry by entry against the emulation: sources, temperatures, bucket/chunk/round settings,
// both masks, formats and policies; its O is the float64 method's own. Most rows must keep a guarantee (else the
// test would hold vacuously).
TEST(RoundingBound, ReformerRespectsItWhereTheKeySetsAgree) {
  Index rows = 0, moved = 0;
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {1.0, 4.0}) {
      Qkv<float> p = tempered(kind, 300, 300, 32, 32, 31, t);
      const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
      for (const char* spec : {"reformer:buckets=8,chunk=32", "reformer:buckets=4,chunk=16,rounds=4"})
        for (const bool causal : {false, true}) {
          AttentionOptions o64;
          o64.causal = causal;
          auto m64 = make_method<double>(spec, 3);
          m64->compute(q, k, o64);
          const MatrixR<double> own = m64->output(v);
          const auto* sp = dynamic_cast<const SparseOperator<double>*>(&m64->op());
          ASSERT_NE(sp, nullptr) << spec;
          const std::vector<std::vector<Index>> keys64 = sp->row_keys();
          ASSERT_EQ(dynamic_cast<const ReformerMethod<double>*>(m64.get())->key_sets(), keys64) << "P̃'s key sets";
          const SoftmaxRoundingAnalysis analysis(q, k, v, keys64, o64.resolved_scale(q.cols()));
          const Index rounds = std::string(spec).find("rounds=4") != std::string::npos ? 4 : 2;
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::eager, Policy::careful}) {
              SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " " << spec << (causal ? " causal " : " ")
                                                << storage_name(st) << " " << policy_name(pol));
              AttentionOptions o = o64;
              o.storage = st;
              o.policy = pol;
              const Emulated run = emulated(spec, 3, p.q, p.k, p.v, o);
              const MatrixR<double>& out = run.out;
              const auto* r32 = dynamic_cast<const ReformerMethod<float>*>(run.method.get());
              ASSERT_NE(r32, nullptr);
              const KernelRoundingBound b = reformer_rounding_bound(analysis, keys64, r32->key_sets(), rounds, o);
              EXPECT_LT((b.reference - own).norm(), 1e-12 * own.norm()) << "the bound's O is not the method's";
              EXPECT_EQ(outside_guaranteed(out, own, b.output), 0);
              rows += out.rows();
              moved += b.rows_without_guarantee;
              if (t == 1.0 && std::string(kind) == "gaussian" && !causal) {
                double measured = 0, bounded = 0;
                for (Index i = 0; i < out.rows(); ++i)
                  if (b.output.row(i).allFinite()) {
                    measured += (out.row(i) - own.row(i)).squaredNorm();
                    bounded += b.output.row(i).squaredNorm();
                  }
                std::printf("  %-38s %s %-7s |ΔO|_F / bound %.3f (rows with a guarantee), %lld rows without\n", spec,
                            storage_name(st).c_str(), policy_name(pol).c_str(),
                            bounded > 0 ? std::sqrt(measured / bounded) : 0.0,
                            static_cast<long long>(b.rows_without_guarantee));
              }
            }
        }
    }
  std::printf("  reformer: %lld of %lld rows without a guarantee (a key set moved by rounding)\n",
              static_cast<long long>(moved), static_cast<long long>(rows));
  EXPECT_LT(moved, rows / 2) << "the bound holds vacuously";
}

/// Transformer-VQ's bound (vq_rounding_bound, its second form: each run's codebook) against the emulation, entry by
/// entry, where both runs assigned every key alike: key j about the code centre (7j mod codes) at a near and a far
/// spread, both masks (causal: 50 keys before the first query, the cache the emulation fills first, then 4 blocks of
/// 64 queries), t 1 and 4, both formats and policies. No entry may fall outside the bound anywhere; at the near spread
/// every row must keep its guarantee; it prints how many cases keep one on every row.
void vq_bound_cases(const std::string& spec, const MatrixR<float>& centres, float far) {
  const Index n = 300, d = centres.cols(), codes = centres.rows();
  const char* label = spec.find("codebook=") == std::string::npos ? "vq k-means" : "vq fixed codebook";
  Index cases = 0, guaranteed = 0;
  for (const bool causal : {false, true})
    for (const float spread : {0.1f, far})
      for (const double t : {1.0, 4.0}) {
        MatrixR<float> q = gaussian(causal ? n - 50 : n, d, 1), k = gaussian(n, d, 2, spread);
        const MatrixR<float> v = gaussian(n, d, 3);
        q *= float(t);
        for (Index j = 0; j < n; ++j) k.row(j) += centres.row((7 * j) % codes);
        AttentionOptions mask;
        mask.causal = causal;
        auto m64 = make_method<double>(spec);
        m64->compute(q.cast<double>(), k.cast<double>(), mask);
        const MatrixR<double> own = m64->output(v.cast<double>());
        const auto* op64 = dynamic_cast<const CodebookOperator<double>*>(&m64->op());
        const auto* vq64 = dynamic_cast<const VqMethod<double>*>(m64.get());
        EXPECT_TRUE(op64 != nullptr && vq64 != nullptr);
        if (op64 == nullptr || vq64 == nullptr) return;
        for (const Storage st : {Storage::bf16, Storage::fp16})
          for (const Policy pol : {Policy::eager, Policy::careful}) {
            SCOPED_TRACE(::testing::Message() << spec << (causal ? " causal" : "") << " spread " << spread
                                              << " t=" << t << " " << storage_name(st) << " " << policy_name(pol));
            AttentionOptions o = mask;
            o.storage = st;
            o.policy = pol;
            const Emulated run = emulated(spec, std::nullopt, q, k, v, o);
            const auto* op32 = dynamic_cast<const CodebookOperator<float>*>(&run.method->op());
            const auto* vq32 = dynamic_cast<const VqMethod<float>*>(run.method.get());
            EXPECT_TRUE(op32 != nullptr && vq32 != nullptr);
            if (op32 == nullptr || vq32 == nullptr) return;
            const KernelRoundingBound b =
                vq_rounding_bound(q.cast<double>(), v.cast<double>(), vq64->codebook(),
                                  vq32->codebook().cast<double>(), op64->assignment(), op32->assignment(), o);
            EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
            EXPECT_EQ(outside_guaranteed(run.out, own, b.output), 0);
            if (spread < 0.5f) {
              EXPECT_EQ(b.rows_without_guarantee, 0) << "keys near their codes: both runs assign every key alike";
            }
            ++cases;
            guaranteed += b.rows_without_guarantee == 0;
            if (b.rows_without_guarantee == 0 && t == 1.0)
              std::printf("  %s%s spread %.1f %s %-7s |ΔO|_F / bound %.3f, bound / |O|_F %.3g\n",
                          label, causal ? " causal" : "", spread, storage_name(st).c_str(),
                          policy_name(pol).c_str(), (run.out - own).norm() / b.output_norm(),
                          b.output_norm() / own.norm());
          }
      }
  std::printf("  %s: %lld of %lld cases with a guarantee on every row\n", label,
              static_cast<long long>(guaranteed), static_cast<long long>(cases));
}

// Transformer-VQ with its k-means codebook (codebook=window, the default): each run fits its own, the emulated one
// in float32 on the stored keys, and the bound is the attention's given both codebooks, where both runs assign every
// key alike up to the codes' numbering. Separated clusters (spread 0.1): the fits agree, so every row keeps its
// guarantee. Overlapping ones (spread 1): wherever the partitions differ, the bound claims nothing.
TEST(RoundingBound, VqKMeansRespectsItWhereTheFitsAgree) {
  const Index n = 300, d = 32, codes = 16;
  const MatrixR<float> centres = gaussian(codes, d, 5);
  vq_bound_cases("vq:codes=16", centres, 1.0f);
  // The renumbering on its own: the same partition numbered the other way round, the emulated codebook's rows moved
  // alike, gives the bound of the runs numbered alike, bit for bit; a partition that differs (one key moved) none.
  const MatrixR<double> q = gaussian(n, d, 1).cast<double>(), v = gaussian(n, d, 3).cast<double>();
  const MatrixR<double> c = centres.cast<double>();
  MatrixR<double> c_reversed(codes, d);
  std::vector<Index> assigned(static_cast<std::size_t>(n)), reversed(assigned.size());
  for (Index y = 0; y < codes; ++y) c_reversed.row(codes - 1 - y) = c.row(y);
  for (Index j = 0; j < n; ++j) {
    assigned[std::size_t(j)] = (7 * j) % codes;
    reversed[std::size_t(j)] = codes - 1 - assigned[std::size_t(j)];
  }
  AttentionOptions o;
  o.storage = Storage::bf16;
  const KernelRoundingBound alike = vq_rounding_bound(q, v, c, c, assigned, assigned, o);
  const KernelRoundingBound renumbered = vq_rounding_bound(q, v, c, c_reversed, assigned, reversed, o);
  EXPECT_EQ(alike.rows_without_guarantee, 0);
  EXPECT_TRUE(renumbered.output.cwiseEqual(alike.output).all()) << "a renumbering changed the bound";
  reversed[5] = (reversed[5] + 1) % codes;
  EXPECT_EQ(vq_rounding_bound(q, v, c, c_reversed, assigned, reversed, o).rows_without_guarantee, n);
}

// Transformer-VQ with a fixed codebook both runs share (codebook=PATH.npy): keys near their codes and keys spread
// between them (a flip, if rounding moves one, leaves the output without a guarantee, counted).
TEST(RoundingBound, VqRespectsItWhereTheAssignmentsAgree) {
  const Index n = 300, d = 32, codes = 16;
  const MatrixR<float> codebook = gaussian(codes, d, 5);
  const std::string path = ::testing::TempDir() + "attnlab_rounding_bound_vq_codebook.npy";
  write_npy<double>(path, codebook.cast<double>());
  vq_bound_cases("vq:codes=16,codebook=" + path, codebook, 4.0f);
  // A flipped assignment (here written in: rounding rarely moves a key across codes this far apart) changes a code's
  // sum and count, which every query reads: no row keeps a guarantee, and the bound says so rather than promise one.
  const MatrixR<float> q = gaussian(n, d, 1), v = gaussian(n, d, 3);
  std::vector<Index> assigned(static_cast<std::size_t>(n)), chosen;
  for (Index j = 0; j < n; ++j) assigned[std::size_t(j)] = (7 * j) % codes;
  chosen = assigned;
  chosen[5] = (chosen[5] + 1) % codes;
  AttentionOptions o;
  o.storage = Storage::bf16;
  const KernelRoundingBound same = vq_rounding_bound(q.cast<double>(), v.cast<double>(), codebook.cast<double>(),
                                                     assigned, assigned, o);
  const KernelRoundingBound moved = vq_rounding_bound(q.cast<double>(), v.cast<double>(), codebook.cast<double>(),
                                                      assigned, chosen, o);
  EXPECT_EQ(same.rows_without_guarantee, 0);
  EXPECT_EQ(moved.rows_without_guarantee, n);
  EXPECT_TRUE(moved.output.array().isInf().all());
  // Causal: only the rows that see the flipped key (key 5: rows 5 on) lose their guarantee.
  o.causal = true;
  const KernelRoundingBound causal_moved =
      vq_rounding_bound(q.cast<double>(), v.cast<double>(), codebook.cast<double>(), assigned, chosen, o);
  EXPECT_EQ(causal_moved.rows_without_guarantee, n - 5);
  EXPECT_TRUE(causal_moved.output.topRows(5).allFinite());
  EXPECT_TRUE(causal_moved.output.bottomRows(n - 5).array().isInf().all());
  std::remove(path.c_str());
}

// Soft Transformer-VQ's bound (vq_soft_rounding_bound): the responsibilities from the stored keys and each run's
// k-means codebook, stored; their masses and value sums; then the hard bound's weights and division. Entry by entry
// against the emulation, clustered keys (near their centres, and spread) at two responsibility temperatures T and two
// query temperatures, both formats and policies; its O must be the float64 method's own. Careful keeps every row's
// guarantee where the keys lie near their centres, and in fp16 everywhere here (bf16 with spread keys gives up: its
// stored keys and refitted codebook move the responsibilities too far); eager, which stores KCᵀ and the norms before
// they cancel (a logit's error of order u·‖k‖²/T), gives up in bf16 and at T = 0.25 — a worst case: the measured
// errors stay near careful's.
TEST(RoundingBound, VqSoftRespectsIt) {
  const Index n = 300, d = 32, codes = 16;
  const MatrixR<float> centres = gaussian(codes, d, 5);
  Index cases = 0, guaranteed = 0;
  for (const float spread : {0.1f, 1.0f})
    for (const double temp : {0.25, 1.0})
      for (const double t : {1.0, 4.0}) {
        MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2, spread);
        const MatrixR<float> v = gaussian(n, d, 3);
        q *= float(t);
        for (Index j = 0; j < n; ++j) k.row(j) += centres.row((7 * j) % codes);
        const std::string spec = fmt::format("vq:codes={},assign=soft,temperature={}", codes, temp);
        auto m64 = make_method<double>(spec);
        m64->compute(q.cast<double>(), k.cast<double>());
        const MatrixR<double> own = m64->output(v.cast<double>());
        const auto& vq64 = dynamic_cast<const VqMethod<double>&>(*m64);
        for (const Storage st : {Storage::bf16, Storage::fp16})
          for (const Policy pol : {Policy::eager, Policy::careful}) {
            SCOPED_TRACE(::testing::Message() << spec << " spread " << spread << " t=" << t << " "
                                              << storage_name(st) << " " << policy_name(pol));
            AttentionOptions o;
            o.storage = st;
            o.policy = pol;
            const Emulated run = emulated(spec, std::nullopt, q, k, v, o);
            const auto& vq32 = dynamic_cast<const VqMethod<float>&>(*run.method);
            const KernelRoundingBound b =
                vq_soft_rounding_bound(q.cast<double>(), k.cast<double>(), v.cast<double>(), vq64.codebook(),
                                       vq32.codebook().cast<double>(), temp, o);
            EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
            EXPECT_EQ(outside_guaranteed(run.out, own, b.output), 0);
            if (pol == Policy::careful && (spread < 0.5f || st == Storage::fp16)) {
              EXPECT_EQ(b.rows_without_guarantee, 0) << "careful, keys near their centres or fp16";
            }
            ++cases;
            guaranteed += b.rows_without_guarantee == 0;
            if (b.rows_without_guarantee == 0 && t == 1.0)
              std::printf("  vq soft T=%.2f spread %.1f %s %-7s |ΔO|_F / |O|_F %.2e, / bound %.3f, bound / |O|_F "
                          "%.3g\n", temp, spread, storage_name(st).c_str(), policy_name(pol).c_str(),
                          (run.out - own).norm() / own.norm(), (run.out - own).norm() / b.output_norm(),
                          b.output_norm() / own.norm());
          }
      }
  std::printf("  vq soft: %lld of %lld cases with a guarantee on every row\n", static_cast<long long>(guaranteed),
              static_cast<long long>(cases));
}

/// One run of quantize=both as vq_both_rounding_bound reads it.
template <typename T>
VqBothRun both_run(const Method<T>& m) {
  const auto& vq = dynamic_cast<const VqMethod<T>&>(m);
  return {vq.codebook().template cast<double>(), vq.query_codebook().template cast<double>(), vq.key_codes(),
          vq.query_codes()};
}

// Transformer-VQ's two-codebook form (quantize=both, attnlab's mean-field form) against its bound, entry by entry:
// queries and keys about their own centres (query i about centre 5i mod codes, key j about 7j mod codes) at a near and
// a far spread, query temperatures t 1 and 4, both formats and policies; each run fits both codebooks, and its O must
// be the float64 method's own. No entry may fall outside the bound anywhere; at the near spread the fits agree and
// every row keeps its guarantee. Then the codes' role: one query's code moved leaves that row alone without a
// guarantee, one key's code every row.
TEST(RoundingBound, VqBothRespectsIt) {
  const Index n = 300, d = 32, codes = 16;
  const MatrixR<float> kc = gaussian(codes, d, 5), qc = gaussian(codes, d, 6);
  const std::string spec = "vq:codes=16,quantize=both";
  Index cases = 0, guaranteed = 0;
  for (const float spread : {0.1f, 1.0f})
    for (const double t : {1.0, 4.0}) {
      MatrixR<float> q = gaussian(n, d, 1, spread), k = gaussian(n, d, 2, spread);
      const MatrixR<float> v = gaussian(n, d, 3);
      for (Index j = 0; j < n; ++j) k.row(j) += kc.row((7 * j) % codes);
      for (Index i = 0; i < n; ++i) q.row(i) += qc.row((5 * i) % codes);
      q *= float(t);
      auto m64 = make_method<double>(spec);
      m64->compute(q.cast<double>(), k.cast<double>());
      const MatrixR<double> own = m64->output(v.cast<double>());
      for (const Storage st : {Storage::bf16, Storage::fp16})
        for (const Policy pol : {Policy::eager, Policy::careful}) {
          SCOPED_TRACE(::testing::Message() << spec << " spread " << spread << " t=" << t << " " << storage_name(st)
                                            << " " << policy_name(pol));
          AttentionOptions o;
          o.storage = st;
          o.policy = pol;
          const Emulated run = emulated(spec, std::nullopt, q, k, v, o);
          const KernelRoundingBound b = vq_both_rounding_bound(q.cast<double>(), k.cast<double>(), v.cast<double>(),
                                                               both_run(*m64), both_run(*run.method), o);
          EXPECT_LT((b.reference - own).norm(), 1e-10 * own.norm()) << "the bound's O is not the method's";
          EXPECT_EQ(outside_guaranteed(run.out, own, b.output), 0);
          if (spread < 0.5f) {
            EXPECT_EQ(b.rows_without_guarantee, 0) << "queries and keys near their codes: the fits agree";
          }
          ++cases;
          guaranteed += b.rows_without_guarantee == 0;
          if (b.rows_without_guarantee == 0 && t == 1.0)
            std::printf("  vq both spread %.1f %s %-7s |ΔO|_F / |O|_F %.2e, / bound %.3f, bound / |O|_F %.3g\n",
                        spread, storage_name(st).c_str(), policy_name(pol).c_str(),
                        (run.out - own).norm() / own.norm(), (run.out - own).norm() / b.output_norm(),
                        b.output_norm() / own.norm());
        }
      if (spread > 0.5f || t != 1.0) continue;
      // The codes: the float64 run read as both runs (the same codes), then one query's code, then one key's, moved.
      AttentionOptions o;
      o.storage = Storage::bf16;
      const VqBothRun same = both_run(*m64);
      const MatrixR<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
      EXPECT_EQ(vq_both_rounding_bound(qd, kd, vd, same, same, o).rows_without_guarantee, 0);
      VqBothRun moved = same;
      moved.query_codes[7] = (moved.query_codes[7] + 1) % codes;
      const KernelRoundingBound bq = vq_both_rounding_bound(qd, kd, vd, same, moved, o);
      EXPECT_EQ(bq.rows_without_guarantee, 1);
      EXPECT_FALSE(bq.output.row(7).allFinite());
      moved = same;
      moved.key_codes[11] = (moved.key_codes[11] + 1) % codes;
      EXPECT_EQ(vq_both_rounding_bound(qd, kd, vd, same, moved, o).rows_without_guarantee, n);
      // A key past fp16's range (its stored residual inf): no guarantee anywhere, not a NaN bound.
      MatrixR<double> kbig = kd;
      kbig(0, 0) = 1e5;
      o.storage = Storage::fp16;
      const KernelRoundingBound bk = vq_both_rounding_bound(qd, kbig, vd, same, same, o);
      EXPECT_EQ(bk.rows_without_guarantee, n);
      EXPECT_FALSE(bk.output.hasNaN());
    }
  std::printf("  vq both: %lld of %lld cases with a guarantee on every row\n", static_cast<long long>(guaranteed),
              static_cast<long long>(cases));
}

// A review's counterexamples to the Reformer and VQ bounds (two of them in exact attention's softmax bound, which
// Reformer's inherits): each must hold or give up (+inf), never promise a finite bound the emulation breaks.
//  - Eigen's vectorised exp clamps its argument at −88.72 (e^{−100} comes out about 2.9e-39, a bf16 subnormal),
//    beside a value of 2e37: the probabilities' absolute error is float32's exp floor, not the format's η;
//  - q·k formed in float32 before a tiny scale (Eigen takes the scale out of (s·Q)·Kᵀ) overflows though s·q·k = 128;
//  - VQ: a code's float32 value sum passes float32's range (2 × 2e38) under careful; QCᵀ overflows before the scale.
TEST(RoundingBound, ReviewCounterexamplesGiveNoFalsePromise) {
  const auto outside_of = [](const MatrixR<float>& out, const MatrixR<double>& own, const MatrixR<double>& bound) {
    return outside_guaranteed(out.cast<double>(), own, bound);
  };
  for (const Policy pol : {Policy::careful, Policy::eager}) {
    SCOPED_TRACE(policy_name(pol));
    {  // the exp clamp: n = 16, d = 1, every query sees logit 0 (key 0) and −100 (the rest), v_3 = 2e37
      MatrixR<float> q = MatrixR<float>::Constant(16, 1, 10.0f), k = MatrixR<float>::Constant(16, 1, -10.0f),
                     v = MatrixR<float>::Zero(16, 1);
      k(0, 0) = 0;
      v(3, 0) = 2e37f;
      const MatrixR<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
      AttentionOptions o;
      o.storage = Storage::bf16;
      o.policy = pol;
      const std::string spec = "reformer:buckets=1,chunk=8,rounds=1";
      auto m64 = make_method<double>(spec, 3);
      m64->compute(qd, kd);
      const MatrixR<double> own = m64->output(vd);
      const auto* r64 = dynamic_cast<const ReformerMethod<double>*>(m64.get());
      ASSERT_NE(r64, nullptr);
      const SoftmaxRoundingAnalysis pattern(qd, kd, vd, r64->key_sets(), AttentionOptions{}.resolved_scale(1));
      auto m = make_method<float>(spec, 3);
      m->compute(q, k, o);
      const auto* r32 = dynamic_cast<const ReformerMethod<float>*>(m.get());
      EXPECT_EQ(outside_of(m->output(v), own, reformer_rounding_bound(pattern, r64->key_sets(), r32->key_sets(), 1, o)
                                                 .output),
                0);
      for (const bool streaming : {true, false}) {
        auto e = make_method<float>(streaming ? "exact:impl=streaming" : "exact:impl=materialized");
        e->compute(q, k, o);
        const MatrixR<double> exact = exact_output<double>(qd, kd, vd, AttentionOptions{});
        EXPECT_EQ(outside_of(e->output(v), exact, softmax_rounding_bound(qd, kd, vd, o, streaming).output), 0)
            << (streaming ? "streaming" : "materialized");
      }
    }
    for (const bool causal : {false, true}) {  // q·k = 2¹²⁹ in float32 before s = 2⁻¹²²
      MatrixR<float> q = MatrixR<float>::Constant(8, 1, std::ldexp(1.0f, 66)),
                     k = MatrixR<float>::Constant(8, 1, std::ldexp(1.0f, 63)), v(8, 1);
      for (Index i = 0; i < 8; ++i) v(i, 0) = float(i);
      const MatrixR<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
      AttentionOptions o64;
      o64.causal = causal;
      o64.scale = std::ldexp(1.0, -122);
      const std::string spec = "reformer:buckets=1,chunk=4,rounds=1";
      auto m64 = make_method<double>(spec, 3);
      m64->compute(qd, kd, o64);
      const MatrixR<double> own = m64->output(vd);
      const auto* r64 = dynamic_cast<const ReformerMethod<double>*>(m64.get());
      const SoftmaxRoundingAnalysis pattern(qd, kd, vd, r64->key_sets(), o64.scale);
      AttentionOptions o = o64;
      o.storage = Storage::bf16;
      o.policy = pol;
      auto m = make_method<float>(spec, 3);
      m->compute(q, k, o);
      const auto* r32 = dynamic_cast<const ReformerMethod<float>*>(m.get());
      EXPECT_EQ(outside_of(m->output(v), own, reformer_rounding_bound(pattern, r64->key_sets(), r32->key_sets(), 1, o)
                                                 .output),
                0)
          << (causal ? "causal" : "non-causal");
      auto e = make_method<float>("exact");
      e->compute(q, k, o);
      EXPECT_EQ(outside_of(e->output(v), exact_output<double>(qd, kd, vd, o64),
                           softmax_rounding_bound(qd, kd, vd, o, true).output),
                0);
    }
    for (const int which : {1, 2}) {  // VQ with a fixed codebook
      MatrixR<float> c(which == 1 ? 2 : 1, 1), q(4, 1), k(4, 1), v(4, 1);
      double scale = 1;
      if (which == 1) {  // code 1's float32 sum 4e38 overflows; its weight e^{−50} is positive
        c << 1, -1;
        q.setConstant(25);
        k << 1, 1, -1, -1;
        v << 1, 2, 2e38f, 2e38f;
      } else {  // q·c = 2¹²⁹ in float32 before s = 2⁻¹¹²
        c << std::ldexp(1.0f, 63);
        q.setConstant(std::ldexp(1.0f, 66));
        k.setConstant(std::ldexp(1.0f, 63));
        v << 1, 2, 3, 4;
        scale = std::ldexp(1.0, -112);
      }
      const std::string path = ::testing::TempDir() + "attnlab_rounding_bound_review_" + std::to_string(which) + ".npy";
      write_npy<double>(path, c.cast<double>());
      const std::string spec = "vq:codes=" + std::to_string(c.rows()) + ",codebook=" + path;
      AttentionOptions o64;
      o64.scale = scale;
      auto m64 = make_method<double>(spec);
      m64->compute(q.cast<double>(), k.cast<double>(), o64);
      const MatrixR<double> own = m64->output(v.cast<double>());
      AttentionOptions o = o64;
      o.storage = Storage::bf16;
      o.policy = pol;
      auto m = make_method<float>(spec);
      m->compute(q, k, o);
      const auto& a64 = dynamic_cast<const CodebookOperator<double>&>(m64->op()).assignment();
      const auto& a32 = dynamic_cast<const CodebookOperator<float>&>(m->op()).assignment();
      const KernelRoundingBound b =
          vq_rounding_bound(q.cast<double>(), v.cast<double>(), c.cast<double>(), a64, a32, o);
      EXPECT_EQ(outside_of(m->output(v), own, b.output), 0) << "vq case " << which;
      EXPECT_EQ(b.rows_without_guarantee, 4) << "vq case " << which;
      std::remove(path.c_str());
    }
  }
}

// Inputs where the emulation's float32 sums overflow before anything is stored: the bounds give no guarantee there,
// never a finite (or NaN) promise. A review's counterexamples: Performer's key chunk summed before its factor scales
// it; Linformer's F·V whose partial sums pass float32's largest value though F·V is 0; Linformer's e^{2D} beyond
// double's range beside a zero column of V.
TEST(RoundingBound, FloatOverflowBeforeStoringGivesNoGuarantee) {
  // Taylor attention in bf16 with rows whose float32 ‖x‖² overflows (×1e20) or sinks among subnormal squares
  // (×1e-25): the direction the emulation forms is lost; those rows (and, for keys, every row that sees them) have no
  // guarantee, and every other entry is held (a second review's counterexample).
  for (const double scale : {1e20, 1e-25})
    for (const bool causal : {false, true}) {
      Rng rng(43);
      const MatrixR<double> q = (scale * gaussian_matrix<double>(200, 16, rng)).cast<float>().cast<double>();
      const MatrixR<double> k = gaussian_matrix<double>(200, 16, rng).cast<float>().cast<double>();
      const MatrixR<double> v = gaussian_matrix<double>(200, 16, rng).cast<float>().cast<double>();
      AttentionOptions c64;
      c64.causal = causal;
      auto m64 = make_method<double>("taylor", 0);
      m64->compute(q, k, c64);
      const MatrixR<double> own = m64->output(v);
      for (const Policy pol : {Policy::eager, Policy::careful}) {
        SCOPED_TRACE(::testing::Message() << "taylor ×" << scale << (causal ? " causal " : " ") << policy_name(pol));
        AttentionOptions t = c64;
        t.storage = Storage::bf16;
        t.policy = pol;
        auto m = make_method<float>("taylor", 0);
        m->compute(q.cast<float>(), k.cast<float>(), t);
        const MatrixR<double> out = m->output(v.cast<float>()).cast<double>();
        const KernelRoundingBound b = taylor_rounding_bound(q, k, v, t);
        EXPECT_EQ(outside_guaranteed(out, own, b.output), 0);
        EXPECT_GT(b.rows_without_guarantee, 0);
      }
    }
  AttentionOptions o;
  o.storage = Storage::bf16;
  o.policy = Policy::careful;
  {
    const Index n = 4096, d = 16;
    Rng rng(31);
    MatrixR<double> q = gaussian_matrix<double>(64, d, rng), k = MatrixR<double>::Zero(n, d);
    MatrixR<double> v = MatrixR<double>::Ones(n, d);
    const double s = AttentionOptions{}.resolved_scale(d);
    // one key repeated, ‖s^½k‖ = 6
    k.bottomRows(n - 2048).setConstant(6.0 / std::sqrt(s) / std::sqrt(double(d)));
    v.bottomRows(n - 2048).setConstant(1e36);
    auto m64 = make_method<double>("performer:features=16", 1);
    m64->compute(q, k);
    auto m = make_method<float>("performer:features=16", 1);
    m->compute(q.cast<float>(), k.cast<float>(), o);
    const MatrixR<float> out = m->output(v.cast<float>());
    EXPECT_FALSE(out.allFinite()) << "the emulation's chunk sum overflows float32";
    const KernelRoundingBound b = performer_rounding_bound(
        q, k, v, dynamic_cast<const PerformerMethod<double>*>(m64.get())->omega(),
        dynamic_cast<const PerformerMethod<float>*>(m.get())->omega().cast<double>(), PerformerKernel::Positive, o);
    EXPECT_EQ(b.rows_without_guarantee, q.rows());
  }
  for (const Policy pol : {Policy::careful, Policy::eager}) {
    o.policy = pol;
    const Index n = 64;
    Rng rng(37);
    const MatrixR<double> q = gaussian_matrix<double>(n, 8, rng), k = gaussian_matrix<double>(n, 8, rng);
    auto m = make_method<float>("linformer:k=1,projection=uniform", 2);
    m->compute(q.cast<float>(), k.cast<float>(), o);
    const auto* l32 = dynamic_cast<const LinformerMethod<float>*>(m.get());
    MatrixR<double> v(n, 8);
    for (Index j = 0; j < n; ++j)
      v.row(j).setConstant((j < n / 2 ? 2.5e38 : -2.5e38) * (l32->projections().second(0, j) > 0 ? 1.0 : -1.0));
    auto m64 = make_method<double>("linformer:k=1,projection=uniform", 2);
    m64->compute(q, k);
    const auto* l64 = dynamic_cast<const LinformerMethod<double>*>(m64.get());
    const MatrixR<float> out = m->output(v.cast<float>());
    EXPECT_FALSE(out.allFinite()) << "F·V's float32 partial sums overflow";
    const SoftmaxRoundingBound b =
        linformer_rounding_bound(q, k, v, l64->projections().first, l64->projections().second,
                                 l32->projections().first.cast<double>(), l32->projections().second.cast<double>(), o);
    EXPECT_TRUE(std::isinf(b.output.maxCoeff())) << "no guarantee where float32's sums may overflow";
    for (Index i = 0; i < out.size(); ++i)
      EXPECT_TRUE(std::isinf(b.output.data()[i]) || std::isfinite(out.data()[i]));
  }
  {
    o.policy = Policy::careful;
    Rng rng(41);
    const MatrixR<double> q = (3e4 * gaussian_matrix<double>(128, 8, rng)).cast<float>().cast<double>();
    const MatrixR<double> k = (3e4 * gaussian_matrix<double>(128, 8, rng)).cast<float>().cast<double>();
    MatrixR<double> v = gaussian_matrix<double>(128, 8, rng);
    v.col(3).setZero();
    auto m64 = make_method<double>("linformer:k=16,projection=pool", 0);
    m64->compute(q, k);
    auto m = make_method<float>("linformer:k=16,projection=pool", 0);
    m->compute(q.cast<float>(), k.cast<float>(), o);
    const SoftmaxRoundingBound b = linformer_rounding_bound(
        q, k, v, dynamic_cast<const LinformerMethod<double>*>(m64.get())->projections().first,
        dynamic_cast<const LinformerMethod<double>*>(m64.get())->projections().second,
        dynamic_cast<const LinformerMethod<float>*>(m.get())->projections().first.cast<double>(),
        dynamic_cast<const LinformerMethod<float>*>(m.get())->projections().second.cast<double>(), o);
    EXPECT_FALSE(b.output.hasNaN()) << "e^{2D} beyond double's range is +inf, never inf·0";
  }
}

// Linear attention's derived worst-case bound (analysis/rounding_bound.hpp, linear_rounding_bound) against the
// emulation, entry by entry: sources, temperatures (q and k scaled by t: linear attention has no scale), both feature
// maps, formats and policies. Where the emulation fails (fp16 eager from n = 1024: the key sum passes 65504 and
// x/inf = 0 gives all-zero rows) the bound must already have given up on those rows: a finite bound with a failed row
// would be a violation. Printed: how tight it is.
TEST(RoundingBound, LinearAttentionRespectsItEntryByEntry) {
  for (const char* kind : {"gaussian", "clustered"})
    for (const double t : {0.5, 1.0, 2.0})
      for (const Index n : {Index(200), Index(1200)}) {
        Qkv<float> p = tempered(kind, n, n, 64, 32, 7, t);
        p.k *= float(t);
        const MatrixR<double> q = p.q.cast<double>(), k = p.k.cast<double>(), v = p.v.cast<double>();
        for (const char* spec : {"linear", "linear:feature=relu"}) {
          const LinearFeature feature = std::string(spec) == "linear" ? LinearFeature::Elu : LinearFeature::Relu;
          auto m64 = make_method<double>(spec);
          m64->compute(q, k);
          const MatrixR<double> ref = m64->output(v);
          for (const Storage st : {Storage::bf16, Storage::fp16})
            for (const Policy pol : {Policy::eager, Policy::careful}) {
              SCOPED_TRACE(::testing::Message() << kind << " t=" << t << " n=" << n << " " << spec << " "
                                                << storage_name(st) << " " << policy_name(pol));
              AttentionOptions o;
              o.storage = st;
              o.policy = pol;
              const Emulated run = emulated(spec, std::nullopt, p.q, p.k, p.v, o);
              const MatrixR<double>& out = run.out;
              const KernelRoundingBound b = linear_rounding_bound(q, k, v, feature, o);
              Index violations = 0, failed_rows = 0;
              double measured = 0, bounded = 0;
              for (Index i = 0; i < n; ++i) {
                const bool failed = !out.row(i).allFinite() || (out.row(i).array() == 0.0).all();
                failed_rows += failed;
                for (Index c = 0; c < out.cols(); ++c) {
                  const double err = std::abs(out(i, c) - ref(i, c));
                  // A non-finite entry (NaN included) needs an infinite bound.
                  violations += !(std::isinf(b.output(i, c)) || err <= b.output(i, c));
                  if (std::isfinite(b.output(i, c))) {
                    measured += err * err;
                    bounded += b.output(i, c) * b.output(i, c);
                  }
                }
              }
              EXPECT_EQ(violations, 0);
              // Where nothing overflows the bound holds everywhere; the failures are in fp16 eager only.
              if (failed_rows > 0) {
                EXPECT_EQ(st, Storage::fp16);
                EXPECT_EQ(pol, Policy::eager);
              }
              if (feature == LinearFeature::Elu && !(st == Storage::fp16 && pol == Policy::eager)) {
                EXPECT_EQ(b.rows_without_guarantee, 0);
              }
              if (t == 1.0)
                std::printf("  %-9s n=%-5lld %-20s %s %-7s |ΔO|_F / bound %.3f, bound / |O|_F %.3g, rows without "
                            "a guarantee %lld, failed rows %lld\n", kind, static_cast<long long>(n), spec,
                            storage_name(st).c_str(), policy_name(pol).c_str(),
                            bounded > 0 ? std::sqrt(measured / bounded) : 0.0,
                            bounded > 0 ? std::sqrt(bounded) / ref.norm() : 0.0,
                            static_cast<long long>(b.rows_without_guarantee), static_cast<long long>(failed_rows));
            }
        }
      }
}

// Linear attention's bound at the edges of float32 and of the format (a review's counterexamples): values so small
// that float32 underflows and careful's guarded reciprocal clamps, so large that float32's sums overflow, and queries
// far below −88.72, where Eigen's vectorised exp clamps e^x to about 2.9e-39. The bound must hold or give up (+inf).
TEST(RoundingBound, LinearAttentionAtFloat32sEdges) {
  struct Case {
    const char* what;
    MatrixR<float> q, k, v;
  };
  std::vector<Case> cases;
  {
    MatrixR<float> q(2, 1), k(2, 1), v(2, 1);
    q << 1e-30f, 1e-30f;
    k << 1e-15f, 1e-15f;
    v << 1, 1;
    cases.push_back({"float32 underflow (relu)", q, k, v});
    q << 1e-20f, 1e-20f;
    k << 1e-19f, 1e-19f;
    cases.push_back({"a subnormal normaliser (relu)", q, k, v});
  }
  {
    MatrixR<float> q = MatrixR<float>::Constant(4, 2, 1e19f), k = q, v = MatrixR<float>::Ones(4, 2);
    cases.push_back({"float32 overflow", q, k, v});
  }
  {
    MatrixR<float> q(3, 8), k(3, 8), v(3, 8);
    q << -100, -25.3f, -1e4f, -1e4f, -1e4f, -1e4f, -1e4f, -1e4f, -90, -3, -200, 1, 0, 0, 0, 0, -95, -95, -95, -95,
        -95, -95, -95, -95;
    k.setZero();
    k.row(0).setConstant(1e30f);
    k.row(1) << -200, 30, 0, 0, 0, 0, 0, 0;
    v.setOnes();
    v.row(1) *= -1;
    cases.push_back({"exp clamped below −88.72", q, k, v});
  }
  Index held = 0, gave_up = 0;  // entries held to a finite bound, entries without a guarantee
  for (const Case& c : cases)
    for (const char* spec : {"linear", "linear:feature=relu"})
      for (const Storage st : {Storage::bf16, Storage::fp16})
        for (const Policy pol : {Policy::eager, Policy::careful}) {
          SCOPED_TRACE(::testing::Message() << c.what << " " << spec << " " << storage_name(st) << " "
                                            << policy_name(pol));
          const LinearFeature feature =
              std::string(spec) == "linear" ? LinearFeature::Elu : LinearFeature::Relu;
          const MatrixR<double> q = c.q.cast<double>(), k = c.k.cast<double>(), v = c.v.cast<double>();
          AttentionOptions o;
          o.storage = st;
          o.policy = pol;
          const KernelRoundingBound b = linear_rounding_bound(q, k, v, feature, o);
          // The reference in exact arithmetic (long double), and the emulation; where the emulation refuses (a
          // non-finite feature), nothing to hold.
          MatrixR<float> out;
          try {
            auto m = make_method<float>(spec);
            m->compute(c.q, c.k, o);
            out = m->output(c.v);
          } catch (const Error&) {
            continue;
          }
          for (Index i = 0; i < q.rows(); ++i) {
            long double num[8] = {0}, den = 0;
            for (Index j = 0; j < k.rows(); ++j) {
              long double w = 0;
              for (Index x = 0; x < q.cols(); ++x) {
                const auto phi = [&](long double y) {
                  return feature == LinearFeature::Relu ? std::max(y, 0.0L) : (y > 0 ? y + 1 : std::exp(y));
                };
                w += phi(q(i, x)) * phi(k(j, x));
              }
              den += w;
              for (Index x = 0; x < v.cols(); ++x) num[x] += w * v(j, x);
            }
            for (Index x = 0; x < v.cols(); ++x) {
              if (std::isinf(b.output(i, x))) {
                ++gave_up;
                continue;
              }
              ++held;
              ASSERT_TRUE(den > 0) << "a finite bound on a row with no normaliser";
              const double err = std::abs(double(out(i, x)) - double(num[x] / den));
              EXPECT_LE(err, b.output(i, x)) << "row " << i << " col " << x;
            }
          }
        }
  // Both happen: the edges are not all given up on, and the underflow and overflow cases are.
  EXPECT_GT(held, 0);
  EXPECT_GT(gave_up, 0);
  std::printf("  edges: %lld entries held to a finite bound, %lld without a guarantee\n", static_cast<long long>(held),
              static_cast<long long>(gave_up));
}

// The materialised exact backward under emulated storage, against a transcription of its roundings written out here
// (autograd's tensors, core/precision.hpp's round_stored on each): Q, K, V, dO stored; P the forward's stored
// probabilities; dP = dO·Vᵀ stored; D in float32; dS = P ∘ (dP − D) stored, s·dS stored again under eager; dQ, dK,
// dV stored. The same float32 products as the library's, so the same bits.
TEST(Precision, ExactMaterializedBackwardIsItsTranscription) {
  const Index n = 96, d = 16;
  const MatrixR<float> q = gaussian(n, d, 1, 2.0f), k = gaussian(n, d, 2), v = gaussian(n, d, 3);
  const MatrixR<float> dout = gaussian(n, d, 4);
  for (const Storage st : {Storage::bf16, Storage::fp16})
    for (const Policy pol : {Policy::eager, Policy::careful}) {
      SCOPED_TRACE(storage_name(st) + " " + policy_name(pol));
      AttentionOptions o;
      o.storage = st;
      o.policy = pol;
      auto m = make_method<float>("exact:impl=materialized");
      m->compute(q, k, o);
      const Gradients<float> g = m->backward(v, dout);
      const auto rnd = [&](MatrixR<float> x) {
        for (Index i = 0; i < x.size(); ++i) x.data()[i] = round_stored(st, x.data()[i]);
        return x;
      };
      const MatrixR<float> qs = rnd(q), ks = rnd(k), vs = rnd(v), dos = rnd(dout);
      const MatrixR<float> p = m->matrix();  // the stored P (the forward's)
      const float s = float(1.0 / std::sqrt(double(d)));
      MatrixR<float> dv;
      dv.noalias() = p.transpose() * dos;
      MatrixR<float> ds = rnd(dos * vs.transpose());
      const VectorX<float> dsum = (p.array() * ds.array()).rowwise().sum();
      ds = rnd((p.array() * (ds.array().colwise() - dsum.array())).matrix());
      ds *= s;
      if (pol == Policy::eager) ds = rnd(ds);
      MatrixR<float> dq, dk;
      dq.noalias() = ds * ks;
      dk.noalias() = ds.transpose() * qs;
      EXPECT_TRUE(g.dq == rnd(dq));
      EXPECT_TRUE(g.dk == rnd(dk));
      EXPECT_TRUE(g.dv == rnd(dv));
      EXPECT_EQ(m->gradient_check().nonfinite, 0u);
    }
}

// The causal kernel forms under emulated storage (operators/kernel.hpp, emulated_causal_kernel_output): the careful
// policy stays within a few units of the format of the native causal output (either causal form, with n_k > n_q too);
// eager linear attention in float16 fails from the position on where its normaliser φ(q_i)ᵀΣ_{j≤i}φ(k_j) passes
// 65504 — never in the first half of the sequence (the key sum is still small there), in most rows of the last
// quarter (x/inf = 0: all-zero rows), the rows before the first failure within a few fp16 units: the causal form of
// issue 39's first GPU observation, which grows with the position (and with each query's own features).
TEST(Precision, CausalKernelFormsEmulated) {
  const Index n = 1024, d = 64;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2), v = gaussian(n, d, 3);
  AttentionOptions causal;
  causal.causal = true;
  for (const char* spec : {"linear", "linear:causal_form=recurrent", "taylor", "performer:features=64",
                           "performer:features=64,kernel=hyperbolic"}) {
    SCOPED_TRACE(spec);
    auto native = make_method<float>(spec, 3);
    native->compute(q, k, causal);
    const MatrixR<float> on = native->output(v);
    for (const Storage st : {Storage::bf16, Storage::fp16}) {
      AttentionOptions o = causal;
      o.storage = st;
      o.policy = Policy::careful;
      auto m = make_method<float>(spec, 3);
      m->compute(q, k, o);
      const MatrixR<float> oc = m->output(v);
      const double u = unit_roundoff(storage_format(st));
      EXPECT_EQ(m->output_check().nonfinite + m->output_check().zero_rows, 0u);
      EXPECT_LT((oc - on).norm() / on.norm(), 8 * u) << storage_name(st);
    }
  }
  // More keys than queries: the keys before the first query's position join the state first.
  const MatrixR<float> k2 = gaussian(n + 100, d, 4), v2 = gaussian(n + 100, d, 5);
  auto nat = make_method<float>("linear");
  nat->compute(q, k2, causal);
  AttentionOptions o = causal;
  o.storage = Storage::fp16;
  o.policy = Policy::careful;
  auto m = make_method<float>("linear");
  m->compute(q, k2, o);
  EXPECT_LT((m->output(v2) - nat->output(v2)).norm() / nat->output(v2).norm(), 8 * std::ldexp(1.0, -11));

  o.policy = Policy::eager;
  m->compute(q, k, o);
  const MatrixR<float> oe = m->output(v);
  Index first_zero = -1, zeros = 0;
  for (Index i = 0; i < n; ++i)
    if ((oe.row(i).array() == 0.0f).all()) {
      ++zeros;
      if (first_zero < 0) first_zero = i;
    }
  ASSERT_GT(first_zero, n / 2) << "eager fp16 causal linear: no failure in the first half";
  Index late = 0;
  for (Index i = 3 * n / 4; i < n; ++i) late += (oe.row(i).array() == 0.0f).all();
  EXPECT_GT(late, n / 8) << "most rows of the last quarter fail";
  auto lin = make_method<float>("linear");
  lin->compute(q, k, causal);
  const MatrixR<float> ol = lin->output(v);
  EXPECT_LT((oe.topRows(first_zero) - ol.topRows(first_zero)).norm() / ol.topRows(first_zero).norm(),
            8 * std::ldexp(1.0, -11))
      << "the rows before the overflow are within a few fp16 units";
  EXPECT_EQ(m->output_check().zero_rows, std::uint64_t(zeros));
  std::printf("  causal linear, fp16 eager, n = %ld, d = %ld: the first row fails at position %ld, %ld rows in all, "
              "%ld of the last %ld\n", long(n), long(d), long(first_zero), long(zeros), long(late), long(n / 4));
}

// Performer's backward under the eager policy in float16 (issue 39: the backward of every method in the format): the
// forward is finite on Gaussian heads at temperature 1 — the ratio of numerator and normaliser cancels the
// reference features' tiny scale, e^{−‖q‖²/2} times the keys' e^{−max} — but autograd's gradient of the division,
// ∂L/∂D_i = −dO_iᵀO_i / D_i, passes float16's 65504 where D_i is small: non-finite dQ and dK, the overflow tallied
// at the division's gradients. A torch autograd transcription with every tensor and gradient rounded to float16 fails
// the same way (tests/python/test_precision.py). Careful (float32 normalisers and division, attnlab's stabilised
// features) and bfloat16 (its 8-bit exponent) stay finite and within a few units of their format of float64's
// gradients.
TEST(Precision, PerformerFloat16EagerBackwardOverflows) {
  const Index n = 512, d = 64;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2), v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  auto m64 = make_method<double>("performer:features=64", 5);
  m64->compute(q.cast<double>(), k.cast<double>());
  const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
  for (const Storage st : {Storage::bf16, Storage::fp16})
    for (const Policy pol : {Policy::eager, Policy::careful}) {
      SCOPED_TRACE(storage_name(st) + " " + policy_name(pol));
      AttentionOptions o;
      o.storage = st;
      o.policy = pol;
      auto m = make_method<float>("performer:features=64", 5);
      m->compute(q, k, o);
      m->output(v);
      EXPECT_EQ(m->output_check().nonfinite + m->output_check().zero_rows, 0u) << "the forward is finite";
      const Gradients<float> g = m->backward(v, dout);
      std::uint64_t at_division = 0;
      for (const auto& e : m->rounding())
        if (e.what == "∂L/∂numerators, ∂L/∂normalisers") at_division += e.tally.overflow;
      if (st == Storage::fp16 && pol == Policy::eager) {
        EXPECT_GT(m->gradient_check().nonfinite, std::uint64_t(n * d)) << "most gradients fail";
        EXPECT_GT(at_division, 0u) << "the division's gradient overflowed";
        std::printf("  performer fp16 eager, n = %ld: %llu non-finite gradient entries, %llu overflows at the "
                    "division's gradients\n", long(n), static_cast<unsigned long long>(m->gradient_check().nonfinite),
                    static_cast<unsigned long long>(at_division));
        continue;
      }
      EXPECT_EQ(m->gradient_check().nonfinite, 0u);
      EXPECT_EQ(at_division, 0u);
      const double u = unit_roundoff(storage_format(st));
      // eager rounds every step of the features' backward (∂L/∂exponent = ∂L/∂φ∘φ onwards): looser than careful.
      const double tol = (pol == Policy::eager ? 32 : 8) * u;
      EXPECT_LT(rel(g.dq, g64.dq), tol);
      EXPECT_LT(rel(g.dk, g64.dk), tol);
      EXPECT_LT(rel(g.dv, g64.dv), tol);
      std::printf("  performer %s %s, n = %ld: dQ %.2e dK %.2e dV %.2e (u = %.1e)\n", storage_name(st).c_str(),
                  policy_name(pol).c_str(), long(n), rel(g.dq, g64.dq), rel(g.dk, g64.dk), rel(g.dv, g64.dv), u);
    }
}

// The causal kernel forms' backward under emulated storage (operators/kernel.hpp, emulated_causal_kernel_backward:
// reverse mode through the chunked transcription): careful within a few units of the format of the float64 causal
// backward (itself checked against finite differences), eager bfloat16 within a few more (it also stores the
// division's gradients and the backward state after every chunk), for every kernel method and causal form, with more
// keys than queries too (the keys before the first query's position), and a chunk that does not divide n.
TEST(Precision, CausalKernelBackwardEmulated) {
  const Index n = 300, d = 32;
  for (const Index nk : {n, n + 37}) {
    const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(nk, d, 2), v = gaussian(nk, d, 3),
                         dout = gaussian(n, d, 4);
    AttentionOptions causal;
    causal.causal = true;
    for (const char* spec : {"linear", "linear:causal_form=recurrent,chunk=48", "taylor", "performer:features=64",
                             "performer:features=32,kernel=hyperbolic,chunk=40"}) {
      auto m64 = make_method<double>(spec, 3);
      m64->compute(q.cast<double>(), k.cast<double>(), causal);
      const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
      for (const Storage st : {Storage::bf16, Storage::fp16})
        for (const Policy pol : {Policy::eager, Policy::careful}) {
          if (pol == Policy::eager && std::string(spec).find("hyperbolic") != std::string::npos) continue;
          SCOPED_TRACE(::testing::Message() << spec << " " << storage_name(st) << " " << policy_name(pol)
                                            << " n_k = " << nk);
          AttentionOptions o = causal;
          o.storage = st;
          o.policy = pol;
          auto m = make_method<float>(spec, 3);
          m->compute(q, k, o);
          const Gradients<float> g = m->backward(v, dout);
          const double u = unit_roundoff(storage_format(st));
          if (st == Storage::fp16 && pol == Policy::eager && std::string(spec).rfind("performer", 0) == 0) {
            // Its normaliser's gradient overflows as the non-causal one does (PerformerFloat16EagerBackwardOverflows).
            EXPECT_GT(m->gradient_check().nonfinite, 0u);
            continue;
          }
          ASSERT_EQ(m->gradient_check().nonfinite, 0u);
          const double tol = (pol == Policy::eager ? 32 : 8) * u;
          EXPECT_LT(rel(g.dq, g64.dq), tol);
          EXPECT_LT(rel(g.dk, g64.dk), tol);
          EXPECT_LT(rel(g.dv, g64.dv), tol);
          if (nk == n)
            std::printf("  %-44s %s %-7s dQ %.2e dK %.2e dV %.2e (u = %.1e)\n", spec, storage_name(st).c_str(),
                        policy_name(pol).c_str(), rel(g.dq, g64.dq), rel(g.dk, g64.dk), rel(g.dv, g64.dv), u);
        }
    }
  }
}

// Nyström's backward under emulated storage (nystrom.cpp, emulated_backward: autograd's backward of (F·Z)·(B·V),
// the pseudo-inverse's reverse steps through pinv_backward_emulated): at the paper's 6 iterations the gradients within
// a few units of the format of float64's (careful 8u, eager 16u); for every pseudo-inverse (pinv=svd and 30
// Newton–Schulz steps amplify the rounding as their forward does) within 4× the forward's own rounding error — a
// wrong reverse step would be off by O(1), not by a few rounding errors.
TEST(Precision, NystromBackwardEmulated) {
  const Index n = 256, d = 32;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2), v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  for (const char* spec : {"nystrom:landmarks=32", "nystrom:landmarks=16,pinv=svd,select=random",
                           "nystrom:landmarks=32,pinv=newton,iters=30"}) {
    auto m64 = make_method<double>(spec, 3);
    m64->compute(q.cast<double>(), k.cast<double>());
    const MatrixR<double> o64 = m64->output(v.cast<double>());
    const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
    for (const Storage st : {Storage::bf16, Storage::fp16})
      for (const Policy pol : {Policy::eager, Policy::careful}) {
        SCOPED_TRACE(::testing::Message() << spec << " " << storage_name(st) << " " << policy_name(pol));
        AttentionOptions o;
        o.storage = st;
        o.policy = pol;
        auto m = make_method<float>(spec, 3);
        m->compute(q, k, o);
        const double fwd = (m->output(v).cast<double>() - o64).norm() / o64.norm();
        const Gradients<float> g = m->backward(v, dout);
        ASSERT_EQ(m->gradient_check().nonfinite, 0u);
        const double u = unit_roundoff(storage_format(st));
        const double worst = std::max({rel(g.dq, g64.dq), rel(g.dk, g64.dk), rel(g.dv, g64.dv)});
        EXPECT_LT(worst, 4 * std::max(fwd, u));
        if (std::string(spec) == "nystrom:landmarks=32") {
          EXPECT_LT(worst, (pol == Policy::eager ? 16 : 8) * u);
        }
        std::printf("  %-44s %s %-7s forward %.2e, worst gradient %.2e (u = %.1e)\n", spec, storage_name(st).c_str(),
                    policy_name(pol).c_str(), fwd, worst, u);
      }
  }
}

// Efficient attention's backward under emulated storage: within a few units of the format of float64's gradients
// (its softmaxes' backward from the stored factors; careful 8u, eager 16u).
TEST(Precision, EfficientBackwardEmulated) {
  const Index n = 256, d = 32;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2), v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  auto m64 = make_method<double>("efficient");
  m64->compute(q.cast<double>(), k.cast<double>());
  const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
  for (const Storage st : {Storage::bf16, Storage::fp16})
    for (const Policy pol : {Policy::eager, Policy::careful}) {
      SCOPED_TRACE(storage_name(st) + " " + policy_name(pol));
      AttentionOptions o;
      o.storage = st;
      o.policy = pol;
      auto m = make_method<float>("efficient");
      m->compute(q, k, o);
      const Gradients<float> g = m->backward(v, dout);
      ASSERT_EQ(m->gradient_check().nonfinite, 0u);
      const double u = unit_roundoff(storage_format(st)), tol = (pol == Policy::eager ? 16 : 8) * u;
      EXPECT_LT(rel(g.dq, g64.dq), tol);
      EXPECT_LT(rel(g.dk, g64.dk), tol);
      EXPECT_LT(rel(g.dv, g64.dv), tol);
    }
}

// Scatterbrain's backward under emulated storage (its derived backward on the forward's stored tensors, every tensor
// it materialises stored): within a few units of the format of float64's gradients (careful 8u, eager 16u), as the
// other kernel methods' — no amplification: its band's corrections are differences of positive terms formed in
// float32 before they are stored.
TEST(Precision, ScatterbrainBackwardEmulated) {
  const Index n = 256, d = 32;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2), v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  for (const char* spec : {"scatterbrain:features=64,window=8", "scatterbrain:features=16,window=0"}) {
    auto m64 = make_method<double>(spec, 5);
    m64->compute(q.cast<double>(), k.cast<double>());
    const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
    for (const Storage st : {Storage::bf16, Storage::fp16})
      for (const Policy pol : {Policy::eager, Policy::careful}) {
        SCOPED_TRACE(::testing::Message() << spec << " " << storage_name(st) << " " << policy_name(pol));
        AttentionOptions o;
        o.storage = st;
        o.policy = pol;
        auto m = make_method<float>(spec, 5);
        m->compute(q, k, o);
        const Gradients<float> g = m->backward(v, dout);
        ASSERT_EQ(m->gradient_check().nonfinite, 0u);
        bool tallied = false;  // the backward's own tensors reach the log
        for (const auto& e : m->rounding()) tallied = tallied || e.what == "backward: ∂L/∂φ(q), ∂L/∂φ(k)";
        EXPECT_TRUE(tallied);
        const double u = unit_roundoff(storage_format(st)), tol = (pol == Policy::eager ? 16 : 8) * u;
        EXPECT_LT(rel(g.dq, g64.dq), tol);
        EXPECT_LT(rel(g.dk, g64.dk), tol);
        EXPECT_LT(rel(g.dv, g64.dv), tol);
        std::printf("  %-36s %s %-7s dQ %.2e dK %.2e dV %.2e (u = %.1e)\n", spec, storage_name(st).c_str(),
                    policy_name(pol).c_str(), rel(g.dq, g64.dq), rel(g.dk, g64.dk), rel(g.dv, g64.dv), u);
      }
  }
}

// CUR's backward under emulated storage (reverse mode through its transcription: A = C·Z and R stored, A's float32
// formation differentiated in float32, R·V's backward as exact attention's emulated one). Its gradients pass through
// pinv(P[I,J]), whose derivative amplifies the stored factors' rounding as Nyström's does: held within 4× the forward's
// own rounding error (or of u), and within 8u / 16u where P[I,J] is well conditioned (8 columns of a spread P). With
// 32 leverage columns P[I,J] is so ill-conditioned that the forward is 0.29 off in bf16 and float64's gradients reach
// 5.8e4: fp16 then cannot hold them. That failure must be the stored gradients' overflow, tallied, and only where the
// float64 gradient is within the measured error of fp16's largest finite value (65504).
TEST(Precision, CurBackwardEmulated) {
  const Index n = 256, d = 32;
  const MatrixR<float> q = gaussian(n, d, 1), k = gaussian(n, d, 2), v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  int failures = 0;
  for (const char* spec : {"cur:columns=8", "cur:columns=32,select=leverage"}) {
    auto m64 = make_method<double>(spec, 3);
    m64->compute(q.cast<double>(), k.cast<double>());
    const MatrixR<double> o64 = m64->output(v.cast<double>());
    const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
    const double gmax = std::max({g64.dq.cwiseAbs().maxCoeff(), g64.dk.cwiseAbs().maxCoeff(),
                                  g64.dv.cwiseAbs().maxCoeff()});
    for (const Storage st : {Storage::bf16, Storage::fp16})
      for (const Policy pol : {Policy::eager, Policy::careful}) {
        SCOPED_TRACE(::testing::Message() << spec << " " << storage_name(st) << " " << policy_name(pol));
        AttentionOptions o;
        o.storage = st;
        o.policy = pol;
        auto m = make_method<float>(spec, 3);
        m->compute(q, k, o);
        const double fwd = (m->output(v).cast<double>() - o64).norm() / o64.norm();
        const Gradients<float> g = m->backward(v, dout);
        const double u = unit_roundoff(storage_format(st));
        if (m->gradient_check().nonfinite > 0) {
          ++failures;
          std::uint64_t overflow = 0;
          for (const auto& e : m->rounding())
            if (e.what == "gradients dQ, dK, dV") overflow += e.tally.overflow;
          EXPECT_EQ(overflow, m->gradient_check().nonfinite);
          EXPECT_EQ(st, Storage::fp16);
          EXPECT_GT(gmax * (1 + 4 * std::max(fwd, u)), 65504.0);
          std::printf("  %-36s %s %-7s forward %.2e, %llu gradients overflowed (float64's reach %.3g)\n", spec,
                      storage_name(st).c_str(), policy_name(pol).c_str(), fwd,
                      static_cast<unsigned long long>(overflow), gmax);
          continue;
        }
        const double worst = std::max({rel(g.dq, g64.dq), rel(g.dk, g64.dk), rel(g.dv, g64.dv)});
        EXPECT_LT(worst, 4 * std::max(fwd, u));
        if (std::string(spec) == "cur:columns=8") {
          EXPECT_LT(worst, (pol == Policy::eager ? 16 : 8) * u);
        }
        std::printf("  %-36s %s %-7s forward %.2e, dQ %.2e dK %.2e dV %.2e (u = %.1e)\n", spec,
                    storage_name(st).c_str(), policy_name(pol).c_str(), fwd, rel(g.dq, g64.dq), rel(g.dk, g64.dk),
                    rel(g.dv, g64.dv), u);
      }
  }
  EXPECT_LE(failures, 2);  // the ill-conditioned case's fp16 only
}

// VQ's causal form under emulated storage (Transformer-VQ's blockwise transcription, blocks of 64 queries and the
// cache): with a fixed codebook and keys near its codes (no assignment flips), the output and the gradients within a
// few units of the format of float64's (careful 8u, eager 16u), over lengths that leave a partial block and with more
// keys than queries (keys every query sees start the cache). Its fp32 path is the native float32 one.
TEST(Precision, VqCausalEmulated) {
  const Index d = 32;
  const MatrixR<float> codebook = gaussian(16, d, 5);
  const std::string path = ::testing::TempDir() + "attnlab_precision_vq_causal_codebook.npy";
  write_npy<double>(path, codebook.cast<double>());
  const std::string spec = "vq:codes=16,codebook=" + path;
  for (const auto& [nq, nk] : {std::pair<Index, Index>{200, 200}, {150, 230}}) {
    const MatrixR<float> q = gaussian(nq, d, 1), v = gaussian(nk, d, 3), dout = gaussian(nq, d, 4);
    MatrixR<float> k = gaussian(nk, d, 2, 0.1f);
    for (Index j = 0; j < nk; ++j) k.row(j) += codebook.row((7 * j) % 16);
    AttentionOptions causal;
    causal.causal = true;
    auto m64 = make_method<double>(spec);
    m64->compute(q.cast<double>(), k.cast<double>(), causal);
    const MatrixR<double> o64 = m64->output(v.cast<double>());
    const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
    for (const Storage st : {Storage::bf16, Storage::fp16})
      for (const Policy pol : {Policy::eager, Policy::careful}) {
        SCOPED_TRACE(::testing::Message() << "n_q " << nq << " n_k " << nk << " " << storage_name(st) << " "
                                          << policy_name(pol));
        AttentionOptions o = causal;
        o.storage = st;
        o.policy = pol;
        auto m = make_method<float>(spec);
        m->compute(q, k, o);
        const MatrixR<float> out = m->output(v);
        const Gradients<float> g = m->backward(v, dout);
        ASSERT_EQ(m->output_check().nonfinite, 0u);
        ASSERT_EQ(m->gradient_check().nonfinite, 0u);
        bool cache = false;
        for (const auto& e : m->rounding()) cache = cache || e.what == "cache: per-code value sums, counts";
        EXPECT_EQ(cache, pol == Policy::eager);  // the cache is stored under eager only
        const double u = unit_roundoff(storage_format(st)), tol = (pol == Policy::eager ? 16 : 8) * u;
        EXPECT_LT(rel(out, o64), tol);
        EXPECT_LT(rel(g.dq, g64.dq), tol);
        EXPECT_LT(rel(g.dk, g64.dk), tol);
        EXPECT_LT(rel(g.dv, g64.dv), tol);
        std::printf("  vq causal n_q %lld n_k %lld %s %-7s O %.2e dQ %.2e dK %.2e dV %.2e (u = %.1e)\n",
                    static_cast<long long>(nq), static_cast<long long>(nk), storage_name(st).c_str(),
                    policy_name(pol).c_str(), rel(out, o64), rel(g.dq, g64.dq), rel(g.dk, g64.dk),
                    rel(g.dv, g64.dv), u);
      }
  }
  std::remove(path.c_str());
}

// VQ's backward under emulated storage (hard, keys, non-causal: the transcription's reverse mode, dK straight-through)
// with a fixed codebook and keys near its codes — so that no assignment flips between the formats (a key halfway
// between two codes would take the other in bf16: a discrete change, not rounding) and the difference is the
// rounding's: the gradients within a few units of the format of float64's (careful 8u, eager 16u).
TEST(Precision, VqBackwardEmulated) {
  const Index n = 256, d = 32;
  const MatrixR<float> q = gaussian(n, d, 1), v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  const MatrixR<float> codebook = gaussian(16, d, 5);
  MatrixR<float> k = gaussian(n, d, 2, 0.1f);
  for (Index j = 0; j < n; ++j) k.row(j) += codebook.row(j % 16);
  const std::string path = ::testing::TempDir() + "attnlab_precision_vq_codebook.npy";
  write_npy<double>(path, codebook.cast<double>());
  const std::string spec = "vq:codes=16,codebook=" + path;
  auto m64 = make_method<double>(spec);
  m64->compute(q.cast<double>(), k.cast<double>());
  const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
  for (const Storage st : {Storage::bf16, Storage::fp16})
    for (const Policy pol : {Policy::eager, Policy::careful}) {
      SCOPED_TRACE(storage_name(st) + " " + policy_name(pol));
      AttentionOptions o;
      o.storage = st;
      o.policy = pol;
      auto m = make_method<float>(spec);
      m->compute(q, k, o);
      m->output(v);
      const Gradients<float> g = m->backward(v, dout);
      ASSERT_EQ(m->gradient_check().nonfinite, 0u);
      const double u = unit_roundoff(storage_format(st)), tol = (pol == Policy::eager ? 16 : 8) * u;
      EXPECT_LT(rel(g.dq, g64.dq), tol);
      EXPECT_LT(rel(g.dk, g64.dk), tol);
      EXPECT_LT(rel(g.dv, g64.dv), tol);
      std::printf("  vq (fixed codebook) %s %-7s dQ %.2e dK %.2e dV %.2e (u = %.1e)\n", storage_name(st).c_str(),
                  policy_name(pol).c_str(), rel(g.dq, g64.dq), rel(g.dk, g64.dk), rel(g.dv, g64.dv), u);
    }
  std::remove(path.c_str());
}

namespace {

/// A VQ variant under every reduced storage and policy against hard VQ (the same k-means on the same stored keys) at
/// the variant's limit where it is hard VQ: the output, dQ, dV and (`dk_same`) dK within u·‖·‖ of the format under
/// eager and `careful_tol` under careful; without `dk_same`, dK below 1e-20 of hard's (the variant passes none).
/// `stored` names an intermediate only the variant stores: it must be tallied.
void check_vq_variant_at_limit(const std::string& variant, const MatrixR<float>& q, const MatrixR<float>& k,
                               const char* stored, bool dk_same, double careful_tol) {
  const Index n = q.rows(), d = q.cols();
  const MatrixR<float> v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  for (const Storage st : {Storage::bf16, Storage::fp16})
    for (const Policy pol : {Policy::eager, Policy::careful}) {
      SCOPED_TRACE(variant + " " + storage_name(st) + " " + policy_name(pol));
      AttentionOptions o;
      o.storage = st;
      o.policy = pol;
      auto hard = make_method<float>("vq:codes=12");
      auto other = make_method<float>(variant);
      hard->compute(q, k, o);
      other->compute(q, k, o);
      const MatrixR<float> oh = hard->output(v), ov = other->output(v);
      const Gradients<float> gh = hard->backward(v, dout), gv = other->backward(v, dout);
      ASSERT_EQ(other->output_check().nonfinite, 0u);
      ASSERT_EQ(other->gradient_check().nonfinite, 0u);
      bool tallied = false;
      for (const auto& e : other->rounding()) tallied = tallied || e.what == stored;
      EXPECT_TRUE(tallied) << stored << " was not stored";
      const double tol = pol == Policy::eager ? unit_roundoff(storage_format(st)) : careful_tol;
      const double eo = rel(ov, oh.cast<double>()), eq = rel(gv.dq, gh.dq.cast<double>()),
                   ek = rel(gv.dk, gh.dk.cast<double>()), ev = rel(gv.dv, gh.dv.cast<double>());
      EXPECT_LT(eo, tol);
      EXPECT_LT(eq, tol);
      EXPECT_LT(ev, tol);
      if (dk_same) {
        EXPECT_LT(ek, tol);
      } else {
        EXPECT_LT(gv.dk.norm(), 1e-20 * gh.dk.norm());
      }
      std::printf("  %s against hard, %s %-7s O %.2e dQ %.2e dK %.2e dV %.2e\n", variant.c_str(),
                  storage_name(st).c_str(), policy_name(pol).c_str(), eo, eq, ek, ev);
    }
}

/// A VQ variant under every reduced storage and policy against its own float64 run: the output and the gradients
/// within a few units of the format (careful 8u, eager 16u, as VQ's hard form is held).
void check_vq_variant_emulated(const std::string& spec, const MatrixR<float>& q, const MatrixR<float>& k) {
  const Index n = q.rows(), d = q.cols();
  const MatrixR<float> v = gaussian(n, d, 3), dout = gaussian(n, d, 4);
  auto m64 = make_method<double>(spec);
  m64->compute(q.cast<double>(), k.cast<double>());
  const MatrixR<double> o64 = m64->output(v.cast<double>());
  const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
  for (const Storage st : {Storage::bf16, Storage::fp16})
    for (const Policy pol : {Policy::eager, Policy::careful}) {
      SCOPED_TRACE(spec + " " + storage_name(st) + " " + policy_name(pol));
      AttentionOptions o;
      o.storage = st;
      o.policy = pol;
      auto m = make_method<float>(spec);
      m->compute(q, k, o);
      const MatrixR<float> out = m->output(v);
      const Gradients<float> g = m->backward(v, dout);
      ASSERT_EQ(m->output_check().nonfinite, 0u);
      ASSERT_EQ(m->gradient_check().nonfinite, 0u);
      const double u = unit_roundoff(storage_format(st)), tol = (pol == Policy::eager ? 16 : 8) * u;
      EXPECT_LT(rel(out, o64), tol);
      EXPECT_LT(rel(g.dq, g64.dq), tol);
      EXPECT_LT(rel(g.dk, g64.dk), tol);
      EXPECT_LT(rel(g.dv, g64.dv), tol);
      std::printf("  %s %s %-7s O %.2e dQ %.2e dK %.2e dV %.2e (u = %.1e)\n", spec.c_str(), storage_name(st).c_str(),
                  policy_name(pol).c_str(), rel(out, o64), rel(g.dq, g64.dq), rel(g.dk, g64.dk), rel(g.dv, g64.dv),
                  u);
    }
}

/// n keys in `codes` clusters of spread `spread` about centres of scale `scale` (key j in cluster j mod codes).
MatrixR<float> clustered_rows(Index n, Index d, Index codes, float scale, float spread, std::uint64_t seed) {
  const MatrixR<float> centres = gaussian(codes, d, seed, scale);
  MatrixR<float> x = spread > 0 ? gaussian(n, d, seed + 100, spread) : MatrixR<float>::Zero(n, d);
  for (Index j = 0; j < n; ++j) x.row(j) += centres.row(j % codes);
  return x;
}

}  // namespace

// VQ's mean-field form (quantize=both) under emulated storage, at its exact limit: keys that sit on their codes (each
// key repeated, so k-means' centroids are the keys to within the rounding of a mean) leave residuals R = K − ΔC ≈ 0,
// the key logits g = s·C'Rᵀ ≈ 0 and the key weights ≈ 1: the form is hard Transformer-VQ with the same key codebook
// (the same k-means on the same stored keys). The output and dQ, dK (both straight-through), dV agree within u·‖·‖
// of the format under eager (their sums are stored at other points: per query code here, over all queries there, so
// a stored sum may differ by a unit) and, under careful, within what float32 sums of the n = 192 queries in another
// order allow where dK's terms cancel tenfold: 10·n·2⁻²⁴ ≈ 1.1e-4 (measured up to 1.2e-5).
TEST(Precision, VqBothEmulatedIsHardAtItsLimit) {
  const Index n = 192;
  check_vq_variant_at_limit("vq:codes=12,quantize=both", gaussian(n, 16, 1), clustered_rows(n, 16, 12, 3.0f, 0, 5),
                            "key weights exp(g − max)", true, 10.0 * double(n) * 0x1p-24);
}

// VQ's mean-field form under emulated storage against its float64 self, on queries and keys in well-separated
// clusters (so that the float32 k-means on the stored rows finds the float64 one's clusters, for both codebooks, and
// their centroids differ by the rounding of the means only) with residuals that matter (spread 0.3 about the key
// codes): the output and the gradients, dQ through the query codebook included, within 16u (eager) and 8u (careful).
TEST(Precision, VqBothEmulated) {
  check_vq_variant_emulated("vq:codes=8,quantize=both", clustered_rows(256, 16, 8, 0.7f, 0.1f, 6),
                            clustered_rows(256, 16, 8, 0.7f, 0.3f, 5));
}

// VQ's soft assignment under emulated storage, at its exact limit: as T → 0 the stored responsibilities are exactly
// one-hot (every other code's exp underflows to 0 in float32), so the soft transcription is the hard one with RᵀV and
// Rᵀ1 for ΔᵀV and the counts — the same codebook (the same k-means on the same stored keys), the same assignments.
// The keys lie in clusters far apart (‖k − c‖² ≈ 0.04 to their own code, ≈ 300 to the others, one code each) and
// T = 1e-3: the own code's logit z ≈ −20 fits float16 (in fp16 eager the rounding of the stored K·Cᵀ and norms, ≈ 144
// each, moves it by up to ~100: still the row's largest) and the others' e^{Δz} are exactly 0 (in fp16 eager their
// z ≈ −1.5e5 overflows to −inf, and exp(−inf) is 0 too; at T = 1e-9 every z of a row overflows and eager's softmax
// gives NaN: the format's limit, not the method's). Only the order of the float32 sums differs (a product against a
// scan), which may move a stored per-code sum by one unit of the format under eager: the outputs, dQ and dV agree
// within u·‖·‖ (eager) and 1e-5 (careful, the sums kept in float32); dK vanishes (a one-hot R passes no gradient to
// z, where hard's is straight-through): below 1e-20 of hard's, what a responsibility e^{Δz} that bfloat16's range
// keeps (≈ e^{-77} here) passes on.
TEST(Precision, VqSoftEmulatedIsHardAtItsLimit) {
  check_vq_variant_at_limit("vq:codes=12,assign=soft,temperature=1e-3", gaussian(192, 16, 1),
                            clustered_rows(192, 16, 12, 3.0f, 0.05f, 5), "responsibilities R", false, 1e-5);
}

// VQ's soft assignment under emulated storage, at a temperature where every code's responsibility counts (T = 4: the
// other codes' e^{-‖k − c‖²/(2T)} ≈ e^{-2} beside their own's, ‖c − c'‖² ≈ 2·0.49·16), on keys in well-separated
// clusters so that the float32 k-means on the stored keys finds the float64 one's clusters (its centroids then differ
// by the rounding of the keys' means only): the output and the gradients, dK through R included, within 16u (eager) and
// 8u (careful).
TEST(Precision, VqSoftEmulated) {
  check_vq_variant_emulated("vq:codes=8,assign=soft,temperature=4", gaussian(256, 16, 1, 0.5f),
                            clustered_rows(256, 16, 8, 0.7f, 0.1f, 5));
}
