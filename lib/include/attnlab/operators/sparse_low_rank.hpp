// A low-rank matrix plus a sparse one as an operator: P̃ = A·Btᵀ + S, the form of Scatterbrain's P̃ (Chen et al.
// 2021, §3: a Performer low-rank estimate and a sparse correction on a support, rows already normalized).
#pragma once

#include "attnlab/core/operator.hpp"
#include "attnlab/operators/sparse.hpp"

namespace attnlab {

/// P̃ = A·Btᵀ + S (A n_q×r, Bt n_k×r, S n_q×n_k sparse, row-major). Applying costs O((n_q + n_k)·r + nnz(S)) per
/// vector.
template <typename T>
class SparseLowRankOperator final : public AttentionOperator<T> {
 public:
  using Sparse = typename SparseOperator<T>::Sparse;
  SparseLowRankOperator(MatrixR<T> a, MatrixR<T> bt, Sparse s);
  Index rows() const override { return a_.rows(); }
  Index cols() const override { return bt_.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override;
  /// The rank-limited part A·Btᵀ.
  const MatrixR<T>& left() const { return a_; }
  const MatrixR<T>& right() const { return bt_; }
  /// The sparse part S.
  const Sparse& sparse() const { return s_; }

 private:
  MatrixR<T> a_, bt_;
  Sparse s_;
};

extern template class SparseLowRankOperator<float>;
extern template class SparseLowRankOperator<double>;

}  // namespace attnlab
