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
      .with_backward(Backward::yes(
          "random landmarks' rows held fixed; through the segment means, the softmaxes and every pinv iteration "
          "(incl. Z0's scaling, its argmax column/row held fixed); pinv=svd: d(A⁻¹)"))
      .with_size_check(budget_within_min_n("nystrom", "landmarks"));
}

template <typename T>
Status NystromMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const Index m = this->o_.landmarks;
  require(m <= q.rows() && m <= k.rows(),
          fmt::format("nystrom: landmarks = {} exceeds the sequence (n_q = {}, n_k = {})", m, q.rows(), k.rows()));
  MatrixR<T>& ql = ql_;
  MatrixR<T> kl;
  iq_.clear();
  ik_.clear();
  if (this->o_.select == LandmarkSelect::Segments) {
    ql = segment_means<T>(q, m);
    kl = segment_means<T>(k, m);
  } else {
    Rng rng(this->o_.seed);
    iq_ = sample_without_replacement(q.rows(), m, rng);
    ik_ = q.rows() == k.rows() ? iq_ : sample_without_replacement(k.rows(), m, rng);
    ql = take_rows<T>(q, iq_);
    kl = take_rows<T>(k, ik_);
  }
  AttentionOptions plain = opts;
  plain.causal = false;
  q_ = q;
  k_ = k;
  kl_ = kl;
  plain_ = plain;
  a_ = exact_matrix<T>(ql, kl, plain);  // m × m
  const MatrixR<T>& a = a_;
  b_ = exact_matrix<T>(ql, k, plain);   // m × n_k
  Pseudoinverse<T> pinv;
  pinv.setMethod(this->o_.pinv).setIterations(this->o_.iters).compute(a);
  residual_ = pinv.residuals().back();
  pinv_iterations_ = pinv.iterations();
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

template <typename T>
void NystromMethod<T>::spread(const MatrixR<T>& dl, const std::vector<Index>& idx, MatrixR<T>& dx) const {
  const Index m = dl.rows(), n = dx.rows();
  if (idx.empty()) {
    // Segment means (components/landmarks.hpp: segment s is rows [⌊s·n/m⌋, ⌊(s+1)·n/m⌋)): each row of segment s
    // receives dX̃_s / |segment s|.
    for (Index s = 0; s < m; ++s) {
      const Index b = segment_begin(s, n, m), e = segment_begin(s + 1, n, m);
      const auto g = (dl.row(s) / T(e - b)).eval();
      for (Index i = b; i < e; ++i) dx.row(i) += g;
    }
  } else {
    for (Index s = 0; s < m; ++s) dx.row(idx[std::size_t(s)]) += dl.row(s);
  }
}

/// Reverse mode through O = F·(Z·(B·V)) (Xiong et al. 2021, eq. (14)):
///   F·W = softmax(s·QK̃ᵀ)·W:  exact_backward → dQ, dK̃, dW;        W = Z·BV:  dZ = dW·(BV)ᵀ, d(BV) = Zᵀ·dW;
///   BV = softmax(s·Q̃Kᵀ)·V:   exact_backward → dQ̃, dK, dV;        Z = pinv(A): pinv_backward → dA (eq. (16));
///   A = softmax(s·Q̃K̃ᵀ):     dS = A ∘ (dA − rowsum(A ∘ dA)), dQ̃ += s·dS·K̃, dK̃ += s·dSᵀ·Q̃;
///   Q̃, K̃ from Q, K:         the segment means' adjoint (or the sampled rows').
template <typename T>
Gradients<T> NystromMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  // The forward's intermediates, formed again as do_output forms them.
  const MatrixR<T> bv = detail::tall_transpose_product<T>(b_.transpose(), v);  // m × d_v
  const MatrixR<T> w = z_ * bv;
  VectorX<T> lse_f;
  const MatrixR<T> out = exact_output<T>(q_, kl_, w, plain_, kDefaultTile, {}, &lse_f);
  Gradients<T> gf = exact_backward<T>(q_, kl_, w, out, lse_f, d_out, plain_);  // dQ, dK̃, dW
  const MatrixR<T> dz = gf.dv * bv.transpose();
  const MatrixR<T> dbv = z_.transpose() * gf.dv;
  const VectorX<T> lse_b = exact_row_lse<T>(ql_, k_, plain_);
  Gradients<T> gb = exact_backward<T>(ql_, k_, v, bv, lse_b, dbv, plain_);  // dQ̃, dK, dV
  const MatrixR<T> da = pinv_backward<T>(a_, dz, this->o_.pinv, pinv_iterations_);
  // The dense softmax backward of A (m × m), dLogits = s·dS.
  const VectorX<T> rows = (a_.array() * da.array()).rowwise().sum();
  const MatrixR<T> ds = (a_.array() * (da.array().colwise() - rows.array()) * T(plain_.scale)).matrix();
  const MatrixR<T> dql = gb.dq + ds * kl_;
  const MatrixR<T> dkl = gf.dk + ds.transpose() * ql_;
  Gradients<T> g;
  g.dq = std::move(gf.dq);
  g.dk = std::move(gb.dk);
  g.dv = std::move(gb.dv);
  spread(dql, iq_, g.dq);
  spread(dkl, ik_, g.dk);
  return g;
}

template class NystromMethod<float>;
template class NystromMethod<double>;

}  // namespace attnlab
