// `cur` — the classical Nyström / CUR approximation of the exact P (Drineas & Mahoney 2005; its use on softmax
// matrices, Xiong et al. 2021 §3.1):
//   P ≈ P[:,J]·pinv(P[I,J])·P[I,:],
// I = J for square P, sampled uniformly or by the leverage scores of the rank-C singular subspaces (Drineas, Mahoney
// & Muthukrishnan 2008). The columns and rows of P are read from the row log-sum-exp, never forming P whole. A
// rank-limited analysis of all of P: a causal P̃ from it would not be causal, so causal is refused.
#include "attnlab/methods/cur.hpp"

#include "attnlab/components/spectrum.hpp"
#include "attnlab/components/landmarks.hpp"
#include "attnlab/components/pinv.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "detail/tall_products.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace attnlab {
namespace {

/// c indices of [0, n) without replacement, with probability ∝ weights (Efraimidis–Spirakis keys u^{1/w}).
std::vector<Index> weighted_sample(const VectorX<double>& w, Index c, Rng& rng) {
  std::vector<std::pair<double, Index>> keys;
  for (Index j = 0; j < w.size(); ++j) {
    const double u = std::max(rng.uniform(), 1e-300);
    keys.emplace_back(w(j) > 0 ? std::log(u) / w(j) : -std::numeric_limits<double>::infinity(), j);
  }
  std::partial_sort(keys.begin(), keys.begin() + c, keys.end(), std::greater<>());
  std::vector<Index> idx;
  for (Index i = 0; i < c; ++i) idx.push_back(keys[std::size_t(i)].second);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

MethodDescriptor CurOptions::registry_entry() {
  return describe<CurMethod, CurOptions>(
      "classical Nyström / CUR of the exact P: P[:,J]·pinv(P[I,J])·P[I,:] (non-causal)",
      "Drineas, Mahoney & Muthukrishnan 2008 (CUR, leverage-score sampling); the Nyström form of Xiong et al. "
      "2021",
      Causal::refused("columns and rows of all of P"))
      .with_backward(Backward::yes("J, I (uniform or leverage draws) and the kept singular values of P[I,J] held "
                                   "fixed; an analysis floor that reads all of P"))
      .with_storage(StorageEmulation::both(
          "an analysis floor: its factors C·U and R as formed in float32 from the stored Q, K, then stored in the "
          "format (both policies), O too; eager also the state R·V; careful keeps it in float32")
          .with_backward("reverse mode through that transcription: ∂L/∂A = dO·(RV)ᵀ stored (both policies), "
                         "d(RV) = AᵀdO under eager; A's float32 formation (C, Z = pinv(W), the softmax rows) "
                         "differentiated in float32; R·V's backward as exact attention's emulated one over the rows I "
                         "(its tiles of P and dS stored; eager also its logits, D, dP and running gradients)"));
}

std::uint64_t CurOptions::memory(const ProblemSize& s) const {
  // Leverage scores come from the top C singular vectors: a dense SVD of P (in T, float64 and the SVD's copy) where
  // top_singular's defaults choose it (n_k ≤ 512, or C > n_k/2). The factors are n × C.
  const Index c = columns;
  const bool dense = select == CurSelect::Leverage && (s.n_k <= 512 || c > s.n_k / 2);
  // Kept for the backward: copies of Q and K, and C (n_q × C).
  const std::uint64_t kept = add_bytes(matrix_bytes(std::uint64_t(s.n_q + s.n_k), std::uint64_t(s.d), s.elem),
                                       matrix_bytes(s.n_q, std::uint64_t(c), s.elem));
  return add_bytes(add_bytes(dense ? matrix_bytes(s.n_q, s.n_k, s.elem + 16) : 0,
                             matrix_bytes(std::uint64_t(2 * (s.n_q + s.n_k)), std::uint64_t(c), s.elem)),
                   kept);
}

template <typename T>
Status CurMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const Index c = this->o_.columns;  // ≤ min(n_q, n_k): its declared limit (cur.hpp), checked by compute()
  const ExactOperator<T> p(q, k, opts);
  Rng rng(this->o_.seed);
  std::vector<Index> cols, rows;
  if (this->o_.select == CurSelect::Uniform) {
    cols = sample_without_replacement(k.rows(), c, rng);
    rows = q.rows() == k.rows() ? cols : sample_without_replacement(q.rows(), c, rng);
  } else {
    // Leverage scores of the rank-c singular subspaces: ‖V_c[j,:]‖² for columns, ‖U_c[i,:]‖² for rows.
    const TopSingular top = top_singular(p, c);
    cols = weighted_sample(top.right.rowwise().squaredNorm(), c, rng);
    if (q.rows() == k.rows()) {
      rows = cols;
    } else {
      MatrixR<double> u = p.apply(top.right.template cast<T>()).template cast<double>();
      for (Index i = 0; i < c; ++i) u.col(i) /= std::max(top.values(i), 1e-300);
      rows = weighted_sample(u.rowwise().squaredNorm(), c, rng);
    }
  }
  // C = P[:, J] from the row log-sum-exp: exp(s·q_iᵀk_j − ℓ_i).
  const MatrixR<T> kj = take_rows<T>(k, cols);
  MatrixR<T> cm = (q * kj.transpose()) * T(opts.scale);
  cm = (cm.array().colwise() - p.row_lse().array()).exp().matrix();
  MatrixR<T> rm(c, k.rows());
  for (Index i = 0; i < c; ++i) rm.row(i) = p.row_block(rows[std::size_t(i)], 1);
  MatrixR<T> w(c, c);
  for (Index j = 0; j < c; ++j) w.col(j) = rm.col(cols[std::size_t(j)]);
  // pinv(P[I,J]) with singular values below rcond·σ_max dropped: with rcond at rounding level (the formula as
  // written) a nearly singular P[I,J] — clustered attention has rank ≈ clusters < C — amplifies noise.
  z_ = svd_pinv<T>(w, this->o_.rcond);
  MatrixR<T> a = cm * z_;
  this->set_factors(std::move(a), rm.transpose(), false);
  // Kept for the backward.
  q_ = q;
  k_ = k;
  cm_ = std::move(cm);
  w_ = std::move(w);
  lse_ = p.row_lse();
  rows_ = std::move(rows);
  cols_ = std::move(cols);
  return Status::Success;
}

/// Reverse mode through O = C·Z·(RV) (the CUR form, Drineas, Mahoney & Muthukrishnan 2008), every factor read from
/// the softmax rows P_i = exp(s·Kq_i − ℓ_i):
///   dC = dO·(Z·RV)ᵀ,  dZ = Cᵀ·dO·(RV)ᵀ,  d(RV) = (CZ)ᵀ·dO,  dW = pinv_backward(W, dZ);
///   RV = softmax(s·Q_I Kᵀ)·V: exact_backward over the c rows I;
///   C and W: entries P_ij of rows i at the columns j ∈ J, so with E = C ∘ dC (E_W = W ∘ dW on the rows I) the
///   logits get E_ij at (i, j) and −P_ik·D_i on every key k (the normalizer ℓ_i), D_i = rowsum(E)_i (+ rowsum(E_W)
///   on the rows I): dQ += s·E·K_J − s·D ∘ (P·K), dK_J += s·Eᵀ·Q, dK −= s·Pᵀ·(D ∘ Q).
template <typename T>
Gradients<T> CurMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  const LowRankOperator<T>& f = this->factors();
  const AttentionOptions& opts = this->options();
  const T s = T(opts.scale);
  const Index c = Index(cols_.size());
  const Rounding r = this->rounding_hook();  // a no-op unless a reduced storage is emulated
  MatrixR<T> rv, dc, dz, drv;
  if (!r.active()) {
    rv = detail::tall_transpose_product<T>(f.right(), v);  // R·V, as the operator's apply
    dc = d_out * (z_ * rv).transpose();                    // n_q × c
    const MatrixR<T> ctdo = detail::tall_transpose_product<T>(cm_, d_out);  // Cᵀ·dO, c × d_v
    dz = ctdo * rv.transpose();
    drv = detail::tall_transpose_product<T>(f.left(), d_out);  // (CZ)ᵀ·dO
  } else {
    // Emulated: reverse mode through the transcription LowRankMethod::do_output emulates — A = C·Z and R formed in
    // float32 and stored, the state R·V stored under eager — so ∂L/∂A = dO·(RV)ᵀ is stored (both policies) and
    // d(RV) = Aᵀ·dO under eager; A's float32 formation is differentiated in float32 (dC = ∂L/∂A·Zᵀ, dZ = Cᵀ·∂L/∂A).
    const Rounding quiet = r.untallied();  // the forward's tensors again (tallied by it)
    MatrixR<T> a = f.left(), bt = f.right();
    quiet(a, Held::tensor, "");
    quiet(bt, Held::tensor, "");
    rv = bt.transpose() * v;
    quiet(rv, Held::accumulator, "");
    MatrixR<T> da = d_out * rv.transpose();
    r(da, Held::tensor, "backward: ∂L/∂A = dO·(RV)ᵀ");
    drv = a.transpose() * d_out;
    r(drv, Held::accumulator, "backward: the state's gradient AᵀdO");
    dc = da * z_.transpose();
    dz = cm_.transpose() * da;
  }
  const MatrixR<T> dw = pinv_backward<T>(w_, dz, PinvMethod::Svd, 0, this->o_.rcond);
  // R·V: exact attention of the rows I over every key.
  const MatrixR<T> qi = take_rows<T>(q_, rows_);
  VectorX<T> lse_i(c);
  for (Index r = 0; r < c; ++r) lse_i(r) = lse_[rows_[std::size_t(r)]];
  // dQ_I, dK, dV; emulated, exact attention's own emulated backward (its tiles of P, which are R, stored).
  Gradients<T> g = exact_backward<T>(qi, k_, v, rv, lse_i, drv, opts, kDefaultTile, {}, r);
  MatrixR<T> dq = MatrixR<T>::Zero(q_.rows(), q_.cols());
  for (Index r = 0; r < c; ++r) dq.row(rows_[std::size_t(r)]) += g.dq.row(r);
  // The entries C = P[:,J] and W = P[I,J].
  const MatrixR<T> kj = take_rows<T>(k_, cols_);
  const MatrixR<T> e = (cm_.array() * dc.array()).matrix();
  const MatrixR<T> ew = (w_.array() * dw.array()).matrix();
  VectorX<T> dsum = e.rowwise().sum();
  for (Index r = 0; r < c; ++r) dsum(rows_[std::size_t(r)]) += ew.row(r).sum();
  dq.noalias() += s * (e * kj);
  MatrixR<T> dkj = s * detail::tall_transpose_product<T>(e, q_);  // c × d
  const MatrixR<T> ewk = s * (ew * kj);
  for (Index r = 0; r < c; ++r) dq.row(rows_[std::size_t(r)]) += ewk.row(r);
  dkj.noalias() += s * (ew.transpose() * qi);
  for (Index j = 0; j < c; ++j) g.dk.row(cols_[std::size_t(j)]) += dkj.row(j);
  // The normalizers: −s·D ∘ (P·K) and −s·Pᵀ·(D ∘ Q), streaming.
  const ExactOperator<T> p(q_, k_, opts);
  dq -= s * (dsum.asDiagonal() * p.apply(k_));
  g.dk -= s * p.apply_transpose((dsum.asDiagonal() * q_).eval());
  g.dq = std::move(dq);
  return g;
}

template class CurMethod<float>;
template class CurMethod<double>;

}  // namespace attnlab
