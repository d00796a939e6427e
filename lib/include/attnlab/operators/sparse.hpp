// A sparse attention matrix (row-major, Eigen's SparseMatrix) as an operator: the form of the pattern methods' P̃
// (local window, fixed sparse patterns, Reformer's buckets), O(nnz) per applied vector.
#pragma once

#include "attnlab/core/operator.hpp"

#include <Eigen/SparseCore>

#include <vector>

namespace attnlab {

template <typename T>
class SparseOperator final : public AttentionOperator<T> {
 public:
  using Sparse = Eigen::SparseMatrix<T, Eigen::RowMajor, Index>;
  explicit SparseOperator(Sparse p) : p_(std::move(p)) {}
  Index rows() const override { return p_.rows(); }
  Index cols() const override { return p_.cols(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override { return p_ * x; }
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override { return p_.transpose() * x; }
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override {
    out = MatrixR<T>(p_.middleRows(first, count));
  }
  const Sparse& matrix() const { return p_; }
  /// The keys each row holds (its stored entries, ascending): the pattern P̃ was formed over.
  std::vector<std::vector<Index>> row_keys() const {
    std::vector<std::vector<Index>> keys{std::size_t(p_.rows())};
    for (Index i = 0; i < p_.rows(); ++i)
      for (typename Sparse::InnerIterator it(p_, i); it; ++it) keys[std::size_t(i)].push_back(it.col());
    return keys;
  }

 private:
  Sparse p_;
};

}  // namespace attnlab
