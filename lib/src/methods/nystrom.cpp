// `nystrom` — Nyströmformer (Xiong et al. 2021, eq. (14)):
//   P̃ = softmax(s·QK̃ᵀ) · Z · softmax(s·Q̃Kᵀ),  Z ≈ A⁺,  A = softmax(s·Q̃K̃ᵀ),
// with landmarks Q̃, K̃ the segment means of Q and K (select=segments, Xiong et al. 2021 §3.3) or uniformly sampled
// rows (select=random), and Z from the order-3 iteration (Razavi et al. 2014; Xiong et al. 2021 eq. (16)),
// Newton–Schulz, or the SVD. Pooling mixes every position into every landmark, so a causal mask cannot be honoured:
// it is refused.
#include "attnlab/methods/nystrom.hpp"

#include "attnlab/components/landmarks.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "detail/tall_products.hpp"

#include <fmt/format.h>

namespace attnlab {

MethodDescriptor NystromOptions::registry_entry() {
  return describe<NystromMethod, NystromOptions>(
      "Nyströmformer: softmax(QK̃ᵀ)·pinv(softmax(Q̃K̃ᵀ))·softmax(Q̃Kᵀ) with m landmarks (non-causal)",
      "Xiong et al. 2021 (Nyströmformer) eq. (14), landmarks by segment means; the order-3 pseudo-inverse "
      "iteration of Razavi et al. 2014",
      Causal::refused("landmarks pool every position"))
      .with_size_check(budget_within_min_n("nystrom", "landmarks"));
}

template <typename T>
Status NystromMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const Index m = this->o_.landmarks;
  require(m <= q.rows() && m <= k.rows(),
          fmt::format("nystrom: landmarks = {} exceeds the sequence (n_q = {}, n_k = {})", m, q.rows(), k.rows()));
  MatrixR<T> ql, kl;
  if (this->o_.select == LandmarkSelect::Segments) {
    ql = segment_means<T>(q, m);
    kl = segment_means<T>(k, m);
  } else {
    Rng rng(this->o_.seed);
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
  pinv.setMethod(this->o_.pinv).setIterations(this->o_.iters).compute(a);
  residual_ = pinv.residuals().back();
  z_ = pinv.pseudoinverse();
  this->defer_factors(m, false);  // F·Z has negative entries
  return pinv.info() == Status::NumericalIssue ? Status::NumericalIssue : Status::Success;
}

/// O = F·(Z·(B·V)) with F = softmax(s·QK̃ᵀ): m×d intermediates only (the factored form (F·Z)·(B·V) adds an n·m²
/// product), and F·W is exact attention over the m landmark keys with values W = Z·B·V, so the streaming kernel
/// computes it tile by tile without forming F.
template <typename T>
MatrixR<T> NystromMethod<T>::do_output(const ConstRef<T>& v) const {
  const MatrixR<T> bv = detail::tall_transpose_product<T>(b_.transpose(), v);  // m × d, summed over n
  const MatrixR<T> w = z_ * bv;
  return exact_output<T>(q_, kl_, w, plain_);
}

template <typename T>
std::pair<MatrixR<T>, MatrixR<T>> NystromMethod<T>::make_factors() const {
  return {exact_matrix<T>(q_, kl_, plain_) * z_, b_.transpose()};
}

template class NystromMethod<float>;
template class NystromMethod<double>;

}  // namespace attnlab
