// Attention over vector-quantized keys (Transformer-VQ, Lingle 2023) as operators: the keys replaced by their codes,
// K̂ = ΔC with Δ one-hot, P̃ = softmax(s·QK̂ᵀ) computed through the codes, exp(s·QCᵀ)(ΔᵀX) in O(n·c·d) per product
// — the operator of `vq` (quantize=keys, assign=hard) and of codebook_attention (components/codebook_attention.hpp);
// and the mean-field form of quantizing the queries too (`vq`, quantize=both), which is attnlab's variant.
#pragma once

#include "attnlab/operators/operator.hpp"

#include <vector>

namespace attnlab {

/// Hard-assignment VQ attention: P̃_ij = exp(ℓ_{i,a(j)} − L_i) for the visible j, with ℓ = s·QCᵀ the logits against
/// the codes (n_q × c), a(j) key j's code, and L_i the log of the normalizer Σ_y N_y exp(ℓ_iy) over the codes of the
/// visible keys, counted with multiplicity N_y. Causal: the visible keys of query i are j ≤ i + n_k − n_q, and
/// products run over per-code sums kept as running sums, so row i reads no later key.
template <typename T>
class CodebookOperator final : public AttentionOperator<T> {
 public:
  CodebookOperator(MatrixR<T> logits, std::vector<Index> assign, bool causal);
  Index rows() const override { return l_.rows(); }
  Index cols() const override { return Index(a_.size()); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  MatrixR<T> row_block(Index first, Index count) const override;

 private:
  /// exp(ℓ_iy − L_i) for every code (codes no visible key uses are never read: their sums are zero, and a key of
  /// code y is only seen by queries for which y is visible).
  Eigen::Matrix<T, 1, Eigen::Dynamic> weights(Index i) const;
  MatrixR<T> l_;
  std::vector<Index> a_;
  bool causal_;
  Index off_ = 0;
  VectorX<T> lse_;
};

/// The mean-field form of quantizing both queries and keys (attnlab's variant, not in Lingle 2023): the first-order
/// expansion q·k ≈ q·⟨k⟩ + ⟨q⟩·k − ⟨q⟩·⟨k⟩ around the codes ⟨k⟩ = c_a(j), ⟨q⟩ = c'_b(i) of a key codebook C and a
/// query codebook C', i.e. logits ℓ_ij = s(q_i·c_a(j) + c'_b(i)·r_j) with r_j = k_j − c_a(j), still linear in n.
/// Built from λ = s·QCᵀ (n_q × c), g = s·C'Rᵀ (c_q × n_k), the key codes a and the query codes b. Stabilized in the
/// log domain as exact attention is (a stable log-sum-exp per query over the joint logits): with
/// m_by = max_{j: a(j)=y} g_bj, G̃_bj = exp(g_bj − m_b,a(j)) ≤ 1 and H_by = Σ_{j: a(j)=y} G̃_bj,
/// L_i = log Σ_y exp(λ_iy + m_b(i),y)·H_b(i),y, E_iy = exp(λ_iy + m_b(i),y − L_i) ≤ 1, and P̃_ij = E_i,a(j)·G̃_b(i),j.
/// Every factor is at most one, so nothing overflows at any logit scale. Non-causal.
template <typename T>
class MeanFieldOperator final : public AttentionOperator<T> {
 public:
  MeanFieldOperator(const MatrixR<T>& lq, const MatrixR<T>& g, std::vector<Index> a, std::vector<Index> b);
  Index rows() const override { return e_.rows(); }
  Index cols() const override { return Index(a_.size()); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  MatrixR<T> row_block(Index first, Index count) const override;

 private:
  MatrixR<T> e_, gt_;  // E (n_q × c), G̃ (c_q × n_k)
  std::vector<Index> a_, b_;
};

extern template class CodebookOperator<float>;
extern template class CodebookOperator<double>;
extern template class MeanFieldOperator<float>;
extern template class MeanFieldOperator<double>;

}  // namespace attnlab
