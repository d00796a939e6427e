// The generic operators: dense, low-rank and difference (the interface's own members are core/operator.cpp's).
#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/core/operator.hpp"
#include "detail/tall_products.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace attnlab {

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

template class DenseOperator<float>;
template class DenseOperator<double>;
template class LowRankOperator<float>;
template class LowRankOperator<double>;
template class DifferenceOperator<float>;
template class DifferenceOperator<double>;

}  // namespace attnlab
