// `scatterbrain` — sparse + low-rank attention (Chen et al. 2021, "Scatterbrain", §3 and Algorithm 1): the
// unnormalized attention exp(s·QKᵀ) is estimated by the Performer term φ(Q)φ(K)ᵀ plus a sparse correction S that,
// on a support (here the band |j − c_i| ≤ W), replaces the estimate by the exact value:
//   Ã = φ(Q)φ(K)ᵀ + S,  S_ij = exp(s·q_iᵀk_j) − φ(q_i)ᵀφ(k_j) on the support, 0 elsewhere;
//   P̃ = diag(Ã·1)⁻¹·Ã.
// So Ã is exact on the support and has the Performer's rank-M estimate elsewhere; normalization by Ã's row sums
// (not the exact ones) makes P̃ = P on the support only when the support covers the row. Positive features keep
// every row sum positive. Each row is computed in units of e^{R_i}, R_i = max(the row's largest exact logit on the
// support, the log-scale of its largest estimated entry), so nothing overflows. Non-causal.
#include "attnlab/error.hpp"
#include "attnlab/methods/descriptors.hpp"
#include "attnlab/performer.hpp"
#include "pattern_method.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace attnlab {
namespace {

/// P̃ = D⁻¹(A·Btᵀ + S): a rank-M part and a sparse correction, rows scaled by 1/D.
template <typename T>
class SparseLowRankOperator final : public AttentionOperator<T> {
 public:
  using Sparse = typename SparseOperator<T>::Sparse;
  SparseLowRankOperator(MatrixR<T> a, MatrixR<T> bt, Sparse s) : a_(std::move(a)), bt_(std::move(bt)), s_(std::move(s)) {}
  Index rows() const override { return a_.rows(); }
  Index cols() const override { return bt_.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override {
    MatrixR<T> y = a_ * (bt_.transpose() * x);
    y += s_ * x;
    return y;
  }
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override {
    MatrixR<T> y = bt_ * (a_.transpose() * x);
    y += s_.transpose() * x;
    return y;
  }
  MatrixR<T> row_block(Index first, Index count) const override {
    MatrixR<T> y = a_.middleRows(first, count) * bt_.transpose();
    y += MatrixR<T>(s_.middleRows(first, count));
    return y;
  }
  /// The rank-limited part (rows already normalized).
  const MatrixR<T>& left() const { return a_; }
  const MatrixR<T>& right() const { return bt_; }

 private:
  MatrixR<T> a_, bt_;
  Sparse s_;
};

template <typename T>
class ScatterbrainMethod final : public Method<T> {
 public:
  using Method<T>::Method;
  Index rank_bound() const override { return -1; }  // rank-M plus a sparse part: not rank-limited

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    const Index nq = q.rows(), nk = k.rows(), off = nk - nq, w = Index(this->params().integer("window"));
    Rng rng(std::uint64_t(this->params().integer("seed")));
    const MatrixR<T> omega = performer_projection<T>(Index(this->params().integer("features")), q.cols(), true, true, rng);
    const T root = T(std::sqrt(opts.scale));
    const MatrixR<T> xq = q * root, xk = k * root;
    const RandomFeatures<T> fq = performer_features<T>(xq, omega, PerformerKernel::Positive);
    const RandomFeatures<T> fk = performer_features<T>(xk, omega, PerformerKernel::Positive);
    // The estimate of exp(s·q_iᵀk_j) is e^{lq_i + lk_j}·(fq_i·fk_j), with fq, fk ∈ (0, 1].
    const T gk = fk.logscale.maxCoeff();
    const MatrixR<T> kscaled = (fk.logscale.array() - gk).exp().matrix().asDiagonal() * fk.f;  // e^{lk − gk}·fk
    std::vector<Eigen::Triplet<T, Index>> trips;
    VectorX<T> ref(nq), den(nq);
    const VectorX<T> colsum = kscaled.colwise().sum().transpose();
    for (Index i = 0; i < nq; ++i) {
      const Index c = i + off, lo = std::max<Index>(0, c - w), hi = std::min(nk - 1, c + w);
      const VectorX<T> logits = (xk.middleRows(lo, hi - lo + 1) * xq.row(i).transpose());
      const T base = fq.logscale(i) + gk;  // log-scale of the estimated entries of this row
      ref(i) = std::max(base, logits.maxCoeff());
      const T est_scale = std::exp(base - ref(i));
      // Row sum of Ã in units of e^{ref}: the estimate over all keys, corrected on the support.
      T sum = est_scale * fq.f.row(i).dot(colsum);
      for (Index j = lo; j <= hi; ++j) {
        const T est = est_scale * fq.f.row(i).dot(kscaled.row(j));
        const T exact = std::exp(logits(j - lo) - ref(i));
        trips.emplace_back(i, j, exact - est);
        sum += exact - est;
      }
      require(sum > 0, "scatterbrain: a row sum vanished");
      den(i) = sum;
    }
    typename SparseOperator<T>::Sparse s(nq, nk);
    s.setFromTriplets(trips.begin(), trips.end());
    const VectorX<T> inv = den.cwiseInverse();
    s = inv.asDiagonal() * s;
    VectorX<T> arow(nq);
    for (Index i = 0; i < nq; ++i) arow(i) = std::exp(fq.logscale(i) + gk - ref(i)) * inv(i);
    MatrixR<T> a = arow.asDiagonal() * fq.f;
    op_.emplace(std::move(a), kscaled, std::move(s));
    return Status::Success;
  }
  const AttentionOperator<T>& do_op() const override { return *op_; }

 private:
  std::optional<SparseLowRankOperator<T>> op_;
};

}  // namespace

MethodDescriptor scatterbrain_descriptor() {
  MethodDescriptor d;
  d.name = "scatterbrain";
  d.summary = "Scatterbrain: Performer low-rank estimate + exact entries on a band, normalized (non-causal)";
  d.reference = "Chen et al. 2021 (Scatterbrain) §3, Algorithm 1";
  d.causal = false;
  d.params = {ParamSpec::integer("features", 64, 1, 1 << 16, "Performer features M (positive, orthogonal)"),
              ParamSpec::integer("window", 16, 0, 1 << 24, "half-width of the band where entries are exact"),
              ParamSpec::seed()};
  set_factories<ScatterbrainMethod>(d);
  return d;
}

}  // namespace attnlab
