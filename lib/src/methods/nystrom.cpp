// `nystrom` — Nyströmformer (Xiong et al. 2021; seed 000 eq. (8)):
//   P̃ = softmax(s·QK̃ᵀ) · Z · softmax(s·Q̃Kᵀ),  Z ≈ A⁺,  A = softmax(s·Q̃K̃ᵀ),
// with landmarks Q̃, K̃ the segment means of Q and K (select=segments) or uniformly sampled rows
// (select=random), and Z from the order-3 iteration (seed 000 eq. (10)), Newton–Schulz, or the SVD.
// Pooling mixes every position into every landmark, so a causal mask cannot be honoured: it is refused.
#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/linalg/pinv.hpp"
#include "attnlab/methods/nystrom.hpp"
#include "lowrank_method.hpp"
#include "../tall_products.hpp"
#include "attnlab/landmarks.hpp"

#include <fmt/format.h>

#include <optional>

namespace attnlab {
namespace {

template <typename T>
class NystromMethod final : public LowRankMethod<T> {
 public:
  using LowRankMethod<T>::LowRankMethod;

  /// ‖I − AZ‖_F of the pseudo-inverse used: how far the iteration is from converged.
  std::vector<std::pair<std::string, double>> diagnostics() const override { return {{"pinv_residual", residual_}}; }

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    const NystromOptions o = NystromOptions::from(this->params());  // the spec's values, typed
    const Index m = o.landmarks;
    require(m <= q.rows() && m <= k.rows(),
            fmt::format("nystrom: landmarks = {} exceeds the sequence (n_q = {}, n_k = {})", m, q.rows(), k.rows()));
    MatrixR<T> ql, kl;
    if (o.select == "segments") {
      ql = segment_means<T>(q, m);
      kl = segment_means<T>(k, m);
    } else {
      Rng rng(o.seed);
      const auto iq = sample_without_replacement(q.rows(), m, rng);
      const auto ik = q.rows() == k.rows() ? iq : sample_without_replacement(k.rows(), m, rng);
      ql = take_rows<T>(q, iq);
      kl = take_rows<T>(k, ik);
    }
    AttentionOptions plain = opts;
    plain.causal = false;
    q_ = q;
    kl_ = kl;
    plain_ = plain;
    const MatrixR<T> a = exact_matrix<T>(ql, kl, plain);  // m × m
    b_ = exact_matrix<T>(ql, k, plain);                   // m × n_k
    Pseudoinverse<T> pinv;
    pinv.setMethod(parse_pinv_method(o.pinv))
        .setIterations(o.iters)
        .compute(a);
    residual_ = pinv.residuals().back();
    z_ = pinv.pseudoinverse();
    this->defer_factors(m, false);  // F·Z has negative entries
    return pinv.info() == Status::NumericalIssue ? Status::NumericalIssue : Status::Success;
  }

  /// O = F·(Z·(B·V)) with F = softmax(s·QK̃ᵀ): m×d intermediates only (the factored form (F·Z)·(B·V) adds an
  /// n·m² product), and F·W is exact attention over the m landmark keys with values W = Z·B·V, so the streaming
  /// kernel computes it tile by tile without forming F.
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    const MatrixR<T> bv = detail::tall_transpose_product<T>(b_.transpose(), v);  // m × d, summed over n
    const MatrixR<T> w = z_ * bv;
    return exact_output<T>(q_, kl_, w, plain_);
  }

  std::pair<MatrixR<T>, MatrixR<T>> make_factors() const override {
    return {exact_matrix<T>(q_, kl_, plain_) * z_, b_.transpose()};
  }

 private:
  double residual_ = 0;
  MatrixR<T> q_, kl_;   // the queries (kept for the output) and the key landmarks K̃
  MatrixR<T> z_, b_;    // Z ≈ A⁺ (m × m), softmax(s·Q̃Kᵀ) (m × n_k)
  AttentionOptions plain_;
};

}  // namespace

MethodDescriptor NystromOptions::descriptor() {
  return describe<NystromMethod>(
      kName, "Nyströmformer: softmax(QK̃ᵀ)·pinv(softmax(Q̃K̃ᵀ))·softmax(Q̃Kᵀ) with m landmarks (non-causal)",
      "Xiong et al. 2021 (Nyströmformer) eq. (14), landmarks by segment means; the order-3 pseudo-inverse iteration "
      "of Razavi et al. 2014", Causal::refused("landmarks pool every position"),
      {ParamSpec::integer("landmarks", 64, 1, 1 << 20, "number of landmarks m (≤ n)").budget(),
       ParamSpec::choice("pinv", {"iterative", "newton", "svd"},
                         "pseudo-inverse: order-3 iteration (Razavi et al. 2014, as Nyströmformer), Newton–Schulz, "
                         "or SVD"),
       ParamSpec::integer("iters", 6, 0, 10000, "iterations of the iterative pseudo-inverses (the paper uses 6)"),
       ParamSpec::choice("select", {"segments", "random"}, "landmarks: segment means, or uniformly sampled rows"),
       ParamSpec::seed()})
      .with_size_check([](const Params& p, const ProblemSize& s) {
        require_budget_within("nystrom", "landmarks", p.integer("landmarks"), std::min(s.n_q, s.n_k),
                              "min(n_q, n_k)");
      });
}

ATTNLAB_TYPED_METHOD_DEFINE(Nystrom)

}  // namespace attnlab
