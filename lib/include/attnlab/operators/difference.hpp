// The difference of two attention operators, P − P̃, matrix-free: the operator whose norms are the errors.
#pragma once

#include "attnlab/core/operator.hpp"

namespace attnlab {

/// A − B, matrix-free: the operator whose norms are the error norms.
template <typename T>
class DifferenceOperator final : public AttentionOperator<T> {
 public:
  DifferenceOperator(const AttentionOperator<T>& a, const AttentionOperator<T>& b);
  Index rows() const override { return a_.rows(); }
  Index cols() const override { return a_.cols(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override;
  bool rows_are_distributions() const override { return false; }

 private:
  const AttentionOperator<T>& a_;
  const AttentionOperator<T>& b_;
};

extern template class DifferenceOperator<float>;
extern template class DifferenceOperator<double>;

}  // namespace attnlab
