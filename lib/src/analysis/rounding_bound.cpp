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

SoftmaxRoundingBound softmax_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                            const ConstRef<double>& v, const AttentionOptions& opts, bool streaming,
                                            Index tile) {
  require(opts.storage != Storage::native, "softmax_rounding_bound: give a reduced storage (bf16 or fp16)");
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  require(v.rows() == k.rows(), "softmax_rounding_bound: V has {} rows, K has {}", v.rows(), k.rows());
  require(tile >= 1, "softmax_rounding_bound: tile = {}", tile);
  const bool fp16 = opts.storage == Storage::fp16;
  const bool eager = opts.policy == Policy::eager;
  SoftmaxRoundingBound b;
  b.u = std::ldexp(1.0, fp16 ? -11 : -8);
  b.eta = std::ldexp(1.0, fp16 ? -25 : -134);
  const double u = b.u, eta = b.eta, u32 = std::ldexp(1.0, -24);
  const double big = fp16 ? 65504.0 : 3.3895313892515355e38;  // the largest finite value
  const auto gamma = [&](double m) { return m * u32 / (1 - m * u32); };
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), off = nk - nq;
  const Index tiles = streaming ? (nk + tile - 1) / tile : 0;
  const Index te = streaming && eager ? tiles : 0;  // tiles whose running sums and accumulator are stored
  const double s = opts.resolved_scale(d);
  const double e_logit = std::pow(1 + u, 2 + 2 * (eager ? 1 : 0)) * (1 + gamma(double(d))) * (1 + u32) - 1;
  const double g = gamma(double(nk + 8 + 4 * tiles));
  const double inf = std::numeric_limits<double>::infinity();

  const MatrixR<double> qb = q.cwiseAbs().array() + eta / u, kb = k.cwiseAbs().array() + eta / u;
  const MatrixR<double> vb = v.cwiseAbs().array() + eta / u;
  const bool inputs_fit = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()}) < big;
  b.logit.resize(nq);
  b.ratio.resize(nq);
  // D_i from the products |Q̄|·|K̄|ᵀ over the visible keys, in blocks of queries.
  const Index rows = 256;
#pragma omp parallel for schedule(dynamic)
  for (Index r0 = 0; r0 < nq; r0 += rows) {
    const Index len = std::min(rows, nq - r0);
    const MatrixR<double> a = qb.middleRows(r0, len) * kb.transpose();
    for (Index r = 0; r < len; ++r) {
      const Index i = r0 + r, visible = opts.causal ? std::min(nk, i + off + 1) : nk;
      const double amax = a.row(r).head(visible).maxCoeff();
      const double zmax = s * amax * (1 + e_logit);  // |ẑ_ij| ≤ s·q̄ᵀk̄·(1 + e)
      const double di = s * amax * e_logit + 2 * u32 * zmax;
      b.logit(i) = di;
      const bool overflow = !inputs_fit || (eager && zmax >= big) ||
                            (te > 0 && (double(visible) * (1 + g) >= big ||
                                        double(visible) * (1 + g) * vb.topRows(visible).maxCoeff() >= big));
      b.ratio(i) = overflow ? inf : std::exp(2 * di) * std::pow(1 + u, double(2 + 2 * te)) * (1 + g) * (1 + g);
    }
  }
  AttentionOptions native = opts;
  native.storage = Storage::native;
  native.scale = s;
  const MatrixR<double> o = exact_output<double>(q, k, v, native);
  const MatrixR<double> pv = exact_output<double>(q, k, vb, native);  // P·V̄
  const Eigen::Matrix<double, 1, Eigen::Dynamic> vmax = vb.colwise().maxCoeff();
  const double gn = gamma(double(nk));
  b.output.resize(nq, v.cols());
  for (Index i = 0; i < nq; ++i) {
    const double ri = b.ratio(i);
    for (Index c = 0; c < v.cols(); ++c) {
      const double e = std::isinf(ri) ? inf
                                      : (ri * (1 + u) * (1 + gn) - 1) * pv(i, c) +
                                            double(nk) * eta * (1 + u) * vmax(c);
      b.output(i, c) = (1 + u) * e + u * std::abs(o(i, c)) + eta;
    }
  }
  return b;
}

}  // namespace attnlab
