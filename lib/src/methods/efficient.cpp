// `efficient` — efficient attention (Shen et al. 2021, Efficient Attention: Attention with Linear Complexities):
// P̃ = softmax₂(Q)·softmax₁(K)ᵀ, the softmax over the features of each query and over the positions of each key
// feature; O = softmax₂(Q)·(softmax₁(K)ᵀ·V). Pooling over all positions mixes the future in: causal is refused.
// The scale does not enter (as in the paper): the method acts on raw q and k.
#include "attnlab/methods/efficient.hpp"

#include <algorithm>
#include <cmath>

namespace attnlab {

MethodDescriptor EfficientOptions::registry_entry() {
  return describe<EfficientMethod, EfficientOptions>(
      "efficient attention softmax₂(Q)·softmax₁(K)ᵀ·V (non-causal)",
      "Shen et al. 2021 (Efficient Attention: Attention with Linear Complexities)",
      Causal::refused("the softmax over keys mixes every position"));
}

template <typename T>
Status EfficientMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions&) {
  // softmax₂(Q): each query row over its features; softmax₁(K): each feature column over positions.
  MatrixR<T> a = q;
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < a.rows(); ++i) {
    a.row(i) = (a.row(i).array() - a.row(i).maxCoeff()).exp();
    a.row(i) /= a.row(i).sum();
  }
  // softmax₁(K) column by column would walk the row-major matrix with stride d, once per column: at n = 65536 the
  // keys leave the cache and that was most of the method's time. Instead, blocks of columns in parallel, each
  // streaming the rows in order: the same max, the same scalar exp and the same sequential column sums as before,
  // so the same bits.
  MatrixR<T> b = k;
  const Index n = b.rows(), cols = b.cols(), width = 16;
#pragma omp parallel for schedule(static)
  for (Index c0 = 0; c0 < cols; c0 += width) {
    auto blk = b.middleCols(c0, std::min(width, cols - c0));
    Eigen::Matrix<T, 1, Eigen::Dynamic> mx = blk.row(0), sum;
    for (Index i = 1; i < n; ++i) mx = mx.cwiseMax(blk.row(i));
    for (Index i = 0; i < n; ++i)
      blk.row(i) = (blk.row(i) - mx).unaryExpr([](T x) { return T(std::exp(x)); });
    sum = blk.row(0);
    for (Index i = 1; i < n; ++i) sum += blk.row(i);
    for (Index i = 0; i < n; ++i) blk.row(i).array() /= sum.array();
  }
  // P̃ = softmax₂(Q)·softmax₁(K)ᵀ: rows are convex combinations of the columns' distributions.
  this->set_factors(std::move(a), std::move(b), true);
  return Status::Success;
}

template class EfficientMethod<float>;
template class EfficientMethod<double>;

}  // namespace attnlab
