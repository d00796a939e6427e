// The operator interface's own members: rows read through Pᵀ, densification by blocks of rows.
#include "attnlab/core/operator.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"

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

template class AttentionOperator<float>;
template class AttentionOperator<double>;
template MatrixR<float> materialize<float>(const AttentionOperator<float>&);
template MatrixR<double> materialize<double>(const AttentionOperator<double>&);

}  // namespace attnlab
