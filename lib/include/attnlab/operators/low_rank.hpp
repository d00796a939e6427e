// A factored attention matrix P̃ = A·Btᵀ as an operator: the form of every low-rank method.
#pragma once

#include "attnlab/core/operator.hpp"

namespace attnlab {

/// P̃ = A·Btᵀ in factored form (A n_q×r, Bt n_k×r): every low-rank method (Nyström, Linformer, kernel feature
/// maps without a mask, the SVD and CUR baselines). Applying costs O((n_q + n_k)·r) per vector.
template <typename T>
class LowRankOperator final : public AttentionOperator<T> {
 public:
  LowRankOperator(MatrixR<T> a, MatrixR<T> bt, bool distributions);
  Index rows() const override { return a_.rows(); }
  Index cols() const override { return bt_.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override;
  bool rows_are_distributions() const override { return distributions_; }
  Index rank_bound() const { return a_.cols(); }
  const MatrixR<T>& left() const { return a_; }
  const MatrixR<T>& right() const { return bt_; }

 private:
  MatrixR<T> a_, bt_;
  bool distributions_;
};

extern template class LowRankOperator<float>;
extern template class LowRankOperator<double>;

}  // namespace attnlab
