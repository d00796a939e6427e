// `scatterbrain` — sparse + low-rank attention (Chen et al. 2021, "Scatterbrain", §3 and Algorithm 1): the
// unnormalized attention exp(s·QKᵀ) is estimated by the Performer term φ(Q)φ(K)ᵀ plus a sparse correction S that,
// on a support (here the band |j − c_i| ≤ W), replaces the estimate by the exact value:
//   Ã = φ(Q)φ(K)ᵀ + S,  S_ij = exp(s·q_iᵀk_j) − φ(q_i)ᵀφ(k_j) on the support, 0 elsewhere;
//   P̃ = diag(Ã·1)⁻¹·Ã.
// So Ã is exact on the support and has the Performer's rank-M estimate elsewhere; normalization by Ã's row sums
// (not the exact ones) makes P̃ = P on the support only when the support covers the row. Positive features keep
// every row sum positive. Each row is computed in units of e^{R_i}, R_i = max(the row's largest exact logit on the
// support, the log-scale of its largest estimated entry), so nothing overflows. Non-causal.
#include "attnlab/methods/scatterbrain.hpp"

#include "attnlab/core/error.hpp"

#include <algorithm>
#include <vector>

namespace attnlab {

MethodDescriptor ScatterbrainOptions::registry_entry() {
  return describe<ScatterbrainMethod, ScatterbrainOptions>(
      "Scatterbrain: Performer low-rank estimate + exact entries on a band, normalized (non-causal)",
      "Chen et al. 2021 (Scatterbrain) §3, Algorithm 1", Causal::refused("its Performer part mixes every position"));
}

/// For each block of 64 queries, the keys [lo, lo + bj) its bands span and the correction block
/// C_ij = e^{s·q_iᵀk_j − R_i} − e^{lq_i + lk_j − R_i}·(fq_i·fk_j) on each row's band (0 off it), in units of
/// e^{R_i}; with set_ref, R_i = max(the row's largest exact logit on its band, the log-scale of its estimated
/// entries) is computed into *set_ref first. f(i0, bi, lo, bj, C) is called per block (in parallel unless serial).
template <typename T>
template <typename F>
void ScatterbrainMethod<T>::band_blocks(F&& f, VectorX<T>* set_ref, bool serial) const {
  const Index nq = xq_.rows(), nk = xk_.rows(), block = 64, blocks = (nq + block - 1) / block;
  const VectorX<T>& ref = set_ref ? *set_ref : ref_;
#pragma omp parallel if (!serial)
  {
    MatrixR<T> logits, est;
#pragma omp for schedule(static)
    for (Index b = 0; b < blocks; ++b) {
      const Index i0 = b * block, bi = std::min(block, nq - i0);
      const Index lo = std::max<Index>(0, i0 + off_ - w_);
      const Index hi = std::min(nk - 1, i0 + bi - 1 + off_ + w_);
      const Index bj = hi - lo + 1;
      logits.noalias() = xq_.middleRows(i0, bi) * xk_.middleRows(lo, bj).transpose();
      est.noalias() = fq_.f.middleRows(i0, bi) * kscaled_.middleRows(lo, bj).transpose();
      for (Index r = 0; r < bi; ++r) {
        const Index i = i0 + r, c = i + off_;
        const Index first = std::max<Index>(0, c - w_) - lo, last = std::min(nk - 1, c + w_) - lo;
        const Index len = last - first + 1;
        const T base = fq_.logscale(i) + gk_;  // log-scale of the estimated entries of this row
        if (set_ref) (*set_ref)(i) = std::max(base, logits.row(r).segment(first, len).maxCoeff());
        const T scale = std::exp(base - ref(i));  // est_scale(i), with R_i possibly just set
        auto lrow = logits.row(r);
        lrow.segment(first, len) = (lrow.segment(first, len).array() - ref(i)).exp().matrix() -
                                   scale * est.row(r).segment(first, len);
        lrow.head(first).setZero();
        lrow.tail(bj - last - 1).setZero();
      }
      f(i0, bi, lo, bj, logits);
    }
  }
}

template <typename T>
Status ScatterbrainMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const ScatterbrainOptions& o = this->o_;
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq, w = o.window;
  Rng rng(o.seed);
  const MatrixR<T> omega = performer_projection<T>(o.features, q.cols(), true, true, rng);
  const T root = T(std::sqrt(opts.scale));
  xq_ = q * root;
  xk_ = k * root;
  fq_ = performer_features<T>(xq_, omega, PerformerKernel::Positive);
  const RandomFeatures<T> fk = performer_features<T>(xk_, omega, PerformerKernel::Positive);
  // The estimate of exp(s·q_iᵀk_j) is e^{lq_i + lk_j}·(fq_i·fk_j), with fq, fk ∈ (0, 1].
  gk_ = fk.logscale.maxCoeff();
  kscaled_ = (fk.logscale.array() - gk_).exp().matrix().asDiagonal() * fk.f;  // e^{lk − gk}·fk
  const VectorX<T> colsum = kscaled_.colwise().sum().transpose();
  w_ = w;
  off_ = off;
  ref_.resize(nq);
  den_.resize(nq);
  // Per block of queries, the band's exact logits and estimates as two GEMMs (as local attention's kernel).
  band_blocks([&](Index i0, Index bi, Index, Index, const MatrixR<T>& corr) {
    for (Index r = 0; r < bi; ++r) {
      const Index i = i0 + r;
      den_(i) = est_scale(i) * fq_.f.row(i).dot(colsum) + corr.row(r).sum();
    }
  }, &ref_);
  // (Checked here, not inside the parallel blocks: an exception must not leave an OpenMP region.)
  require((den_.array() > T(0)).all(), "scatterbrain: a row sum vanished");
  op_.reset();
  return Status::Success;
}

template <typename T>
MatrixR<T> ScatterbrainMethod<T>::do_output(const ConstRef<T>& v) const {
  const MatrixR<T> ktv = kscaled_.transpose() * v;  // M × d_v
  MatrixR<T> out(xq_.rows(), v.cols());
  band_blocks([&](Index i0, Index bi, Index lo, Index bj, const MatrixR<T>& corr) {
    auto o = out.middleRows(i0, bi);
    o.noalias() = fq_.f.middleRows(i0, bi) * ktv;
    for (Index r = 0; r < bi; ++r) o.row(r) *= est_scale(i0 + r);
    o.noalias() += corr * v.middleRows(lo, bj);
    for (Index r = 0; r < bi; ++r) o.row(r) /= den_(i0 + r);
  }, nullptr);
  return out;
}

template <typename T>
const AttentionOperator<T>& ScatterbrainMethod<T>::do_op() const {
  if (!op_) {
    std::vector<Eigen::Triplet<T, Index>> trips;
    band_blocks([&](Index i0, Index bi, Index lo, Index, const MatrixR<T>& corr) {
      for (Index r = 0; r < bi; ++r) {
        const Index i = i0 + r, c = i + off_;
        const Index first = std::max<Index>(0, c - w_), last = std::min(xk_.rows() - 1, c + w_);
        for (Index j = first; j <= last; ++j) trips.emplace_back(i, j, corr(r, j - lo) / den_(i));
      }
    }, nullptr, /*serial=*/true);
    typename SparseOperator<T>::Sparse s(xq_.rows(), xk_.rows());
    s.setFromTriplets(trips.begin(), trips.end());
    VectorX<T> arow(xq_.rows());
    for (Index i = 0; i < arow.size(); ++i) arow(i) = est_scale(i) / den_(i);
    op_.emplace(MatrixR<T>(arow.asDiagonal() * fq_.f), kscaled_, std::move(s));
  }
  return *op_;
}

template class ScatterbrainMethod<float>;
template class ScatterbrainMethod<double>;

}  // namespace attnlab
