// Shared base of the sparse-pattern methods (local, sparse, reformer; lib/src/methods/base/pattern_method.cpp): a
// method chooses, for every query, the keys it attends to; the base takes the softmax of the logits over that
// pattern only, O(nnz·d), and keeps P̃ as a row-major sparse matrix (operator: sparse products).
#pragma once

#include "attnlab/operators/sparse.hpp"
#include "attnlab/methods/base/lazy_method.hpp"

#include <Eigen/SparseCore>
#include <vector>

namespace attnlab {

/// For each query, the keys it attends to (any order, duplicates allowed: they are merged).
using Pattern = std::vector<std::vector<Index>>;

/// P̃_ij = exp(s·q_iᵀk_j) / Σ_{j' ∈ pattern(i)} exp(s·q_iᵀk_j') for j in pattern(i), 0 elsewhere (stable).
/// (lib/src/methods/base/pattern_method.cpp, float and double.)
template <typename T>
typename SparseOperator<T>::Sparse pattern_softmax(const ConstRef<T>& q, const ConstRef<T>& k, double scale,
                                                   Pattern pattern);

/// Adds to each of the nq rows of `p` the band of keys around its aligned position c_i = i + (nk − nq):
/// c_i − w ≤ j ≤ c_i + w, cut at the future (j ≤ c_i) when causal, clipped to [0, nk) — the sliding window of
/// Beltagy et al. 2020 (Longformer §3.1), shared by `local` and `sparse`.
void add_band(Pattern& p, Index nq, Index nk, Index w, bool causal);

/// The base of the pattern methods: the sparse P̃ is built only when the operator or the matrix is asked for, so a
/// method with a fast output path (local's blocked kernel, Reformer's chunk products) never builds it on the hot
/// path; the others' output is the sparse product.
template <typename T>
class PatternMethod : public LazyOperatorMethod<T> {
 public:
  using LazyOperatorMethod<T>::LazyOperatorMethod;
  /// Mean number of keys per query.
  std::vector<std::pair<std::string, double>> diagnostics() const override {
    const auto& op = static_cast<const SparseOperator<T>&>(this->do_op());
    return {{"keys_per_query", double(op.matrix().nonZeros()) / double(op.rows())}};
  }

 protected:
  /// The pattern; with opts.causal it must only hold keys j ≤ i + (n_k − n_q).
  virtual Pattern pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const = 0;
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions&) override {
    this->keep(q, k);
    return Status::Success;
  }
  std::unique_ptr<AttentionOperator<T>> build_op() const override {
    const MatrixR<T>& q = this->queries();
    const MatrixR<T>& k = this->keys();
    const AttentionOptions& opts = this->options();
    return std::make_unique<SparseOperator<T>>(pattern_softmax<T>(q, k, opts.scale, pattern(q, k, opts)));
  }
};

}  // namespace attnlab
