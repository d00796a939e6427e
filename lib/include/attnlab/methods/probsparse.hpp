// `probsparse` — Informer's ProbSparse self-attention (Zhou et al. 2021, eqs. (2)-(4), Lemma 1): the u = c·⌈ln n_q⌉
// queries with the largest sparsity measure M̄ (max − mean of the logits over U = c·⌈ln n_k⌉ sampled keys, eq. (4);
// or M = LSE − mean, eq. (2)) get exact softmax rows (eq. (3)); the other ("lazy") queries get mean(V). Causal: the
// selection is online (a query is exact when its measure is among the u largest so far), exact rows are masked, and
// lazy rows get the mean of the visible V (lazy=mean) or the reference code's unnormalized cumulative sum
// (lazy=cumsum).
// Backward: the gradient given the selection — the top-u set (and the keys sampled for M̄) held fixed, the measure
// not differentiated (it only selects). Selected rows: exact attention's backward (FlashAttention-2 Alg. 2) at their
// causal positions; lazy rows: w_i·Σ_{visible j} v_j, so dV only (dQ of a lazy row is 0, and it adds nothing to dK).
//   attnlab::ProbSparseOptions o;  o.factor = 3;  o.sample = attnlab::ProbSparseSample::Full;
//   attnlab::ProbSparseMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "probsparse:factor=3,sample=full" builds the same class (make_method reads the spec into
// ProbSparseOptions).
#pragma once

#include "attnlab/components/sparsity_measure.hpp"
#include "attnlab/core/method.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/operators/probsparse.hpp"

#include <cstdint>
#include <optional>

namespace attnlab {

/// Which keys ProbSparse's measure M̄ reads: U keys sampled per query (with replacement, as the paper), or all.
enum class ProbSparseSample { Random, Full };
/// What the lazy rows of a causal ProbSparse give: the mean of the visible V, or the reference code's cumulative sum.
enum class ProbSparseLazy { Mean, Cumsum };

struct ProbSparseOptions : MethodOptions<ProbSparseOptions> {
  static constexpr const char* kName = "probsparse";
  double factor = 5;
  Index samples = 0;
  ProbSparseSample sample = ProbSparseSample::Random;
  SparsityMeasure measure = SparsityMeasure::MaxMean;
  ProbSparseLazy lazy = ProbSparseLazy::Mean;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.real("factor", &ProbSparseOptions::factor, 1e-3, 1e9,
           "sampling factor c: u = c·⌈ln n_q⌉ queries, U = c·⌈ln n_k⌉ keys")
        .budget(Study("probsparse", {1, 2, 5, 10, 20}).simplicity(7).listed(10));
    p.integer("samples", &ProbSparseOptions::samples, 0, 1 << 30, "keys sampled per query for M̄ (0: c·⌈ln n_k⌉)");
    p.choice("sample", &ProbSparseOptions::sample,
             {{ProbSparseSample::Random, "random"}, {ProbSparseSample::Full, "full"}},
             "M̄ on sampled keys (with replacement) or on all keys");
    p.choice("measure", &ProbSparseOptions::measure,
             {{SparsityMeasure::MaxMean, "maxmean"}, {SparsityMeasure::Lse, "lse"}},
             "M̄ = max − mean (the paper's estimate) or M = LSE − mean");
    p.choice("lazy", &ProbSparseOptions::lazy, {{ProbSparseLazy::Mean, "mean"}, {ProbSparseLazy::Cumsum, "cumsum"}},
             "causal lazy rows: mean of visible V, or the reference's unnormalized cumulative sum");
    p.seed(&ProbSparseOptions::seed);
  }
  /// The method's entry in the registry (lib/src/methods/probsparse.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class ProbSparseMethod final : public ConfiguredMethod<ProbSparseOptions, Method<T>> {
 public:
  using ConfiguredMethod<ProbSparseOptions, Method<T>>::ConfiguredMethod;
  /// How many queries got exact rows in the last compute().
  std::vector<std::pair<std::string, double>> diagnostics() const override {
    return {{"selected_queries", op_ ? double(op_->selected()) : 0.0}};
  }
  /// The queries that got exact rows in the last compute(), ascending (analysis/rounding_bound.hpp's ProbSparse
  /// bound compares two runs' choices).
  const std::vector<Index>& selected_queries() const {
    require(op_.has_value(), "probsparse: selected_queries() before compute()");
    return op_->selected_queries();
  }

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  const AttentionOperator<T>& do_op() const override { return *op_; }
  /// The fast path; keeps the exact rows' O and ℓ (and V) for the backward.
  MatrixR<T> do_output(const ConstRef<T>& v) const override { return op_->output(v, &ws_, this->rounding_hook()); }
  /// From the O and ℓ the last output() kept when it was taken on this V (compared element by element, O(n·d)),
  /// else with a forward pass of the exact rows again; buffers kept across calls.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override {
    return op_->backward(v, d_out, &ws_, this->rounding_hook());
  }

  std::optional<ProbSparseOperator<T>> op_;
  /// The backward's buffers and output()'s forward, kept across calls and computes (a cache behind const calls: one
  /// method object is not to be used from several threads at once).
  mutable ProbSparseWorkspace<T> ws_;
};

extern template class ProbSparseMethod<float>;
extern template class ProbSparseMethod<double>;

}  // namespace attnlab
