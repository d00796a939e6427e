// A materialized attention matrix as an operator (small problems, tests, the SVD baseline).
#pragma once

#include "attnlab/core/operator.hpp"

namespace attnlab {

/// A dense matrix seen as an operator. Holds its own copy.
template <typename T>
class DenseOperator final : public AttentionOperator<T> {
 public:
  explicit DenseOperator(MatrixR<T> p, bool distributions = true)
      : p_(std::move(p)), distributions_(distributions) {}
  Index rows() const override { return p_.rows(); }
  Index cols() const override { return p_.cols(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override;
  bool rows_are_distributions() const override { return distributions_; }
  const MatrixR<T>& matrix() const { return p_; }

 private:
  MatrixR<T> p_;
  bool distributions_;
};

extern template class DenseOperator<float>;
extern template class DenseOperator<double>;

}  // namespace attnlab
