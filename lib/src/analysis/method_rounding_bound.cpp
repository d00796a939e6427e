// Which derived rounding bound holds which method (analysis/method_rounding_bound.hpp): the dispatch, declared once.
#include "attnlab/analysis/method_rounding_bound.hpp"

#include "attnlab/analysis/rounding_bound.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/methods/cur.hpp"
#include "attnlab/methods/exact.hpp"
#include "attnlab/methods/linear.hpp"
#include "attnlab/methods/linformer.hpp"
#include "attnlab/methods/nystrom.hpp"
#include "attnlab/methods/performer.hpp"
#include "attnlab/methods/probsparse.hpp"
#include "attnlab/methods/reformer.hpp"
#include "attnlab/methods/scatterbrain.hpp"
#include "attnlab/methods/taylor.hpp"
#include "attnlab/methods/vq.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/operators/codebook.hpp"
#include "attnlab/operators/sparse.hpp"

#include <fmt/format.h>

#include <cmath>

namespace attnlab {
namespace {

/// The mask and scale of a method's call, without its storage: what the float64 analyses are formed under.
AttentionOptions mask_of(const AttentionOptions& o) {
  AttentionOptions m;
  m.causal = o.causal;
  m.scale = o.scale;
  return m;
}

std::string mask_key(const AttentionOptions& o, Index d) {
  return fmt::format("{} scale {}", o.causal ? "causal" : "full", o.resolved_scale(d));
}

MethodRoundingBound from_softmax(const SoftmaxRoundingBound& b, const MatrixR<double>& reference) {
  MethodRoundingBound r;
  r.output = b.output;
  r.reference = reference;
  r.rowwise = false;
  return r;
}

MethodRoundingBound from_kernel(KernelRoundingBound b, const MatrixR<double>& own) {
  MethodRoundingBound r;
  r.output = std::move(b.output);
  r.reference = own;
  r.rowwise = true;
  r.rows_without_guarantee = b.rows_without_guarantee;
  return r;
}

template <class M, typename T>
const M& as(const Method<T>& m) {
  const auto* p = dynamic_cast<const M*>(&m);
  require(p != nullptr, "rounding bound: {} is not the method its name says", m.spec());
  return *p;
}

}  // namespace

Index MethodRoundingBound::outside(const MatrixR<double>& emulated) const {
  require(emulated.rows() == output.rows() && emulated.cols() == output.cols(),
          "rounding bound: an output of {}×{} against a bound of {}×{}", emulated.rows(), emulated.cols(),
          output.rows(), output.cols());
  Index n = 0;
  for (Index i = 0; i < output.size(); ++i) {
    const double bi = output.data()[i], err = std::abs(emulated.data()[i] - reference.data()[i]);
    n += !(std::isinf(bi) || err <= bi);  // no guarantee: nothing there is a violation; NaN against a bound is
  }
  return n;
}

MethodRoundingBounds::MethodRoundingBounds(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v)
    : q_(q), k_(k), v_(v) {
  require(q.cols() == k.cols() && v.rows() == k.rows() && q.rows() >= 1 && k.rows() >= 1 && v.cols() >= 1,
          "rounding bound: Q {}×{}, K {}×{}, V {}×{}", q.rows(), q.cols(), k.rows(), k.cols(), v.rows(), v.cols());
}

MethodRoundingBounds::~MethodRoundingBounds() = default;

const SoftmaxRoundingAnalysis& MethodRoundingBounds::exact_analysis(const AttentionOptions& mask) {
  auto& a = analyses_["exact " + mask_key(mask, q_.cols())];
  if (!a) a = std::make_unique<SoftmaxRoundingAnalysis>(q_, k_, v_, mask);
  return *a;
}

const SoftmaxRoundingAnalysis& MethodRoundingBounds::pattern_analysis(const Method<double>& reference) {
  // The pattern as the float64 method formed it (its sparse P̃'s rows); formed again whenever it differs from the
  // cached one's (another seed's random keys, another spec's hashing).
  const auto* sp = dynamic_cast<const SparseOperator<double>*>(&reference.op());
  require(sp != nullptr, "rounding bound: {} has no sparse operator", reference.spec());
  std::vector<std::vector<Index>> pattern = sp->row_keys();
  const std::string key = reference.spec() + " " + mask_key(reference.options(), q_.cols());
  auto& a = analyses_[key];
  auto& cached = patterns_[key];
  if (!a || cached != pattern) {
    a = std::make_unique<SoftmaxRoundingAnalysis>(q_, k_, v_, pattern, reference.options().resolved_scale(q_.cols()));
    cached = std::move(pattern);
  }
  return *a;
}

std::optional<MethodRoundingBound> MethodRoundingBounds::bound(const Method<double>& reference,
                                                               const MatrixR<double>& own,
                                                               const Method<float>& emulated, std::string* why) {
  const AttentionOptions& opts = emulated.options();
  require(reference.name() == emulated.name(), "rounding bound: a {} against a {}", emulated.name(),
          reference.name());
  require(opts.storage != Storage::native, "rounding bound: {} ran without a reduced storage", emulated.spec());
  require(reference.options().causal == opts.causal, "rounding bound: the float64 {} ran with another mask",
          reference.name());
  require(own.rows() == q_.rows() && own.cols() == v_.cols(), "rounding bound: the float64 output is {}×{}",
          own.rows(), own.cols());
  const auto none = [&](const std::string& reason) -> std::optional<MethodRoundingBound> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const std::string& name = reference.name();
  const bool causal = opts.causal;
  if (name == "exact") {
    const auto& s = as<ExactMethod<double>>(reference).settings();
    const SoftmaxRoundingAnalysis& a = exact_analysis(mask_of(reference.options()));
    return from_softmax(a.bound(opts, s.impl == ExactImpl::Streaming, s.tile), a.o);
  }
  if (name == "local" || name == "sparse") return from_softmax(pattern_analysis(reference).bound(opts, false), own);
  if (name == "linformer") {
    const auto& l64 = as<LinformerMethod<double>>(reference);
    const auto& l32 = as<LinformerMethod<float>>(emulated);
    if (causal) return none("Linformer is non-causal");
    return from_softmax(linformer_rounding_bound(q_, k_, v_, l64.projections().first, l64.projections().second,
                                                 l32.projections().first.cast<double>(),
                                                 l32.projections().second.cast<double>(), opts),
                        own);
  }
  if (name == "linear") {
    const auto& s = as<LinearMethod<double>>(reference).settings();
    return from_kernel(linear_rounding_bound(q_, k_, v_, s.feature, opts, s.chunk), own);
  }
  if (name == "taylor") {
    const auto& s = as<TaylorMethod<double>>(reference).settings();
    return from_kernel(taylor_rounding_bound(q_, k_, v_, opts, s.chunk), own);
  }
  if (name == "efficient") {
    if (causal) return none("efficient attention is non-causal");
    return from_kernel(efficient_rounding_bound(q_, k_, v_, opts), own);
  }
  if (name == "performer") {
    const auto& p64 = as<PerformerMethod<double>>(reference);
    const auto& p32 = as<PerformerMethod<float>>(emulated);
    return from_kernel(performer_rounding_bound(q_, k_, v_, p64.omega(), p32.omega().cast<double>(),
                                                p64.settings().kernel, opts, p64.settings().chunk),
                       own);
  }
  if (name == "scatterbrain") {
    const auto& s64 = as<ScatterbrainMethod<double>>(reference);
    const auto& s32 = as<ScatterbrainMethod<float>>(emulated);
    return from_kernel(scatterbrain_rounding_bound(q_, k_, v_, s64.omega(), s32.omega().cast<double>(),
                                                   s64.settings().window, opts),
                       own);
  }
  if (name == "probsparse") {
    const auto& s64 = as<ProbSparseMethod<double>>(reference);
    const auto& s32 = as<ProbSparseMethod<float>>(emulated);
    return from_kernel(probsparse_rounding_bound(exact_analysis(mask_of(reference.options())), v_,
                                                 s64.selected_queries(), s32.selected_queries(), opts,
                                                 s64.settings().lazy == ProbSparseLazy::Cumsum),
                       own);
  }
  if (name == "reformer") {
    const auto& r64 = as<ReformerMethod<double>>(reference);
    const auto& r32 = as<ReformerMethod<float>>(emulated);
    return from_kernel(reformer_rounding_bound(pattern_analysis(reference), r64.key_sets(), r32.key_sets(),
                                               r64.settings().rounds, opts),
                       own);
  }
  if (name == "vq") {
    const auto& s = as<VqMethod<double>>(reference).settings();
    if (s.quantize == VqQuantize::Both) {  // non-causal only: the registry refuses it under a causal mask
      const auto run = [](const auto& m) {
        return VqBothRun{m.codebook().template cast<double>(), m.query_codebook().template cast<double>(),
                         m.key_codes(), m.query_codes()};
      };
      return from_kernel(vq_both_rounding_bound(q_, k_, v_, run(as<VqMethod<double>>(reference)),
                                                run(as<VqMethod<float>>(emulated)), opts),
                         own);
    }
    if (s.assign == VqAssign::Soft)  // non-causal only: the registry refuses soft VQ under a causal mask
      return from_kernel(vq_soft_rounding_bound(q_, k_, v_, as<VqMethod<double>>(reference).codebook(),
                                                as<VqMethod<float>>(emulated).codebook().cast<double>(),
                                                s.temperature, opts),
                         own);
    const auto* op64 = dynamic_cast<const CodebookOperator<double>*>(&reference.op());
    const auto* op32 = dynamic_cast<const CodebookOperator<float>*>(&emulated.op());
    require(op64 != nullptr && op32 != nullptr, "rounding bound: {} has no codebook operator", reference.spec());
    // Each run's codebook as it used it: the file's (in float32 for the emulated run), or k-means' on its own keys
    // (codebook=window: the emulated run's fitted on the stored keys; bounded given both fits, where they assign
    // every key alike).
    return from_kernel(vq_rounding_bound(q_, v_, as<VqMethod<double>>(reference).codebook(),
                                         as<VqMethod<float>>(emulated).codebook().cast<double>(),
                                         op64->assignment(), op32->assignment(), opts),
                       own);
  }
  if (name == "nystrom") {
    const auto& n64 = as<NystromMethod<double>>(reference);
    const auto& n32 = as<NystromMethod<float>>(emulated);
    // Given both runs' pseudo-inverses (the iteration's own rounding propagation is not bounded a priori); random
    // landmarks are the same rows in both runs (one seed).
    require(n64.query_landmark_rows() == n32.query_landmark_rows() &&
                n64.key_landmark_rows() == n32.key_landmark_rows(),
            "rounding bound: {}'s two runs sampled different landmark rows", reference.spec());
    return from_kernel(nystrom_rounding_bound(q_, k_, v_, n64.settings().landmarks, n64.pseudoinverse(),
                                              n32.pseudoinverse().cast<double>(), opts, n64.query_landmark_rows(),
                                              n64.key_landmark_rows()),
                       own);
  }
  if (name == "cur") {
    const auto& c64 = as<CurMethod<double>>(reference);
    const auto& c32 = as<CurMethod<float>>(emulated);
    // Given both runs' pseudo-inverses, as Nyström's; the sampled rows and columns must be the same (uniform: one
    // seed; leverage: sampled from each run's own singular vectors, which may pick others — a discrete change).
    if (c64.sampled_rows() != c32.sampled_rows() || c64.sampled_columns() != c32.sampled_columns())
      return none("cur: the two runs sampled different rows or columns of P (a discrete choice, not rounding)");
    return from_kernel(cur_rounding_bound(q_, k_, v_, c64.sampled_rows(), c64.sampled_columns(), c64.pseudoinverse(),
                                          c32.pseudoinverse().cast<double>(), opts),
                       own);
  }
  if (name == "svd") {
    // Given both runs' singular vectors, as Nyström's and CUR's pseudo-inverses: the solver's rounding propagation is
    // not bounded a priori.
    if (causal) return none("the SVD oracle is non-causal");
    const auto* f64 = dynamic_cast<const LowRankOperator<double>*>(&reference.op());
    const auto* f32 = dynamic_cast<const LowRankOperator<float>*>(&emulated.op());
    require(f64 != nullptr && f32 != nullptr, "rounding bound: {} has no factored operator", reference.spec());
    return from_kernel(svd_rounding_bound(q_, k_, v_, f64->right(), f32->right().cast<double>(), opts), own);
  }
  return none(name + ": not derived");
}

}  // namespace attnlab
