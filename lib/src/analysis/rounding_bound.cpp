// The softmax attention rounding bound (analysis/rounding_bound.hpp: the derivation is there).
#include "attnlab/analysis/rounding_bound.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {

double SoftmaxRoundingBound::output_norm() const { return output.norm(); }

double SoftmaxRoundingBound::probability(Index i, double p) const { return (ratio(i) - 1) * p + eta; }

SoftmaxRoundingAnalysis::SoftmaxRoundingAnalysis(const ConstRef<double>& q, const ConstRef<double>& k,
                                                 const ConstRef<double>& v, const AttentionOptions& opts) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  require(v.rows() == k.rows(), "softmax rounding bound: V has {} rows, K has {}", v.rows(), k.rows());
  const double lift = std::ldexp(1.0, -14);  // η/u of fp16 (bf16's is 2⁻¹²⁶)
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  n_k = nk;
  d = q.cols();
  scale = opts.resolved_scale(d);
  input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  const MatrixR<double> qb = q.cwiseAbs().array() + lift, kb = k.cwiseAbs().array() + lift;
  const MatrixR<double> vb = v.cwiseAbs().array() + lift;
  qk_max.resize(nq);
  visible.resize(std::size_t(nq));
  vbar_visible_max.resize(nq);
  const VectorX<double> row_max = vb.rowwise().maxCoeff();
  const Index rows = 256;
#pragma omp parallel for schedule(dynamic)
  for (Index r0 = 0; r0 < nq; r0 += rows) {
    const Index len = std::min(rows, nq - r0);
    const MatrixR<double> a = qb.middleRows(r0, len) * kb.transpose();
    for (Index r = 0; r < len; ++r) {
      const Index i = r0 + r, vis = opts.causal ? std::min(nk, i + off + 1) : nk;
      qk_max(i) = a.row(r).head(vis).maxCoeff();
      visible[std::size_t(i)] = vis;
      vbar_visible_max(i) = row_max.head(vis).maxCoeff();
    }
  }
  AttentionOptions native = opts;
  native.storage = Storage::native;
  native.scale = scale;
  o = exact_output<double>(q, k, v, native);
  pv = exact_output<double>(q, k, vb, native);  // P·V̄
  vbar_col_max = vb.colwise().maxCoeff();
}

SoftmaxRoundingBound SoftmaxRoundingAnalysis::bound(const AttentionOptions& opts, bool streaming, Index tile) const {
  require(opts.storage != Storage::native, "softmax rounding bound: give a reduced storage (bf16 or fp16)");
  require(tile >= 1, "softmax rounding bound: tile = {}", tile);
  const bool fp16 = opts.storage == Storage::fp16;
  const bool eager = opts.policy == Policy::eager;
  SoftmaxRoundingBound b;
  b.u = std::ldexp(1.0, fp16 ? -11 : -8);
  b.eta = std::ldexp(1.0, fp16 ? -25 : -134);
  const double u = b.u, eta = b.eta, u32 = std::ldexp(1.0, -24);
  const double big = fp16 ? 65504.0 : 3.3895313892515355e38;  // the largest finite value
  const auto gamma = [&](double m) { return m * u32 / (1 - m * u32); };
  const Index nq = o.rows(), nk = n_k;
  const Index tiles = streaming ? (nk + tile - 1) / tile : 0;
  const Index te = streaming && eager ? tiles : 0;  // tiles whose running sums and accumulator are stored
  const double s = scale;
  const double e_logit = std::pow(1 + u, 2 + 2 * (eager ? 1 : 0)) * (1 + gamma(double(d))) * (1 + u32) - 1;
  const double g = gamma(double(nk + 8 + 4 * tiles)), gn = gamma(double(nk));
  const double inf = std::numeric_limits<double>::infinity();
  b.logit.resize(nq);
  b.ratio.resize(nq);
  for (Index i = 0; i < nq; ++i) {
    const double zmax = s * qk_max(i) * (1 + e_logit);  // |ẑ_ij| ≤ s·q̄ᵀk̄·(1 + e)
    const double di = s * qk_max(i) * e_logit + 2 * u32 * zmax;
    const double vis = double(visible[std::size_t(i)]);
    b.logit(i) = di;
    // Eager stores QKᵀ before the scale, then s·QKᵀ: either may pass the format's largest value.
    const bool overflow = input_max >= big || (eager && std::max(1.0, 1.0 / s) * zmax >= big) ||
                          (te > 0 && (vis * (1 + g) >= big || vis * (1 + g) * vbar_visible_max(i) >= big));
    b.ratio(i) = overflow ? inf : std::exp(2 * di) * std::pow(1 + u, double(2 + 2 * te)) * (1 + g) * (1 + g);
  }
  b.output.resize(nq, o.cols());
  for (Index i = 0; i < nq; ++i) {
    const double ri = b.ratio(i);
    for (Index c = 0; c < o.cols(); ++c) {
      const double e = std::isinf(ri) ? inf
                                      : (ri * (1 + u) * (1 + gn) - 1) * pv(i, c) +
                                            double(nk) * eta * (1 + u) * vbar_col_max(c);
      b.output(i, c) = (1 + u) * e + u * std::abs(o(i, c)) + eta;
    }
  }
  return b;
}

SoftmaxRoundingBound softmax_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                            const ConstRef<double>& v, const AttentionOptions& opts, bool streaming,
                                            Index tile) {
  return SoftmaxRoundingAnalysis(q, k, v, opts).bound(opts, streaming, tile);
}

}  // namespace attnlab
