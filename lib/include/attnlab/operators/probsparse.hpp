// Informer's ProbSparse attention matrix (Zhou et al. 2021, eq. (3)) as an operator: exact softmax rows for the
// selected ("active") queries, and for the others ("lazy") a uniform row over the visible keys — their output is
// mean(V) — or, causal with cumsum, the reference code's all-ones row (its unnormalized cumulative sum of V).
#pragma once

#include "attnlab/core/gradients.hpp"
#include "attnlab/core/options.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/core/operator.hpp"

#include <optional>
#include <vector>

namespace attnlab {

/// What a ProbSparse method keeps across calls and computes (compute() builds a new operator; the method clears
/// `kept`): the backward's buffers — in steady state only the returned gradients are allocated — and the selected
/// rows' forward that output() took, so that the backward does not take it again (FlashAttention-2 keeps O and ℓ the
/// same way). Not shared between concurrent calls.
template <typename T>
struct ProbSparseWorkspace {
  ExactBackwardWorkspace<T> exact;
  MatrixR<T> dos, dqs;  // the selected rows' dO and dQ (u × d_v, u × d)
  bool kept = false;    // v, out, lse hold output()'s forward for the current selection
  MatrixR<T> v;         // the V it was taken on (n_k × d_v), compared element by element
  MatrixR<T> out;       // the selected rows' O (u × d_v) and log-sum-exp ℓ (u)
  VectorX<T> lse;
};

/// Exact rows for the selected queries, uniform (mean) or all-ones (cumsum, causal only) rows on the visible keys
/// elsewhere. `selected`: the active queries, ascending (components/sparsity_measure.hpp's select_queries).
template <typename T>
class ProbSparseOperator final : public AttentionOperator<T> {
 public:
  ProbSparseOperator(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                     std::vector<Index> selected, bool cumsum);
  Index rows() const override { return nq_; }
  Index cols() const override { return nk_; }
  bool rows_are_distributions() const override { return !cumsum_; }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override;

  /// Lazy rows' weight on each visible key.
  T lazy_weight(Index i) const { return cumsum_ ? T(1) : T(1) / T(visible(i)); }
  /// The keys query i sees.
  Index visible(Index i) const { return causal_ ? i + off_ + 1 : nk_; }
  /// Y_i = Σ_{visible j} w_i x_j for the lazy rows; selected rows are left for the caller.
  MatrixR<T> lazy_apply(const ConstRef<T>& x) const;
  /// The fast path P̃·V: exact rows by the streaming kernel (no log-sum-exp pass), lazy rows by (prefix) sums. With
  /// `ws`, the exact rows' O, their ℓ (which the streaming pass forms anyway) and V are kept there for backward().
  /// With a reduced storage's `rounding` (core/precision.hpp): the lazy rows stored in the format (both policies: the
  /// reference's V.mean / V.cumsum result), the exact rows as exact_output rounds them; nothing is kept for backward.
  MatrixR<T> output(const ConstRef<T>& v, ProbSparseWorkspace<T>* ws = nullptr, const Rounding& rounding = {}) const;
  /// How many queries get exact rows.
  Index selected() const { return Index(selected_.size()); }
  /// Which: the active queries, ascending.
  const std::vector<Index>& selected_queries() const { return selected_; }
  /// The backward of output(v) given the selection (Zhou et al. 2021, eq. (3) with the top-u set held fixed):
  /// the selected rows are exact softmax attention at their causal positions — exact_backward (FlashAttention-2
  /// Alg. 2) on them, from their outputs and log-sum-exp (output()'s, or one forward pass); the lazy rows are
  /// w_i·Σ_{visible j} v_j (mean or cumsum), linear in V alone: they add w_i·dO_i to dV of every key they see and
  /// nothing to dQ or dK. The exact rows' backward adds straight into the gradients (exact_backward_add); `ws` keeps
  /// its buffers (without it they are made for this call) and, when output(v, ws) was taken on this V, the forward
  /// pass.
  /// With a reduced storage's `rounding`: the exact rows' forward again with its rounding, then exact_backward_add's
  /// (FlashAttention-2's tiles in the format); the lazy rows' dV in float32 sums.
  Gradients<T> backward(const ConstRef<T>& v, const ConstRef<T>& d_out, ProbSparseWorkspace<T>* ws = nullptr,
                        const Rounding& rounding = {}) const;

 private:
  /// y = Σ_{lazy i that see key j} w_i x_i for every key j (the lazy rows' part of P̃ᵀ·x; the selected rows add
  /// nothing): every row of y (n_k × cols) written.
  void lazy_apply_transpose(const ConstRef<T>& x, MatrixR<T>& y) const;
  void scatter(const MatrixR<T>& rows, MatrixR<T>& y) const;
  Index nq_, nk_, off_ = 0;
  bool causal_, cumsum_;
  std::vector<Index> selected_;
  std::vector<bool> is_selected_;
  std::optional<ExactOperator<T>> exact_;
};

extern template class ProbSparseOperator<float>;
extern template class ProbSparseOperator<double>;

}  // namespace attnlab
