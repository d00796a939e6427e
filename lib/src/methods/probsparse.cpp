// `probsparse` — Informer's ProbSparse self-attention (Zhou et al. 2021, eqs. (2)-(4), Lemma 1): the u queries with
// the largest sparsity measure get exact softmax rows; the other ("lazy") queries get mean(V) — a uniform row of P̃.
// Causal: exact rows are masked; lazy rows get the mean of V over the visible keys (lazy=mean) or the reference
// code's unnormalized cumulative sum of V (lazy=cumsum: P̃'s row is all ones on the visible keys, not a distribution
// — documented as the reference's behaviour, Informer2020 issue #633). The measure and the selection:
// components/sparsity_measure.hpp; the operator: operators/probsparse.hpp.
#include "attnlab/methods/probsparse.hpp"

namespace attnlab {

MethodDescriptor ProbSparseOptions::registry_entry() {
  return describe<ProbSparseMethod, ProbSparseOptions>(
      "Informer ProbSparse: exact rows for the top-u queries by sparsity measure, mean(V) for the rest",
      "Zhou et al. 2021 (Informer) eqs. (2)-(4), Lemma 1",
      Causal::yes("online top-u selection (query i is exact when its measure is among the u largest so far)"))
      .with_backward(Backward::yes("top-u selection and sampled keys held fixed, measure not differentiated; "
                                   "lazy rows: dV only"))
      .with_storage(StorageEmulation::both(
          "both policies: Q, K, V, the exact rows as exact's streaming emulation stores them (each tile of P; eager "
          "also their logits, running sums and accumulator), the lazy rows' mean(V) (causal: each prefix mean or "
          "cumsum row) and O; eager also each query's sampled logits qᵀk, s·qᵀk and its measure M (the reference's "
          "Q_K_sample and M), which choose the top-u queries; careful keeps those in float32")
                        .with_backward("V, dO and dQ, dK, dV in the format; the exact rows as exact's streaming "
                                       "backward emulation stores them (FlashAttention-2: P and dS tiles; eager also "
                                       "logits, D, dP and the running gradients); the lazy rows' dV in float32"));
}

template <typename T>
Status ProbSparseMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const double c = this->o_.factor;
  const bool lse = this->o_.measure == SparsityMeasure::Lse;
  Index samples = 0;  // all keys
  if (!lse && this->o_.sample == ProbSparseSample::Random) {
    samples = this->o_.samples;
    if (samples == 0) samples = probsparse_default_samples(k.rows(), c);
  }
  Rng rng(this->o_.seed);
  const VectorX<double> m = sparsity_measure<T>(q, k, opts, this->o_.measure, samples, rng, this->rounding_hook());
  ws_.kept = false;  // a new selection: the last output()'s forward no longer applies
  op_.emplace(q, k, opts, select_queries(m, probsparse_u(q.rows(), c), opts.causal),
              this->o_.lazy == ProbSparseLazy::Cumsum);
  return Status::Success;
}

template class ProbSparseMethod<float>;
template class ProbSparseMethod<double>;

}  // namespace attnlab
