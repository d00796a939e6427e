// Shared base of the methods whose P̃ is a factored product A·Btᵀ (Nyström, Linformer, efficient, SVD, CUR):
// do_compute builds the factors and hands them to set_factors; the operator, the fast output P̃·V = A(BtᵀV) and
// the rank bound follow.
#pragma once

#include "attnlab/method.hpp"

#include <optional>

namespace attnlab {

template <typename T>
class LowRankMethod : public Method<T> {
 public:
  using Method<T>::Method;
  Index rank_bound() const override { return op_ ? op_->rank_bound() : -1; }

 protected:
  void set_factors(MatrixR<T> a, MatrixR<T> bt, bool distributions) {
    op_.emplace(std::move(a), std::move(bt), distributions);
  }
  const AttentionOperator<T>& do_op() const override { return *op_; }

 private:
  std::optional<LowRankOperator<T>> op_;
};

}  // namespace attnlab
