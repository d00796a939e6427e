// Linear attention with deterministic feature maps (seed 003) and efficient attention (Shen et al.).
//   linear:  sim(q,k) = φ(q)ᵀφ(k), φ = elu(x) + 1 (Katharopoulos et al. 2020) or relu, on raw q and k
//            (seed 003 eq. (4)); causal by prefix sums (eqs. (9)–(10)).
//   taylor:  sim(q,k) = 1 + (q/‖q‖)ᵀ(k/‖k‖) (seed 003 eq. (7)) = φ(q)ᵀφ(k) with φ(x) = [1, x/‖x‖].
//   efficient: softmax₂(Q)·softmax₁(K)ᵀ·V (seed 003 eq. (5)): softmax over features of each query, over
//            positions of each key feature. Pooling over all positions mixes the future in: causal is refused.
// The scale does not enter these methods (as in their papers): they act on raw q and k.
#include "attnlab/methods/linear.hpp"
#include "attnlab/methods/taylor.hpp"
#include "attnlab/methods/efficient.hpp"
#include "lowrank_method.hpp"
#include "kernel_method.hpp"

#include <fmt/format.h>

#include <cmath>

namespace attnlab {
namespace {

template <typename T>
class LinearMethod final : public KernelMethod<T> {
 public:
  LinearMethod(const MethodDescriptor& d, Params p) : KernelMethod<T>(d, std::move(p)) {
    relu_ = LinearOptions::from(this->params()).feature == "relu";  // the spec's values, typed
  }

 protected:
  void block_features(const ConstRef<T>& x, bool, const AttentionOptions&, MatrixR<T>& f,
                      VectorX<T>& g) const override {
    // Evaluated into f's own storage (kept across calls by the caller's workspace): no temporary per block.
    if (relu_) f = x.cwiseMax(T(0));
    // elu(x) + 1 = x + 1 for x > 0, e^x for x ≤ 0: always positive. Written max(x, 0) + e^{min(x, 0)} so that
    // Eigen vectorizes the exp (a scalar std::exp per entry cost more than the whole attention at n = 4096).
    else f = (x.array().max(T(0)) + x.array().min(T(0)).exp()).matrix();
    g.resize(0);
  }
  bool nonnegative() const override { return !relu_; }  // relu rows can vanish: then P̃'s row is zero
  Index feature_count(Index d) const override { return d; }

 private:
  bool relu_ = false;
};

template <typename T>
class TaylorMethod final : public KernelMethod<T> {
 public:
  using KernelMethod<T>::KernelMethod;

 protected:
  void block_features(const ConstRef<T>& x, bool, const AttentionOptions&, MatrixR<T>& f,
                      VectorX<T>& g) const override {
    phi(x, f);  // 1 + cos ≥ 0
    g.resize(0);
  }
  Index feature_count(Index d) const override { return d + 1; }

 private:
  static void phi(const ConstRef<T>& x, MatrixR<T>& out) {
    out.resize(x.rows(), x.cols() + 1);  // keeps its storage when the size does not change
    out.col(0).setOnes();
    for (Index i = 0; i < x.rows(); ++i) {
      const T n = x.row(i).norm();
      if (n > 0) out.row(i).tail(x.cols()) = x.row(i) / n;
      else out.row(i).tail(x.cols()).setZero();  // a zero vector has no direction: sim = 1
    }
  }
};

template <typename T>
class EfficientMethod final : public LowRankMethod<T> {
 public:
  using LowRankMethod<T>::LowRankMethod;

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions&) override {
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
};

}  // namespace

MethodDescriptor LinearOptions::descriptor() {
  return describe<LinearMethod>(
      kName, "linear attention with a feature map, φ(q)ᵀΣφ(k)vᵀ / φ(q)ᵀΣφ(k)",
      "Katharopoulos et al. 2020 (Transformers are RNNs) §3.2, φ(x) = elu(x) + 1; causal masking §3.3 (prefix sums)",
      Causal::yes("recurrent or chunked prefix sums"),
      join_params({ParamSpec::choice("feature", {"elu", "relu"}, "feature map φ on raw q and k: elu(x)+1 or relu(x)")},
           causal_form_params()));
}

MethodDescriptor TaylorOptions::descriptor() {
  return describe<TaylorMethod>(kName, "first-order Taylor attention, sim = 1 + cos(q, k)",
                                "Su 2020, blog 'Exploring Linear Attention: Must Attention Have a Softmax?' "
                                "(e^{qᵀk} ≈ 1 + qᵀk on normalized q, k)",
                                Causal::yes("recurrent or chunked prefix sums"), causal_form_params());
}

MethodDescriptor EfficientOptions::descriptor() {
  return describe<EfficientMethod>(kName, "efficient attention softmax₂(Q)·softmax₁(K)ᵀ·V (non-causal)",
                                   "Shen et al. 2021 (Efficient Attention: Attention with Linear Complexities)",
                                   Causal::refused("the softmax over keys mixes every position"));
}

ATTNLAB_TYPED_METHOD_DEFINE(Linear)

ATTNLAB_TYPED_METHOD_DEFINE(Efficient)

ATTNLAB_TYPED_METHOD_DEFINE(Taylor)

}  // namespace attnlab
