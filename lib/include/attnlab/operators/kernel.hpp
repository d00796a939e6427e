// Kernel (feature-map) attention, the general form of Katharopoulos et al. 2020 §3.2:
//   O_i = Σ_j sim(q_i, k_j) v_j / Σ_j sim(q_i, k_j),   sim(q_i, k_j) = φ(q_i)ᵀ ψ(k_j),
// with the causal form as prefix sums (Katharopoulos et al. 2020 §3.3), in two ways: recurrent (an M×d_v state updated
// per position, the RNN form) and chunked (blocks of queries: the state carried across blocks, the masked
// quadratic product inside a block — the practical version of the cumsum form).
//
// Features are given as φ(q_i) = qf_i (any positive per-query factor cancels in the normalization, so it is
// dropped) and ψ(k_j) = exp(g_j)·kf_j, with a per-key log-scale g_j that may be large (Performer's
// exp(ωᵀk − ‖k‖²/2)). Query i weighs key j by exp(g_j − M_i) with M_i the maximum of g over the keys i sees —
// all keys without a mask, the prefix max with one — so exp never overflows, the dominant key of every row has
// weight 1 (nothing that matters underflows), and the stabilizer never looks ahead.
// Denominators are guarded: below eps times the magnitude of their terms they are clamped, and a row whose
// features all vanish is a zero row — never 0/0.
#pragma once

#include "attnlab/operators/operator.hpp"
#include <vector>

namespace attnlab {

template <typename T>
struct FeatureMaps {
  MatrixR<T> qf;          ///< n_q × M
  MatrixR<T> kf;          ///< n_k × M
  VectorX<T> k_logscale;  ///< n_k; empty means all zero
  bool nonnegative = true;  ///< every sim ≥ 0 (then rows of P̃ are distributions)
};

template <typename T>
class KernelOperator final : public AttentionOperator<T> {
 public:
  /// causal: query i sees keys j ≤ i + (n_k − n_q); chunk: block size of the chunked causal form.
  KernelOperator(FeatureMaps<T> f, bool causal, Index chunk = 64);
  Index rows() const override { return f_.qf.rows(); }
  Index cols() const override { return f_.kf.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  MatrixR<T> row_block(Index first, Index count) const override;
  bool rows_are_distributions() const override { return f_.nonnegative; }

  /// The recurrent (RNN) causal output, one position at a time with an O(M·d_v) state.
  MatrixR<T> recurrent_output(const ConstRef<T>& v) const;

 private:
  /// Σ_{visible j} (qf_i·kf_j) e^{g_j − M(i)} x_j with the stabilizer M(i) of query i's block.
  MatrixR<T> unnormalized(const MatrixR<T>& qf, const MatrixR<T>& kf, const ConstRef<T>& x) const;
  /// Key features scaled by e^{g − m}, rows [first, first + count).
  MatrixR<T> scaled_keys(const MatrixR<T>& kf, Index first, Index count, T m) const;
  /// The masked intra-block weights of block c: (qf_i·kf_j)·e^{g_j − M_i} for the block's keys j ≤ i + offset.
  MatrixR<T> block_weights(const MatrixR<T>& qf, const MatrixR<T>& kf, Index c) const;
  /// Max of g over the keys before block c's own keys (−∞ when there are none).
  T before_block(Index c) const { return before_[std::size_t(c)]; }
  Index blocks() const { return (rows() + chunk_ - 1) / chunk_; }

  FeatureMaps<T> f_;
  bool causal_;
  Index chunk_, offset_;
  VectorX<T> qmax_;         // M_i: stabilizer of query i
  std::vector<T> before_;   // causal: max of g over the keys before each block (blocks() + 1 entries)
  VectorX<T> inv_den_;      // 1 / guarded denominator, per query
};

extern template class KernelOperator<float>;
extern template class KernelOperator<double>;

}  // namespace attnlab
