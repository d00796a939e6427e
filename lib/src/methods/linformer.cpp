// `linformer` — Linformer (Wang et al. 2020; seed 001, seed 003 eq. (8)):
//   P̃ = softmax(s·Q(EK)ᵀ)·F,  output softmax(s·Q(EK)ᵀ)·(FV),  E, F ∈ ℝ^{k×n}
// with E, F Gaussian N(0, 1/k) (the JL projection of the paper's Theorem 2), uniform ±1/√k, mean pooling over
// k segments (the downsampling of seed 003), or the identity (k = n: exact attention, for the exact limit).
// share_kv uses E = F. The projections mix every position: a causal mask is refused.
#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/methods/descriptors.hpp"
#include "lowrank_method.hpp"
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
    const Index kk = Index(this->params().integer("k")), n = k.rows();
    const std::string& proj = this->params().choice("projection");
    Rng rng(std::uint64_t(this->params().integer("seed")));
    const auto draw = [&]() -> MatrixR<T> {
      if (proj == "gaussian") return gaussian_matrix<T>(kk, n, rng) / T(std::sqrt(double(kk)));
      if (proj == "uniform") {
        MatrixR<T> r(kk, n);
        const T v = T(1) / T(std::sqrt(double(kk)));
        for (Index i = 0; i < kk; ++i)
          for (Index j = 0; j < n; ++j) r(i, j) = (rng.next_u64() >> 63) ? v : -v;
        return r;
      }
      if (proj == "pool") {
        require(kk <= n, fmt::format("linformer: pooling to k = {} segments needs k ≤ n_k = {}", kk, n));
        return segment_mean_matrix<T>(kk, n);
      }
      require(kk == n, fmt::format("linformer: projection=identity needs k = n_k = {}, got k = {}", n, kk));
      return MatrixR<T>::Identity(n, n);
    };
    // E and F are the method's parameters: drawn once per (n, k) and reused by later calls (the draw, 2·k·n
    // Gaussians, cost more than the attention itself at n = 4096).
    if (n != drawn_n_) {
      e_ = draw();
      f_ = this->params().boolean("share_kv") ? e_ : draw();
      drawn_n_ = n;
    }
    const MatrixR<T>& e = e_;
    const MatrixR<T>& f = f_;
    const MatrixR<T> ek = e * k;  // k × d
    AttentionOptions plain = opts;
    plain.causal = false;
    MatrixR<T> s = exact_matrix<T>(q, ek, plain);  // n_q × k
    // Rows of P̃ are distributions exactly when F's rows are (pooling; the identity).
    const bool distributions = proj == "pool" || proj == "identity";
    this->set_factors(std::move(s), f.transpose(), distributions);
    return Status::Success;
  }

 private:
  Index drawn_n_ = -1;  // the n_k that E and F were drawn for
  MatrixR<T> e_, f_;
};

}  // namespace

MethodDescriptor linformer_descriptor() {
  MethodDescriptor d;
  d.name = "linformer";
  d.summary = "Linformer: softmax(Q(EK)ᵀ)·(FV) with k×n projections E, F (non-causal)";
  d.reference = "Wang et al. 2020 eq. (7), Theorem 2; seed 001; seed 003 eq. (8)";
  d.causal = false;
  d.params = {
      ParamSpec::integer("k", 256, 1, 1 << 20, "projected length k"),
      ParamSpec::choice("projection", {"gaussian", "uniform", "pool", "identity"},
                        "E, F: N(0, 1/k) entries, ±1/√k, mean pooling over k segments, or I (k = n)"),
      ParamSpec::boolean("share_kv", false, "E = F (key-value sharing)"),
      ParamSpec::seed(),
  };
  set_factories<LinformerMethod>(d);
  return d;
}

}  // namespace attnlab
