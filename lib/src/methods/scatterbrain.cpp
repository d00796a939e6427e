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
#include "base/band.hpp"

#include <algorithm>
#include <vector>

namespace attnlab {

MethodDescriptor ScatterbrainOptions::registry_entry() {
  return describe<ScatterbrainMethod, ScatterbrainOptions>(
      "Scatterbrain: Performer low-rank estimate + exact entries on a band, normalized (non-causal)",
      "Chen et al. 2021 (Scatterbrain) §3, Algorithm 1", Causal::refused("its Performer part mixes every position"))
      .with_backward(Backward::yes("ω held fixed; the band's exact entries and the estimate off it, exact"))
      .with_storage(StorageEmulation::both(
          "non-causal; both policies: Q, K, V, the Performer features (attnlab's stabilisation: each query's divided "
          "by its largest, the keys' log-scales apart) and the band's corrections before their product with V, and "
          "O; eager also the band's logits, the key–value state, the row sums and the numerators, divided "
          "unguarded; careful keeps those in float32")
          .with_backward("the derived backward (Chen et al. 2021 §3; ω held fixed) on the forward's stored tensors; "
                         "∂L/∂numerators and ∂L/∂row sums, ∂L/∂φ(q), ∂L/∂φ(k) (the global part, then less the band's "
                         "share), the band's ∂L/∂Ã and logit gradients, ∂L/∂exponents, the parts of dQ, dK, dV and "
                         "the gradients stored under both policies; eager also the state's gradient"));
}

template <typename T>
typename ScatterbrainMethod<T>::BandBlock ScatterbrainMethod<T>::band_block(Index b) const {
  const Index nq = xq_.rows(), nk = xk_.rows();
  const Index i0 = b * kBandBlock, bi = std::min(kBandBlock, nq - i0);
  const Index lo = std::max<Index>(0, i0 + off_ - w_);
  const Index hi = std::min(nk - 1, i0 + bi - 1 + off_ + w_);
  return {i0, bi, lo, hi - lo + 1};
}

template <typename T>
std::pair<Index, Index> ScatterbrainMethod<T>::band_of(Index i, Index lo) const {
  const Index c = i + off_, nk = xk_.rows();
  return {std::max<Index>(0, c - w_) - lo, std::min(nk - 1, c + w_) - lo};
}

/// For each block of 64 queries, the keys [lo, lo + bj) its bands span and the correction block
/// C_ij = e^{s·q_iᵀk_j − R_i} − e^{lq_i + lk_j − R_i}·(fq_i·fk_j) on each row's band (0 off it), in units of
/// e^{R_i}; with set_ref, R_i = max(the row's largest exact logit on its band, the log-scale of its estimated
/// entries) is computed into *set_ref first. f(i0, bi, lo, bj, C) is called per block (in parallel unless serial).
template <typename T>
template <typename F>
void ScatterbrainMethod<T>::band_blocks(F&& f, VectorX<T>* set_ref, bool serial, const Rounding* with) const {
  const Index blocks = (xq_.rows() + kBandBlock - 1) / kBandBlock;
  const VectorX<T>& ref = set_ref ? *set_ref : ref_;
  // A no-op unless a reduced storage is emulated; `with` (untallied) when a backward forms the blocks again.
  const Rounding rounding = with ? *with : this->rounding_hook();
#pragma omp parallel if (!serial)
  {
    MatrixR<T> logits, est;
#pragma omp for schedule(static)
    for (Index b = 0; b < blocks; ++b) {
      const auto [i0, bi, lo, bj] = band_block(b);
      logits.noalias() = xq_.middleRows(i0, bi) * xk_.middleRows(lo, bj).transpose();
      if (rounding.active()) rounding(logits, Held::accumulator, "band logits s·QKᵀ");
      est.noalias() = fq_.f.middleRows(i0, bi) * kscaled_.middleRows(lo, bj).transpose();
      for (Index r = 0; r < bi; ++r) {
        const Index i = i0 + r;
        const auto [first, last] = band_of(i, lo);
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
      if (rounding.active()) rounding(logits, Held::tensor, "band corrections");
      f(i0, bi, lo, bj, logits);
    }
  }
}

template <typename T>
Status ScatterbrainMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const ScatterbrainOptions& o = this->o_;
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq, w = o.window;
  require_band_reaches_keys("scatterbrain", nq, nk, w, opts.causal);
  Rng rng(o.seed);
  omega_ = performer_projection<T>(o.features, q.cols(), true, true, rng);
  const MatrixR<T>& omega = omega_;
  const T root = T(std::sqrt(opts.scale));
  xq_ = q * root;
  xk_ = k * root;
  fq_ = performer_features<T>(xq_, omega, PerformerKernel::Positive);
  const RandomFeatures<T> fk = performer_features<T>(xk_, omega, PerformerKernel::Positive);
  // The estimate of exp(s·q_iᵀk_j) is e^{lq_i + lk_j}·(fq_i·fk_j), with fq, fk ∈ (0, 1].
  gk_ = fk.logscale.maxCoeff();
  kscaled_ = (fk.logscale.array() - gk_).exp().matrix().asDiagonal() * fk.f;  // e^{lk − gk}·fk
  const Rounding r = this->rounding_hook();
  r(fq_.f, Held::tensor, "features φ(q), φ(k)");
  r(kscaled_, Held::tensor, "features φ(q), φ(k)");
  VectorX<T> colsum = kscaled_.colwise().sum().transpose();
  r(colsum, Held::accumulator, "key sum Σφ(k)");
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
  r(den_, Held::accumulator, "row sums");
  // (Checked here, not inside the parallel blocks: an exception must not leave an OpenMP region.) Emulated, a row sum
  // that vanished or overflowed in the format is the finding: divided as stored, reported by the output's check.
  require(r.active() || (den_.array() > T(0)).all(), "scatterbrain: a row sum vanished");
  op_.reset();
  return Status::Success;
}

template <typename T>
MatrixR<T> ScatterbrainMethod<T>::do_output(const ConstRef<T>& v) const {
  return output_with(v, this->rounding_hook());
}

template <typename T>
MatrixR<T> ScatterbrainMethod<T>::output_with(const ConstRef<T>& v, const Rounding& rd) const {
  MatrixR<T> ktv = kscaled_.transpose() * v;  // M × d_v
  rd(ktv, Held::accumulator, "key–value state Σφ(k)vᵀ");
  MatrixR<T> out(xq_.rows(), v.cols());
  band_blocks([&](Index i0, Index bi, Index lo, Index bj, const MatrixR<T>& corr) {
    auto o = out.middleRows(i0, bi);
    o.noalias() = fq_.f.middleRows(i0, bi) * ktv;
    for (Index r = 0; r < bi; ++r) o.row(r) *= est_scale(i0 + r);
    o.noalias() += corr * v.middleRows(lo, bj);
    if (rd.rounds(Held::accumulator))
      for (Index r = 0; r < bi; ++r) rd.span(out.row(i0 + r).data(), std::size_t(out.cols()), Held::accumulator,
                                             "numerators");
    for (Index r = 0; r < bi; ++r) o.row(r) /= den_(i0 + r);
  }, nullptr, false, &rd);
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

template <typename T>
Gradients<T> ScatterbrainMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  // Row i of Ã in its units e^{R_i} (a factor of the row, which cancels in P̃ = diag(Ã·1)⁻¹Ã, so R_i is held fixed):
  //   Ã'_ij = F_iᵀκ_j off the band, e^{x_iᵀy_j − R_i} on it,
  //   F_i = e^{lq_i + gk − R_i}·fq_i,  κ_j = e^{lk_j − gk}·fk_j,
  // with F_im = e^{ω_mᵀx_i − ‖x_i‖²/2 − R_i + gk}/√M and κ_jm = e^{ω_mᵀy_j − ‖y_j‖²/2 − gk}/√M (Choromanski et al. 2021
  // Lemma 1; the maxima of the stabilized features cancel, gk between F and κ). The VJP of O = P̃V (Chen et al. 2021
  // §3): dÃ'_ij = B_ij = W̃_iᵀṼ_j with W̃_i = [dO_i, −dO_iᵀO_i]/den_i, Ṽ_j = [v_j, 1].
  const Index nq = xq_.rows(), nk = xk_.rows(), d = xq_.cols(), dv = v.cols(), feats = fq_.f.cols();
  const Index block = kBandBlock;
  // Emulated storage (a no-op natively, so the float32/float64 bits are the derivation's): the tensors this backward
  // materialises stored as its note says — the forward's again untallied (O as Method::output stores it, the state
  // and key sums, the band's logits and corrections), the gradients' own tallied.
  const Rounding rd = this->rounding_hook();
  const Rounding quiet = rd.untallied();
  MatrixR<T> out = output_with(v, quiet);
  quiet(out, Held::tensor, "");
  MatrixR<T> wt(nq, dv + 1), vt(nk, dv + 1);
  wt.leftCols(dv) = den_.cwiseInverse().asDiagonal() * d_out;
  wt.col(dv) = -((d_out.array() * out.array()).rowwise().sum() / den_.array());
  rd(wt, Held::tensor, "∂L/∂numerators, ∂L/∂row sums");
  vt.leftCols(dv) = v;
  vt.col(dv).setOnes();
  MatrixR<T> fr(nq, feats);
  for (Index i = 0; i < nq; ++i) fr.row(i) = fq_.f.row(i) * est_scale(i);
  // The estimate over every key (global sums), the band's share subtracted below: ∂L/∂F = B·κ, ∂L/∂κ = Bᵀ·F,
  // and dV = P̃ᵀdO = κ·(Fᵀ dO/den) + the band's correction.
  MatrixR<T> s = kscaled_.transpose() * vt;  // M × (d_v + 1): the forward's state and key sums
  quiet(s, Held::accumulator, "");
  MatrixR<T> r = fr.transpose() * wt;        // M × (d_v + 1)
  rd(r, Held::accumulator, "backward: the state's gradient");
  MatrixR<T> dfr = wt * s.transpose();
  MatrixR<T> dks = vt * r.transpose();
  rd(dfr, Held::tensor, "backward: ∂L/∂φ(q), ∂L/∂φ(k)");
  rd(dks, Held::tensor, "backward: ∂L/∂φ(q), ∂L/∂φ(k)");
  Gradients<T> g;
  g.dv = kscaled_ * r.leftCols(dv);
  rd(g.dv, Held::tensor, "backward: dQ, dK, dV's parts");
  MatrixR<T> dxq = MatrixR<T>::Zero(nq, d), dxk = MatrixR<T>::Zero(nk, d);
  // Queries, by blocks of 64 (their bands' keys [lo, lo + bj), as band_blocks): the band's B removed from ∂L/∂F, and
  // its exact entries' logit gradients B_ij·Ã'_ij into ∂L/∂x_i.
  const Index qblocks = (nq + block - 1) / block;
#pragma omp parallel
  {
    MatrixR<T> logits, bm;
#pragma omp for schedule(static)
    for (Index b = 0; b < qblocks; ++b) {
      const auto [i0, bi, lo, bj] = band_block(b);
      if (bj <= 0) continue;
      logits.noalias() = xq_.middleRows(i0, bi) * xk_.middleRows(lo, bj).transpose();
      quiet(logits, Held::accumulator, "");  // the forward's band logits
      bm.noalias() = wt.middleRows(i0, bi) * vt.middleRows(lo, bj).transpose();
      rd(bm, Held::tensor, "backward: the band's ∂L/∂Ã");
      for (Index rr = 0; rr < bi; ++rr) {
        const Index i = i0 + rr;
        const auto [first, last] = band_of(i, lo);
        const Index len = std::max<Index>(0, last - first + 1);
        auto lrow = logits.row(rr);
        auto brow = bm.row(rr);
        if (len == 0) {
          lrow.setZero();
          brow.setZero();
          continue;
        }
        lrow.segment(first, len) =
            ((lrow.segment(first, len).array() - ref_(i)).exp() * brow.segment(first, len).array()).matrix();
        lrow.head(first).setZero();
        lrow.tail(bj - last - 1).setZero();
        brow.head(first).setZero();
        brow.tail(bj - last - 1).setZero();
      }
      rd(logits, Held::tensor, "backward: the band's logit gradients");
      dfr.middleRows(i0, bi).noalias() -= bm * kscaled_.middleRows(lo, bj);
      dxq.middleRows(i0, bi).noalias() += logits * xk_.middleRows(lo, bj);
      if (rd.active()) {  // each block's rows of ∂L/∂φ(q) (the band's share removed) and of the band's ∂L/∂x
        rd.span(dfr.row(i0).data(), std::size_t(bi * feats), Held::tensor, "backward: ∂L/∂φ(q), ∂L/∂φ(k)");
        rd.span(dxq.row(i0).data(), std::size_t(bi * d), Held::tensor, "backward: dQ, dK, dV's parts");
      }
    }
  }
  // Keys, by blocks of 64: the queries whose band holds key j are i ∈ [j − off − W, j − off + W]. The band's B
  // removed from ∂L/∂κ, its logit gradients into ∂L/∂y_j, and dV's correction (Ã'_ij − F_iᵀκ_j)·dO_i/den_i.
  const Index kblocks = (nk + block - 1) / block;
#pragma omp parallel
  {
    MatrixR<T> logits, bm, corr;
#pragma omp for schedule(static)
    for (Index b = 0; b < kblocks; ++b) {
      const Index j0 = b * block, bj = std::min(block, nk - j0);
      const Index qa = std::max<Index>(0, j0 - off_ - w_);
      const Index qb = std::min(nq - 1, j0 + bj - 1 - off_ + w_);
      const Index bq = qb - qa + 1;
      if (bq <= 0) continue;
      logits.noalias() = xk_.middleRows(j0, bj) * xq_.middleRows(qa, bq).transpose();
      quiet(logits, Held::accumulator, "");  // the forward's band logits, transposed
      bm.noalias() = vt.middleRows(j0, bj) * wt.middleRows(qa, bq).transpose();
      quiet(bm, Held::tensor, "");  // the band's ∂L/∂Ã again (tallied by the query blocks)
      corr.noalias() = kscaled_.middleRows(j0, bj) * fr.middleRows(qa, bq).transpose();
      for (Index t = 0; t < bj; ++t) {
        const Index j = j0 + t;
        const Index first = std::max<Index>(0, j - off_ - w_) - qa, last = std::min(nq - 1, j - off_ + w_) - qa;
        const Index len = std::max<Index>(0, last - first + 1);
        auto lrow = logits.row(t);
        auto brow = bm.row(t);
        auto crow = corr.row(t);
        if (len == 0) {
          lrow.setZero();
          brow.setZero();
          crow.setZero();
          continue;
        }
        const Eigen::Array<T, 1, Eigen::Dynamic> e =
            (lrow.segment(first, len).array() - ref_.segment(qa + first, len).transpose().array()).exp();
        crow.segment(first, len) = (e - crow.segment(first, len).array()).matrix();
        lrow.segment(first, len) = (e * brow.segment(first, len).array()).matrix();
        for (auto* row : {&lrow, &brow, &crow}) {
          row->head(first).setZero();
          row->tail(bq - last - 1).setZero();
        }
      }
      quiet(corr, Held::tensor, "");   // the forward's band corrections
      quiet(logits, Held::tensor, "");  // the band's logit gradients again
      dks.middleRows(j0, bj).noalias() -= bm * fr.middleRows(qa, bq);
      dxk.middleRows(j0, bj).noalias() += logits * xq_.middleRows(qa, bq);
      g.dv.middleRows(j0, bj).noalias() += corr * wt.middleRows(qa, bq).leftCols(dv);
      if (rd.active()) {
        rd.span(dks.row(j0).data(), std::size_t(bj * feats), Held::tensor, "backward: ∂L/∂φ(q), ∂L/∂φ(k)");
        rd.span(dxk.row(j0).data(), std::size_t(bj * d), Held::tensor, "backward: dQ, dK, dV's parts");
      }
    }
  }
  // Through the features: ∂F_im/∂x_i = F_im(ω_m − x_i), ∂κ_jm/∂y_j = κ_jm(ω_m − y_j); then x = s^½q, y = s^½k.
  const T root = T(std::sqrt(this->options().scale));
  MatrixR<T> pq = dfr.cwiseProduct(fr), pk = dks.cwiseProduct(kscaled_);
  rd(pq, Held::tensor, "backward: ∂L/∂exponents");
  rd(pk, Held::tensor, "backward: ∂L/∂exponents");
  g.dq = pq * omega_;
  g.dq -= VectorX<T>(pq.rowwise().sum()).asDiagonal() * xq_;
  g.dq += dxq;
  g.dq *= root;
  g.dk = pk * omega_;
  g.dk -= VectorX<T>(pk.rowwise().sum()).asDiagonal() * xk_;
  g.dk += dxk;
  g.dk *= root;
  return g;
}

template class ScatterbrainMethod<float>;
template class ScatterbrainMethod<double>;

}  // namespace attnlab
