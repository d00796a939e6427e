// Generic operator helpers: rows read through Pᵀ, densification by blocks of rows, dense and difference
// operators.
#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/operators/operator.hpp"
#include "detail/tall_products.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace attnlab {

template <typename T>
MatrixR<T> AttentionOperator<T>::row_block(Index first, Index count) const {
  MatrixR<T> out;
  row_block_into(first, count, out);
  return out;
}

template <typename T>
void AttentionOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  // Rows of P are columns of Pᵀ: apply Pᵀ to the matching columns of the identity.
  MatrixR<T> e = MatrixR<T>::Zero(rows(), count);
  for (Index r = 0; r < count; ++r) e(first + r, r) = T(1);
  out = apply_transpose(e).transpose();
}

template <typename T>
MatrixR<T> materialize(const AttentionOperator<T>& op) {
  check_memory(matrix_bytes(op.rows(), op.cols(), sizeof(T)),
               "the {}×{} {} attention matrix", op.rows(), op.cols(), dtype_name(dtype_of<T>()));
  MatrixR<T> p(op.rows(), op.cols());
  const Index block = 256;
  for (Index i = 0; i < op.rows(); i += block) {
    const Index b = std::min(block, op.rows() - i);
    p.middleRows(i, b) = op.row_block(i, b);
  }
  return p;
}

template <typename T>
MatrixR<T> DenseOperator<T>::apply(const ConstRef<T>& x) const {
  require(x.rows() == p_.cols(), "apply: dimension mismatch");
  return p_ * x;
}

template <typename T>
MatrixR<T> DenseOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == p_.rows(), "apply_transpose: dimension mismatch");
  return p_.transpose() * x;
}

template <typename T>
void DenseOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  out = p_.middleRows(first, count);
}

template <typename T>
LowRankOperator<T>::LowRankOperator(MatrixR<T> a, MatrixR<T> bt, bool distributions)
    : a_(std::move(a)), bt_(std::move(bt)), distributions_(distributions) {
  require(a_.cols() == bt_.cols(), "LowRankOperator: factors of different rank");
}

template <typename T>
MatrixR<T> LowRankOperator<T>::apply(const ConstRef<T>& x) const {
  require(x.rows() == cols(), "apply: dimension mismatch");
  const MatrixR<T> t = detail::tall_transpose_product<T>(bt_, x);
  return a_ * t;
}

template <typename T>
MatrixR<T> LowRankOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == rows(), "apply_transpose: dimension mismatch");
  const MatrixR<T> t = detail::tall_transpose_product<T>(a_, x);
  return bt_ * t;
}

template <typename T>
void LowRankOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  out.resize(count, cols());
  out.noalias() = a_.middleRows(first, count) * bt_.transpose();
}

template <typename T>
DifferenceOperator<T>::DifferenceOperator(const AttentionOperator<T>& a, const AttentionOperator<T>& b)
    : a_(a), b_(b) {
  require(a.rows() == b.rows() && a.cols() == b.cols(),
          "cannot compare a {}×{} attention matrix with a {}×{} one", a.rows(), a.cols(), b.rows(),
          b.cols());
}

template <typename T>
MatrixR<T> DifferenceOperator<T>::apply(const ConstRef<T>& x) const {
  MatrixR<T> y = a_.apply(x);
  y -= b_.apply(x);
  return y;
}

template <typename T>
MatrixR<T> DifferenceOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  MatrixR<T> y = a_.apply_transpose(x);
  y -= b_.apply_transpose(x);
  return y;
}

template <typename T>
void DifferenceOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  a_.row_block_into(first, count, out);
  out -= b_.row_block(first, count);
}

template class AttentionOperator<float>;
template class AttentionOperator<double>;
template class DenseOperator<float>;
template class DenseOperator<double>;
template class LowRankOperator<float>;
template class LowRankOperator<double>;
template class DifferenceOperator<float>;
template class DifferenceOperator<double>;
template MatrixR<float> materialize<float>(const AttentionOperator<float>&);
template MatrixR<double> materialize<double>(const AttentionOperator<double>&);

}  // namespace attnlab
