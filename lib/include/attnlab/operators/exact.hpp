// The exact softmax attention matrix P = softmax(scale·QKᵀ [+ causal mask]) as an operator: keeps Q, K and the
// row log-sum-exp ℓ_i, applies P and Pᵀ tile by tile with P_ij = exp(s·q_iᵀk_j − ℓ_i), never forms P.
#pragma once

#include "attnlab/operators/operator.hpp"
#include "attnlab/core/gradients.hpp"
#include "attnlab/core/options.hpp"
#include "attnlab/core/types.hpp"
#include <mutex>
#include <vector>

namespace attnlab {

/// Where the rows of Q sit in the full query sequence, for the causal mask: row r is query positions[r] of
/// n_q_full (ascending). Empty: row r is query r of Q itself. Used by methods that compute exact rows for a
/// subset of the queries (ProbSparse).
struct QueryLayout {
  std::vector<Index> positions;
  Index n_q_full = -1;
};

/// Default tile edge of the streaming kernels: a tile² logit block of float64 is 512 KiB.
constexpr Index kDefaultTile = 256;

/// The exact attention matrix as an operator; keeps copies of Q and K (O((n_q + n_k)·d)) and the row
/// log-sum-exp, never P.
template <typename T>
class ExactOperator final : public AttentionOperator<T> {
 public:
  ExactOperator(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                Index tile = kDefaultTile, QueryLayout layout = {});
  Index rows() const override { return q_.rows(); }
  Index cols() const override { return k_.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  MatrixR<T> row_block(Index first, Index count) const override;
  /// The row log-sum-exp ℓ, computed on first use (one streaming pass) and kept.
  const VectorX<T>& row_lse() const;
  const MatrixR<T>& queries() const { return q_; }
  const MatrixR<T>& keys() const { return k_; }
  const AttentionOptions& options() const { return opts_; }

 private:
  MatrixR<T> q_, k_;
  AttentionOptions opts_;
  Index tile_;
  QueryLayout layout_;
  mutable std::once_flag lse_once_;
  mutable VectorX<T> lse_;
};

extern template class ExactOperator<float>;
extern template class ExactOperator<double>;

// ---- Exact softmax attention, three ways, all with a stable log-sum-exp:
/// P = softmax(scale·QKᵀ [+ mask]), materialized (memory-guarded).
template <typename T>
MatrixR<T> exact_matrix(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts);

/// O = softmax(scale·QKᵀ [+ mask])·V, streaming over key tiles with an online softmax. With `row_lse`, also the
/// rows' log-sum-exp ℓ_i that the pass forms anyway (what the backward needs: Dao 2023, FlashAttention-2, Alg. 1).
template <typename T>
MatrixR<T> exact_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                        const AttentionOptions& opts, Index tile = kDefaultTile, const QueryLayout& layout = {},
                        VectorX<T>* row_lse = nullptr);

/// Row log-sum-exp ℓ_i of the (masked) logits, streaming.
template <typename T>
VectorX<T> exact_row_lse(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                         Index tile = kDefaultTile, const QueryLayout& layout = {});

// ---- Backward
/// The vector–Jacobian products of O = softmax(s·QKᵀ [+ mask])·V for the upstream gradient dO, in O(n) memory
/// (Dao 2023, FlashAttention-2, Algorithm 2): the logit tiles are formed again from Q, K and the forward's row
/// log-sum-exp ℓ, P_ij = exp(s·q_iᵀk_j − ℓ_i), D_i = rowsum(dO ∘ O)_i, and per tile
///   dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D),  dQ += s·dS K,  dK += s·dSᵀ Q   (10·n_q·n_k·d flops with d_v = d);
/// causal tiles above the diagonal are skipped. `out` and `row_lse` are the forward's (exact_output with row_lse).
/// Parallel over key tiles in kBackwardGroups fixed interleaved groups, each with its own dQ accumulator summed in
/// group order: the result does not depend on the number of threads; the extra memory is kBackwardGroups·n_q·d.
template <typename T>
Gradients<T> exact_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& out,
                            const VectorX<T>& row_lse, const ConstRef<T>& d_out, const AttentionOptions& opts,
                            Index tile = kDefaultTile, const QueryLayout& layout = {});

/// Groups of key tiles in exact_backward (a constant, not the thread count, so that its sums are reproducible).
constexpr Index kBackwardGroups = 4;

}  // namespace attnlab
