// `linformer` — Linformer (Wang et al. 2020; seed 001, seed 003 eq. (8)):
//   P̃ = softmax(s·Q(EK)ᵀ)·F,  output softmax(s·Q(EK)ᵀ)·(FV),  E, F ∈ ℝ^{k×n}
// with E, F Gaussian N(0, 1/k) (the JL projection of the paper's Theorem 2), uniform ±1/√k, mean pooling over
// k segments (the downsampling of seed 003), or the identity (k = n: exact attention, for the exact limit).
// share_kv uses E = F. The projections mix every position: a causal mask is refused.
#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/methods/linformer.hpp"
#include "lowrank_method.hpp"
#include "../tall_products.hpp"
#include "attnlab/landmarks.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace attnlab {
namespace {

template <typename T>
class LinformerMethod final : public LowRankMethod<T> {
 public:
  using LowRankMethod<T>::LowRankMethod;

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    const LinformerOptions o = LinformerOptions::from(this->params());  // the spec's values, typed
    const Index kk = o.k, n = k.rows();
    // k rows projected from n_k keys: more than n_k is no longer a low-rank approximation, only a costlier one.
    require_budget_within("linformer", "k", kk, n);
    const std::string& proj = o.projection;
    Rng rng(o.seed);
    const auto draw = [&]() -> MatrixR<T> {
      if (proj == "gaussian") return gaussian_matrix<T>(kk, n, rng) / T(std::sqrt(double(kk)));
      if (proj == "uniform") {
        MatrixR<T> r(kk, n);
        const T v = T(1) / T(std::sqrt(double(kk)));
        for (Index i = 0; i < kk; ++i)
          for (Index j = 0; j < n; ++j) r(i, j) = (rng.next_u64() >> 63) ? v : -v;
        return r;
      }
      if (proj == "pool") return segment_mean_matrix<T>(kk, n);
      require(kk == n, fmt::format("linformer: projection=identity needs k = n_k = {}, got k = {}", n, kk));
      return MatrixR<T>::Identity(n, n);
    };
    // E and F are the method's parameters: drawn once per (n, k) and reused by later calls (the draw, 2·k·n
    // Gaussians, cost more than the attention itself at n = 4096).
    if (n != drawn_n_) {
      e_ = draw();
      f_ = o.share_kv ? e_ : draw();
      drawn_n_ = n;
    }
    ek_ = detail::tall_transpose_product<T>(e_.transpose(), k);  // E·K, k × d, summed over n
    q_ = q;
    plain_ = opts;
    plain_.causal = false;
    // Rows of P̃ are distributions exactly when F's rows are (pooling; the identity).
    this->defer_factors(kk, proj == "pool" || proj == "identity");
    return Status::Success;
  }

  /// Eq. (7) is exact attention over k projected keys EK and values FV: O = softmax(s·Q(EK)ᵀ)·(FV), by the
  /// streaming kernel, never forming the n×k matrix.
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    const MatrixR<T> fv = detail::tall_transpose_product<T>(f_.transpose(), v);  // k × d
    return exact_output<T>(q_, ek_, fv, plain_);
  }

  std::pair<MatrixR<T>, MatrixR<T>> make_factors() const override {
    return {exact_matrix<T>(q_, ek_, plain_), f_.transpose()};
  }

 private:
  Index drawn_n_ = -1;  // the n_k that E and F were drawn for
  MatrixR<T> e_, f_;    // the parameters, k × n_k
  MatrixR<T> q_, ek_;   // the queries (kept for the output) and E·K
  AttentionOptions plain_;
};

}  // namespace

MethodDescriptor LinformerOptions::descriptor() {
  return describe<LinformerMethod>(
      kName, "Linformer: softmax(Q(EK)ᵀ)·(FV) with k×n projections E, F (non-causal)",
      "Wang et al. 2020 (Linformer) eq. (7), Theorem 2", Causal::refused("E and F mix every position"),
      {ParamSpec::integer("k", 64, 1, 1 << 20, "projected length k (≤ n_k)").budget(),
       ParamSpec::choice("projection", {"gaussian", "uniform", "pool", "identity"},
                         "E, F: N(0, 1/k) entries, ±1/√k, mean pooling over k segments, or I (k = n)"),
       ParamSpec::boolean("share_kv", false, "E = F (key-value sharing)"), ParamSpec::seed()})
      .with_size_check([](const Params& p, const ProblemSize& s) {
        require_budget_within("linformer", "k", p.integer("k"), s.n_k);
      });
}

ATTNLAB_TYPED_METHOD_DEFINE(Linformer)

}  // namespace attnlab
