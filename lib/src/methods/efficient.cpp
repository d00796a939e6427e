// `efficient` — efficient attention (Shen et al. 2021, Efficient Attention: Attention with Linear Complexities):
// P̃ = softmax₂(Q)·softmax₁(K)ᵀ, the softmax over the features of each query and over the positions of each key
// feature; O = softmax₂(Q)·(softmax₁(K)ᵀ·V). Pooling over all positions mixes the future in: causal is refused.
// The scale does not enter (as in the paper): the method acts on raw q and k.
#include "attnlab/methods/efficient.hpp"

#include "detail/tall_products.hpp"

#include <algorithm>
#include <cmath>

namespace attnlab {

MethodDescriptor EfficientOptions::registry_entry() {
  return describe<EfficientMethod, EfficientOptions>(
      "efficient attention softmax₂(Q)·softmax₁(K)ᵀ·V (non-causal)",
      "Shen et al. 2021 (Efficient Attention: Attention with Linear Complexities)",
      Causal::refused("the softmax over keys mixes every position"))
      .with_backward(Backward::yes("nothing held fixed (no parameters)"))
      .with_storage(StorageEmulation::both(
          "both policies: Q, K, V, the factors softmax₂(Q), softmax₁(K) (each softmax's max, exponentials and sums "
          "in float32, as torch.softmax takes them) and O; eager also the state softmax₁(K)ᵀV; careful keeps it in "
          "float32")
          .with_backward("V, dO, ∂L/∂A = dO·Cᵀ, ∂L/∂B = V·dCᵀ and dQ, dK, dV stored under both policies, the "
                         "softmaxes' backward from the stored factors (sums in float32); eager also the state C = BᵀV "
                         "and its gradient AᵀdO"));
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

/// Reverse mode through O = softmax₂(Q)·(softmax₁(K)ᵀ·V) (Shen et al. 2021, §3): dense VJPs of the two softmaxes,
/// each over its own axis; the sums over positions by the tall products (chunk-ordered, reproducible).
/// Under an emulated reduced storage the same steps on the factors as the forward stored them, as autograd runs them
/// on a half-precision transcription: C = BᵀV and dC = AᵀdO stored under eager (the state and its gradient), dA =
/// dO·Cᵀ and dB = V·dCᵀ stored under both policies; each softmax's backward from the stored factor, its sums in
/// float32; dQ, dK, dV stored by Method::backward. (Inactive, every rounding is a no-op: the native bits.)
template <typename T>
Gradients<T> EfficientMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  const Rounding r = this->rounding_hook();
  const LowRankOperator<T>& f = this->factors();
  MatrixR<T> as, bs;  // the factors as stored (emulated storage only)
  if (r.active()) {
    as = f.left();
    bs = f.right();
    r.untallied()(as, Held::tensor, "");  // stored by the forward (tallied there)
    r.untallied()(bs, Held::tensor, "");
  }
  const MatrixR<T>& a = r.active() ? as : f.left();   // softmax₂(Q), n_q × d
  const MatrixR<T>& b = r.active() ? bs : f.right();  // softmax₁(K), n_k × d
  // Bᵀ·V, d × d_v, as the forward formed it (emulated: LowRankMethod::do_output's plain product, then stored).
  MatrixR<T> c;
  if (r.active()) c.noalias() = b.transpose() * v;
  else c = detail::tall_transpose_product<T>(b, v);
  MatrixR<T> dc = detail::tall_transpose_product<T>(a, d_out);  // Aᵀ·dO, d × d_v
  r.untallied()(c, Held::accumulator, "");
  r(dc, Held::accumulator, "backward: the state's gradient AᵀdO");
  Gradients<T> g;
  // dQ: softmax over each row's features; dA = dO·Cᵀ.
  g.dq.noalias() = d_out * c.transpose();
  r(g.dq, Held::tensor, "backward: ∂L/∂A, ∂L/∂B");
  const VectorX<T> rows = (a.array() * g.dq.array()).rowwise().sum();
  g.dq = (a.array() * (g.dq.array().colwise() - rows.array())).matrix();
  // dK: softmax over each column's positions; dB = V·dCᵀ.
  g.dk.noalias() = v * dc.transpose();
  r(g.dk, Held::tensor, "backward: ∂L/∂A, ∂L/∂B");
  const Eigen::Matrix<T, 1, Eigen::Dynamic> cols = (b.array() * g.dk.array()).colwise().sum();
  g.dk = (b.array() * (g.dk.array().rowwise() - cols.array())).matrix();
  g.dv.noalias() = b * dc;
  return g;
}

template class EfficientMethod<float>;
template class EfficientMethod<double>;

}  // namespace attnlab
