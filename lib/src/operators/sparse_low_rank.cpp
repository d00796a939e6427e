// P̃ = A·Btᵀ + S as an operator (attnlab/operators/sparse_low_rank.hpp).
#include "attnlab/operators/sparse_low_rank.hpp"

namespace attnlab {

template <typename T>
SparseLowRankOperator<T>::SparseLowRankOperator(MatrixR<T> a, MatrixR<T> bt, Sparse s)
    : a_(std::move(a)), bt_(std::move(bt)), s_(std::move(s)) {}

template <typename T>
MatrixR<T> SparseLowRankOperator<T>::apply(const ConstRef<T>& x) const {
  MatrixR<T> y = a_ * (bt_.transpose() * x);
  y += s_ * x;
  return y;
}

template <typename T>
MatrixR<T> SparseLowRankOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  MatrixR<T> y = bt_ * (a_.transpose() * x);
  y += s_.transpose() * x;
  return y;
}

template <typename T>
void SparseLowRankOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  out.noalias() = a_.middleRows(first, count) * bt_.transpose();
  out += MatrixR<T>(s_.middleRows(first, count));
}

template class SparseLowRankOperator<float>;
template class SparseLowRankOperator<double>;

}  // namespace attnlab
