// Shared base of the sparse-pattern methods (local, sparse, reformer; lib/src/methods/base/pattern_method.cpp): a
// method chooses, for every query, the keys it attends to; the base takes the softmax of the logits over that
// pattern only, O(nnz·d), and keeps P̃ as a row-major sparse matrix (operator: sparse products).
// Backward (one for all pattern methods): the gradient of the softmax over each query's key set, the set held fixed
// (Reformer's rotations, buckets, sort and chunks; BigBird's random keys; the band and strides are fixed anyway):
// with P̃ the pattern softmax, dP_ij = dO_i·v_j, D_i = Σ_j P̃_ij dP_ij, dS_ij = P̃_ij (dP_ij − D_i) on the pattern,
//   dV = P̃ᵀ dO,  dQ = s·dS K,  dK = s·dSᵀ Q      — O(nnz·d), never n×n (the masked softmax's backward restricted
// to the pattern; Dao 2023, FlashAttention-2 §2.2, the same formulas as exact attention's).
#pragma once

#include "attnlab/operators/sparse.hpp"
#include "attnlab/methods/base/lazy_method.hpp"

#include <Eigen/SparseCore>
#include <algorithm>
#include <vector>

namespace attnlab {

/// For each query, the keys it attends to (any order, duplicates allowed: they are merged).
using Pattern = std::vector<std::vector<Index>>;

/// P̃_ij = exp(s·q_iᵀk_j) / Σ_{j' ∈ pattern(i)} exp(s·q_iᵀk_j') for j in pattern(i), 0 elsewhere (stable).
/// (lib/src/methods/base/pattern_method.cpp, float and double.)
/// With a reduced storage's `rounding` (core/precision.hpp): each row's logits qᵀk, then s·qᵀk, stored in the format
/// under eager (accumulators), the probabilities under both policies (tensors); the max, exponentials and sums in
/// float32, as torch.softmax takes them.
template <typename T>
typename SparseOperator<T>::Sparse pattern_softmax(const ConstRef<T>& q, const ConstRef<T>& k, double scale,
                                                   Pattern pattern, const Rounding& rounding = {});

/// Adds to each of the nq rows of `p` the band of keys around its aligned position c_i = i + (nk − nq):
/// c_i − w ≤ j ≤ c_i + w, cut at the future (j ≤ c_i) when causal, clipped to [0, nk) — the sliding window of
/// Beltagy et al. 2020 (Longformer §3.1), shared by `local` and `sparse`.
void add_band(Pattern& p, Index nq, Index nk, Index w, bool causal);

/// The backward of O = P̃·V for a pattern softmax `p` (pattern_softmax's result, compressed, row-major) of the logits
/// s·QKᵀ on its nonzeros: dV = P̃ᵀ dO, dS = P̃ ∘ (dP − D) with dP_ij = dO_i·v_j and D_i = Σ_j P̃_ij dP_ij,
/// dQ = s·dS K, dK = s·dSᵀ Q; O(nnz·(d + d_v)) work, O(nnz) memory. (float and double.)
/// With a reduced storage's `rounding`: dP and dS stored in the format (both policies, autograd's tensors), s·dS
/// again under eager; D_i and the products' sums in float32.
template <typename T>
Gradients<T> pattern_backward(const typename SparseOperator<T>::Sparse& p, const ConstRef<T>& q,
                              const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& d_out, double scale,
                              const Rounding& rounding = {});

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
  /// The keys each query attends to, as P̃ is formed over them (ascending, duplicates merged: SparseOperator's
  /// row_keys) from the inputs as this call holds them (under a reduced storage: the stored Q and K, hashed or
  /// chosen there), without forming P̃. Valid once compute() has returned.
  std::vector<std::vector<Index>> key_sets() const {
    Pattern p = pattern(this->queries(), this->keys(), this->options());
    for (auto& row : p) {
      std::sort(row.begin(), row.end());
      row.erase(std::unique(row.begin(), row.end()), row.end());
    }
    return p;
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
  /// The operator's P̃·V; under an emulated reduced storage the pattern softmax formed with the rounding (its note in
  /// pattern_softmax) and multiplied by V with float32 sums.
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    const Rounding r = this->rounding_hook();
    if (!r.active()) return this->do_op().apply(v);
    const MatrixR<T>& q = this->queries();
    const MatrixR<T>& k = this->keys();
    const AttentionOptions& opts = this->options();
    return pattern_softmax<T>(q, k, opts.scale, pattern(q, k, opts), r) * v;
  }
  /// The pattern softmax's backward on the pattern of the last compute() (built once, as the operator, and kept).
  /// Under an emulated reduced storage: the stored P of the forward (pattern_softmax with the rounding) and the
  /// rounding of pattern_backward.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override {
    const Rounding r = this->rounding_hook();
    if (r.active()) {
      const MatrixR<T>& q = this->queries();
      const MatrixR<T>& k = this->keys();
      const AttentionOptions& opts = this->options();
      const auto p = pattern_softmax<T>(q, k, opts.scale, pattern(q, k, opts), r.untallied());
      return pattern_backward<T>(p, q, k, v, d_out, opts.scale, r);
    }
    const auto& p = static_cast<const SparseOperator<T>&>(this->do_op()).matrix();
    return pattern_backward<T>(p, this->queries(), this->keys(), v, d_out, this->options().scale);
  }
};

}  // namespace attnlab
