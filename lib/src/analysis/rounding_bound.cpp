// The softmax attention rounding bound (analysis/rounding_bound.hpp: the derivation is there).
#include "attnlab/analysis/rounding_bound.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/formats.hpp"
#include "attnlab/components/dense_svd.hpp"
#include "attnlab/components/landmarks.hpp"
#include "attnlab/components/random_features.hpp"
#include "attnlab/methods/linear.hpp"
#include "attnlab/methods/vq.hpp"
#include "attnlab/operators/exact.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {
namespace {

/// x̄ = |x| + η/u, so that |fl(x) − x| ≤ u·x̄, with fp16's η/u = 2⁻¹⁴ (bf16's is 2⁻¹²⁶): one x̄ for both formats.
MatrixR<double> lifted(const ConstRef<double>& x) { return (x.cwiseAbs().array() + std::ldexp(1.0, -14)).matrix(); }

// float32's unit roundoff, its absolute error per product in the subnormal range (half its smallest subnormal,
// 2⁻¹⁵⁰, taken as 2⁻¹⁴⁹), its smallest normal value (also the floor of an exp that underflows) and its largest.
constexpr double kU32 = 0x1p-24, kEta32 = 0x1p-149, kMin32 = 0x1p-126;
const double kMax32 = double(std::numeric_limits<float>::max());

/// An exp's absolute error once stored in the format (unit roundoff u, half its smallest subnormal η): float32's
/// floor 2⁻¹²⁶ (an underflowing exp, and Eigen's vectorised exp, which clamps its argument at −88.72: e^{−100} comes
/// out about 2.9e-39), carried through the storing, plus the storing's own η.
double stored_exp_floor(double u, double eta) { return kMin32 * (1 + u) + eta; }

/// γ_m = m·u₃₂/(1 − m·u₃₂): a sum or product of m float32 roundings, in any order (Higham 2002 §3.1).
double gamma32(double m) { return m * kU32 / (1 - m * kU32); }

/// A logit s·(aᵀb) over d products formed in float32, times the scale as float32 holds it, stored after the product
/// and after the scale under eager: its relative error (1+γ_d)(1+u)^{2e}(1+u₃₂)² − 1 on s·|a|ᵀ|b|.
double scaled_logit_error(Index d, double u, bool eager) {
  return (1 + gamma32(double(d))) * std::pow(1 + u, eager ? 2 : 0) * (1 + kU32) * (1 + kU32) - 1;
}

/// Inputs given in float64 as the emulation stores them: float32 first (what the float32 method was given), then the
/// format (round_to: known exactly).
MatrixR<double> stored_in(Format format, const ConstRef<double>& x) {
  return x.unaryExpr([&](double y) { return round_to(format, double(float(y))); });
}

/// A kernel bound's entry past the division (the header's "output"): |N̂/D̂ − N/D| ≤ (E_N + |O|·E_D)/(D − E_D), the
/// division's or the reciprocal and product's float32 roundings (div), then O stored in the format.
double divided_entry(double en, double ed, double o_abs, double d_ref, double div, double u, double eta) {
  const double y = (en + o_abs * ed) / (d_ref - ed);
  return y * div * (1 + u) + o_abs * (div * (1 + u) - 1) + eta;
}

/// A product Â·B̂ of bounded factors summed in float32 over `depth`: the product rule |ÂB̂ − AB| ≤ ΔA·|B̂| + |A|·ΔB
/// plus the sums' γ_depth·|Â||B̂| (`au`, `bu` bound |Â|, |B̂|), their underflows ((depth + 2)·η₃₂) and `slack`·|A||B|
/// for the float64 reference's own rounding. `aa`, `ba`: |A|, |B|.
MatrixR<double> product_error(const MatrixR<double>& aa, const MatrixR<double>& da, const MatrixR<double>& au,
                              const MatrixR<double>& ba, const MatrixR<double>& db, const MatrixR<double>& bu,
                              Index depth, double slack) {
  MatrixR<double> e = da * bu + aa * db + gamma32(double(depth)) * (au * bu);
  e.array() += double(depth + 2) * kEta32 + slack * (aa * ba).array();
  return e;
}

/// An error bound `e` on a value `x` once x̂ is stored in the format: + u·(|x| + e) + η.
MatrixR<double> stored_error(const MatrixR<double>& e, const MatrixR<double>& x, double u, double eta) {
  return (e.array() + u * (x.cwiseAbs() + e).array() + eta).matrix();
}

/// The rows of b.output without a guarantee set to +inf and counted: those `none(i)` names, and those whose bound is
/// not finite or whose stored O may reach the format's largest value `big`.
template <typename None>
void give_up_rows(KernelRoundingBound& b, double big, double u, None none) {
  for (Index i = 0; i < b.output.rows(); ++i)
    if (none(i) || !b.output.row(i).allFinite() ||
        (b.reference.row(i).cwiseAbs() + b.output.row(i)).maxCoeff() >= big / (1 + u)) {
      b.output.row(i).setConstant(std::numeric_limits<double>::infinity());
      ++b.rows_without_guarantee;
    }
}

}  // namespace

double SoftmaxRoundingBound::output_norm() const { return output.norm(); }

double SoftmaxRoundingBound::probability(Index i, double p) const { return (ratio(i) - 1) * p + p_abs; }

SoftmaxRoundingAnalysis::SoftmaxRoundingAnalysis(const ConstRef<double>& q, const ConstRef<double>& k,
                                                 const ConstRef<double>& v, const AttentionOptions& opts) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  require(v.rows() == k.rows(), "softmax rounding bound: V has {} rows, K has {}", v.rows(), k.rows());
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  n_k = nk;
  d = q.cols();
  scale = opts.resolved_scale(d);
  input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  const MatrixR<double> qb = lifted(q), kb = lifted(k), vb = lifted(v);
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

SoftmaxRoundingAnalysis::SoftmaxRoundingAnalysis(const ConstRef<double>& q, const ConstRef<double>& k,
                                                 const ConstRef<double>& v,
                                                 const std::vector<std::vector<Index>>& pattern, double scale_in) {
  const Index nq = q.rows(), nk = k.rows();
  require(q.cols() == k.cols() && v.rows() == nk && Index(pattern.size()) == nq,
          "softmax rounding bound: Q {}×{}, K {}×{}, V {} rows, a pattern of {} rows", nq, q.cols(), nk, k.cols(),
          v.rows(), pattern.size());
  require(scale_in > 0, "softmax rounding bound: scale = {}", scale_in);
  over_pattern = true;
  d = q.cols();
  scale = scale_in;
  input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  const MatrixR<double> qb = lifted(q), kb = lifted(k), vb = lifted(v);
  qk_max.resize(nq);
  visible.resize(std::size_t(nq));
  vbar_visible_max.resize(nq);
  o = MatrixR<double>::Zero(nq, v.cols());
  pv = MatrixR<double>::Zero(nq, v.cols());
  n_k = 0;
  for (Index i = 0; i < nq; ++i) {
    const auto& row = pattern[std::size_t(i)];
    require(!row.empty(), "softmax rounding bound: row {} of the pattern is empty", i);
    for (const Index j : row) require(j >= 0 && j < nk, "softmax rounding bound: key {} out of range", j);
    n_k = std::max(n_k, Index(row.size()));
    visible[std::size_t(i)] = Index(row.size());
  }
#pragma omp parallel for schedule(dynamic, 64)
  for (Index i = 0; i < nq; ++i) {  // rows apart
    const auto& row = pattern[std::size_t(i)];
    std::vector<double> z(row.size());
    double mx = -std::numeric_limits<double>::infinity(), qk = 0, vm = 0;
    for (std::size_t t = 0; t < row.size(); ++t) {
      z[t] = scale * q.row(i).dot(k.row(row[t]));
      mx = std::max(mx, z[t]);
      qk = std::max(qk, qb.row(i).dot(kb.row(row[t])));
      vm = std::max(vm, vb.row(row[t]).maxCoeff());
    }
    double sum = 0;
    for (double& x : z) sum += x = std::exp(x - mx);
    for (std::size_t t = 0; t < row.size(); ++t) {
      o.row(i) += (z[t] / sum) * v.row(row[t]);
      pv.row(i) += (z[t] / sum) * vb.row(row[t]);
    }
    qk_max(i) = qk;
    vbar_visible_max(i) = vm;
  }
  vbar_col_max = vb.colwise().maxCoeff();
}

SoftmaxRoundingBound SoftmaxRoundingAnalysis::bound(const AttentionOptions& opts, bool streaming, Index tile) const {
  require(!(over_pattern && streaming),
          "softmax rounding bound: a pattern's softmax is materialised (streaming = false)");
  require(tile >= 1, "softmax rounding bound: tile = {}", tile);
  return bound_in_pieces(opts, streaming ? (n_k + tile - 1) / tile : 0);
}

SoftmaxRoundingBound SoftmaxRoundingAnalysis::bound_in_pieces(const AttentionOptions& opts, Index pieces) const {
  require(opts.storage != Storage::native, "softmax rounding bound: give a reduced storage (bf16 or fp16)");
  require(pieces >= 0, "softmax rounding bound: pieces = {}", pieces);
  const bool streaming = pieces > 0;
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  SoftmaxRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32;
  const double big = largest_finite(format), max32 = kMax32;
  const Index nq = o.rows(), nk = n_k;
  const Index tiles = pieces;
  const Index te = streaming && eager ? tiles : 0;  // tiles whose running sums and accumulator are stored
  const double s = scale;
  // The scaling multiplies by the scale as float32 holds it: two u₃₂ (its rounding and the product's).
  const double e_logit =
      std::pow(1 + u, 2 + 2 * (eager ? 1 : 0)) * (1 + gamma32(double(d))) * (1 + u32) * (1 + u32) - 1;
  const double g = gamma32(double(nk + 8 + 4 * tiles)), gn = gamma32(double(nk));
  const double inf = std::numeric_limits<double>::infinity();
  b.logit.resize(nq);
  b.ratio.resize(nq);
  for (Index i = 0; i < nq; ++i) {
    const double zmax = s * qk_max(i) * (1 + e_logit);  // |ẑ_ij| ≤ s·q̄ᵀk̄·(1 + e)
    const double di = s * qk_max(i) * e_logit + 2 * u32 * zmax;
    const double vis = double(visible[std::size_t(i)]);
    b.logit(i) = di;
    // The streaming accumulator Σ e^{z − m}v is unnormalised (up to the visible count times max|v|), and P·V's
    // partial sums reach R·max|v|: in float32 under careful (and under eager between its storings) either may pass
    // float32's largest value.
    const double acc_max = streaming ? vis * (1 + g) * vbar_visible_max(i)
                                     : std::exp(2 * di) * (1 + u) * (1 + u) * (1 + g) * (1 + g) * (1 + gn) *
                                           vbar_visible_max(i);
    // Eager stores QKᵀ before the scale, then s·QKᵀ: either may pass the format's largest value; under both policies
    // the float32 product (Eigen takes the scale out of (s·Q)·Kᵀ: q·k formed first) may pass float32's.
    const bool overflow = input_max >= big || std::max(1.0, 1.0 / s) * zmax >= (eager ? big : max32) ||
                          (te > 0 && (vis * (1 + g) >= big || vis * (1 + g) * vbar_visible_max(i) >= big)) ||
                          !(acc_max < max32);
    b.ratio(i) = overflow ? inf : std::exp(2 * di) * std::pow(1 + u, double(2 + 2 * te)) * (1 + g) * (1 + g);
  }
  b.p_abs = stored_exp_floor(u, eta);  // each probability's absolute error
  b.output.resize(nq, o.cols());
  for (Index i = 0; i < nq; ++i) {
    const double ri = b.ratio(i);
    for (Index c = 0; c < o.cols(); ++c) {
      const double e = std::isinf(ri) ? inf
                                      : (ri * (1 + u) * (1 + gn) - 1) * pv(i, c) +
                                            double(nk) * b.p_abs * (1 + u) * vbar_col_max(c);
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

SoftmaxRoundingBound linformer_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                              const ConstRef<double>& v, const ConstRef<double>& e,
                                              const ConstRef<double>& f, const ConstRef<double>& e32,
                                              const ConstRef<double>& f32, const AttentionOptions& opts) {
  const Index n = k.rows(), kk = e.rows(), nq = q.rows();
  require(q.cols() == k.cols() && v.rows() == n && e.cols() == n && f.cols() == n && f.rows() == kk &&
              e32.rows() == kk && e32.cols() == n && f32.rows() == kk && f32.cols() == n && kk >= 1,
          "linformer rounding bound: Q {}×{}, K {}×{}, V {} rows, E {}×{}, F {}×{}", nq, q.cols(), n, k.cols(),
          v.rows(), kk, e.cols(), f.rows(), f.cols());
  require(opts.storage != Storage::native, "linformer rounding bound: give a reduced storage (bf16 or fp16)");
  require(!opts.causal, "linformer rounding bound: Linformer is non-causal");
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  SoftmaxRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32, eta32 = kEta32;
  const double big = largest_finite(format), inf = std::numeric_limits<double>::infinity();
  const double s = opts.resolved_scale(q.cols()), gn = gamma32(double(n));
  // The projected keys and values as formed and stored, against the float64 method's: the header's ΔK', ΔV' (plus
  // 2n·2⁻⁵³ of the magnitudes for float64's own rounding of the two products formed here).
  double partial_max = 0;  // the float32 sums' partial sums reach at most Σ|Ê||K̂| (Σ|F̂||V̂|)
  const auto projected = [&](const ConstRef<double>& p64, const ConstRef<double>& p32, const ConstRef<double>& x,
                             MatrixR<double>& ref, MatrixR<double>& delta) {
    const MatrixR<double> ps = stored_in(format, p32), xs = stored_in(format, x);
    const MatrixR<double> formed = ps * xs, mag = ps.cwiseAbs() * xs.cwiseAbs();
    partial_max = std::max(partial_max, (1 + gn) * mag.maxCoeff());
    ref = p64 * x;
    const MatrixR<double> sum_err = (gn * mag).array() + double(n) * eta32;
    delta = (formed - ref).cwiseAbs() + sum_err + u * (formed.cwiseAbs() + sum_err) +
            MatrixR<double>::Constant(ref.rows(), ref.cols(), eta) +
            2 * double(n + 2) * std::ldexp(1.0, -53) * (mag + p64.cwiseAbs() * x.cwiseAbs());
  };
  MatrixR<double> ek, dk, fv, dv;
  projected(e, e32, k, ek, dk);
  projected(f, f32, v, fv, dv);
  const MatrixR<double> qs = stored_in(format, q), dq = (qs - q).cwiseAbs(), qa = q.cwiseAbs();
  const MatrixR<double> kup = ek.cwiseAbs() + dk, vup = fv.cwiseAbs() + dv;
  // Per query the largest A_ij and input-error term over the k projected keys.
  const MatrixR<double> a = qs.cwiseAbs() * kup.transpose(), c = dq * kup.transpose() + qa * dk.transpose();
  const double e_z = scaled_logit_error(q.cols(), u, eager);
  const double g = gamma32(double(kk + 8)), gk = gamma32(double(kk));
  const bool stored_overflow = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff(),
                                         e32.cwiseAbs().maxCoeff(), f32.cwiseAbs().maxCoeff(), kup.maxCoeff(),
                                         vup.maxCoeff()}) >= big / (1 + u) ||
                              partial_max >= kMax32;
  AttentionOptions native;
  native.scale = s;
  const MatrixR<double> o = exact_output<double>(q, ek, fv, native);
  const MatrixR<double> pv = exact_output<double>(q, ek, MatrixR<double>(fv.cwiseAbs()), native);
  const MatrixR<double> pd = exact_output<double>(q, ek, dv, native);
  const Eigen::Matrix<double, 1, Eigen::Dynamic> vcol = vup.colwise().maxCoeff();
  b.logit.resize(nq);
  b.ratio.resize(nq);
  b.output.resize(nq, fv.cols());
  b.p_abs = stored_exp_floor(u, eta);  // each probability's absolute error
  for (Index i = 0; i < nq; ++i) {
    const double amax = a.row(i).maxCoeff(), zmax = s * amax * (1 + e_z);
    const double di = s * c.row(i).maxCoeff() + s * e_z * amax + 2 * u32 * zmax;
    b.logit(i) = di;
    const double r0 = std::exp(2 * di) * (1 + u) * (1 + u) * (1 + g) * (1 + g);
    // e^{2D} beyond double's range is no guarantee either (and inf·0 would make the bound NaN).
    const bool overflow = stored_overflow || std::max(1.0, 1.0 / s) * zmax >= (eager ? big : kMax32) ||
                          !std::isfinite(r0);
    const double r = overflow ? inf : r0;
    b.ratio(i) = r;
    for (Index col = 0; col < fv.cols(); ++col) {
      const double err = overflow ? inf
                                  : (r * (1 + gk) - 1) * pv(i, col) + r * (1 + gk) * pd(i, col) +
                                        double(kk) * b.p_abs * (1 + gk) * vcol(col);
      b.output(i, col) = (1 + u) * err + u * std::abs(o(i, col)) + eta;
    }
  }
  return b;
}

namespace {

/// The kernel methods' shared part of the bound (the header's "sums" and "output"), given per query and key the
/// exact features' magnitudes |φ|, |ψ| (fq, fk) and upper envelopes Φ⁺ ≥ |φ| + |φ̂ − φ|, Ψ⁺ likewise (the stored
/// features, any weights folded in), the inputs' largest magnitude and the number of terms each key sum adds (n_sum).
/// Signed features (taylor's) also give the features themselves (fq_signed, fk_signed: the normaliser and O come from
/// them, the error terms from the magnitudes: |φ̂ψ̂ − φψ| ≤ Φ⁺Ψ⁺ − |φ||ψ|), and then careful's guarded reciprocal
/// clamps where |D̂| < max(2⁻²³·Σ|φ̂||ψ̂|, 2⁻¹²⁶): no guarantee there either.
KernelRoundingBound kernel_bound(const MatrixR<double>& fq, const MatrixR<double>& fqu, const MatrixR<double>& fk,
                                 const MatrixR<double>& fku, const ConstRef<double>& v, double input_max, Index n_sum,
                                 const AttentionOptions& opts, const MatrixR<double>* fq_signed = nullptr,
                                 const MatrixR<double>* fk_signed = nullptr) {
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32;
  const double big = largest_finite(format);
  const double max32 = kMax32, min32 = kMin32;
  const double eta32 = kEta32;
  const double inf = std::numeric_limits<double>::infinity();
  const Index nq = fq.rows(), nk = n_sum, m = fq.cols(), dv = v.cols();
  const MatrixR<double> va = v.cwiseAbs(), vau = (va.array() * (1 + u) + eta).matrix();
  const double e = eager ? 1 : 0;
  const double rho_s = (1 + gamma32(double(nk + 2))) * std::pow(1 + u, e);  // a stored S or z entry's envelope factor
  const double rho = rho_s * (1 + gamma32(double(m + 1))) * std::pow(1 + u, e);
  const MatrixR<double> s_up = fku.transpose() * vau;  // Ψ⁺ᵀ|V|⁺ (M × d_v)
  const VectorX<double> z_up = fku.colwise().sum().transpose();
  const MatrixR<double> n_up = fqu * s_up, n_ref = fq * (fk.transpose() * va);
  const MatrixR<double>& sq = fq_signed ? *fq_signed : fq;
  const MatrixR<double>& sk = fk_signed ? *fk_signed : fk;
  const VectorX<double> d_up = fqu * z_up, d_ref = sq * VectorX<double>(sk.colwise().sum().transpose());
  // Σ|φ||ψ|: the error terms' reference (d_ref itself for non-negative features).
  const VectorX<double> d_abs =
      fq_signed ? VectorX<double>(fq * VectorX<double>(fk.colwise().sum().transpose())) : d_ref;
  const MatrixR<double> o = (sq * (sk.transpose() * v)).array().colwise() / d_ref.array();
  // With signed features: |Σ φ̂ψ̂| ≤ Σ Φ⁺Ψ⁺ bounds the guarded reciprocal's magnitude.
  const double eps32 = std::ldexp(1.0, -23);
  b.reference = o;
  const VectorX<double> fq_sum = fqu.rowwise().sum();
  // The sums S, z, N, D: in the format under eager (its largest value), float32 under careful (float32's).
  const double limit = eager ? big : max32;
  const bool global_overflow =
      input_max >= big ||
      std::max(fqu.maxCoeff(), fku.maxCoeff()) >= big || rho_s * s_up.maxCoeff() >= limit ||
      rho_s * z_up.maxCoeff() >= limit;
  const double extra = e * eta * ((1 + gamma32(double(m + 1))) * (1 + u));
  const double div = std::pow(1 + u32, eager ? 1 : 2);
  b.output.resize(nq, dv);
  for (Index i = 0; i < nq; ++i) {
    // Absolute terms: the stored S (or z) and N (or D) underflowing (eager: η), every float32 product underflowing
    // (η₃₂ per product of S's and N's sums), and float64's own rounding of these envelopes (1e-15 of them).
    const double absolute = extra * fq_sum(i) + e * eta + double(nk + m + 4) * eta32 * (1 + 2 * fq_sum(i));
    const double ed = rho * d_up(i) - d_abs(i) + absolute + 1e-15 * rho * d_up(i);
    // Careful takes the normaliser's float32 reciprocal guarded (safe_inverse): a D̂ below float32's smallest
    // normal value is clamped there, so no guarantee either.
    const double clamp = eager ? 0.0 : fq_signed ? std::max(eps32 * rho * d_up(i), 2 * min32) : 2 * min32;
    const bool none = global_overflow || rho * d_up(i) >= limit || rho * n_up.row(i).maxCoeff() >= limit ||
                      !(d_ref(i) - ed > clamp);
    b.rows_without_guarantee += none;
    for (Index c = 0; c < dv; ++c) {
      if (none) {
        b.output(i, c) = inf;
        continue;
      }
      const double en = rho * n_up(i, c) - n_ref(i, c) + absolute + 1e-15 * rho * n_up(i, c);
      b.output(i, c) = divided_entry(en, ed, std::abs(o(i, c)), d_ref(i), div, u, eta);
    }
    // O is stored in the format: a row whose entries may reach its largest value has no guarantee.
    if (!none && (o.row(i).cwiseAbs() + b.output.row(i)).maxCoeff() >= big / (1 + u)) {
      b.output.row(i).setConstant(inf);
      ++b.rows_without_guarantee;
    }
  }
  return b;
}

/// kernel_bound's causal form, as emulated_causal_kernel_output computes it (operators/kernel.cpp): queries in chunks
/// of `chunk`, each seeing the state S, z of every earlier key (absorbed chunk by chunk: S += ΨᵀV in float32, stored
/// after every absorb under eager) and its own chunk's keys through the scores A = φ̂ψ̂ᵀ, masked and stored (a tensor:
/// both policies); num = A·V_c + φ̂·S and den = A·1 + φ̂·z in float32 (stored under eager); the division as above.
/// Every term φ_mψ_m v of query i's numerator passes at most ρ_i = (1+u)^e·(1+γ_{len+M})·max[(1+γ_M)(1+u),
/// ((1+γ_{L+1})(1+u)^e)^{a_i}] (a_i absorbs before its chunk, L the longest absorbed block); absolute terms: η per
/// stored score, a_i·η per stored state entry (eager), η per stored numerator and normaliser (eager), float32's
/// underflowing products. The envelopes' prefix sums are formed key by key (O(n·M·d_v)).
/// `rescales`: float32 multiplications of the state after it is formed (careful Performer's running maximum; their
/// relative rounding is the caller's, in Ψ⁺), each of which may underflow an entry by η₃₂.
KernelRoundingBound causal_kernel_bound(const MatrixR<double>& fq, const MatrixR<double>& fqu,
                                        const MatrixR<double>& fk, const MatrixR<double>& fku,
                                        const ConstRef<double>& v, double input_max, Index chunk,
                                        const AttentionOptions& opts,
                                        const MatrixR<double>* fq_signed = nullptr,
                                        const MatrixR<double>* fk_signed = nullptr, Index rescales = 0) {
  require(chunk >= 1, "causal kernel rounding bound: chunk = {}", chunk);
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32;
  const double big = largest_finite(format);
  const double max32 = kMax32, min32 = kMin32;
  const double eta32 = kEta32, eps32 = std::ldexp(1.0, -23);
  const double inf = std::numeric_limits<double>::infinity();
  const MatrixR<double>& sq = fq_signed ? *fq_signed : fq;
  const MatrixR<double>& sk = fk_signed ? *fk_signed : fk;
  const Index nq = fq.rows(), nk = fk.rows(), m = fq.cols(), dv = v.cols(), off = nk - nq;
  const double e = eager ? 1 : 0;
  const double limit = eager ? big : max32;
  const MatrixR<double> va = v.cwiseAbs(), vau = (va.array() * (1 + u) + eta).matrix();
  const Index longest = std::max(chunk, off);
  const double absorb = (1 + gamma32(double(longest + 1))) * std::pow(1 + u, e);  // one absorb's factor on S, z
  const bool global_overflow = input_max >= big || std::max(fqu.maxCoeff(), fku.maxCoeff()) >= big;
  // Running sums over the keys seen so far: the envelopes Ψ⁺ᵀ|V|⁺ and Σψ⁺, the references |ψ|ᵀ|v|, Σ|ψ|, and the
  // signed ψᵀv, Σψ for O.
  MatrixR<double> s_up = MatrixR<double>::Zero(m, dv), s_abs = s_up, s_sgn = s_up;
  VectorX<double> z_up = VectorX<double>::Zero(m), z_abs = z_up, z_sgn = z_up;
  const auto add_key = [&](Index j) {
    s_up.noalias() += fku.row(j).transpose() * vau.row(j);
    s_abs.noalias() += fk.row(j).transpose() * va.row(j);
    s_sgn.noalias() += sk.row(j).transpose() * v.row(j);
    z_up += fku.row(j).transpose();
    z_abs += fk.row(j).transpose();
    z_sgn += sk.row(j).transpose();
  };
  Index seen = 0;  // keys added to the running sums
  b.output.resize(nq, dv);
  b.reference.resize(nq, dv);
  for (Index i0 = 0; i0 < nq; i0 += chunk) {
    const Index len = std::min(chunk, nq - i0), j0 = i0 + off;
    const Index absorbs = i0 / chunk + (off > 0 ? 1 : 0);  // absorbs before this chunk
    // The state as this chunk reads it: every key before j0; a stored state that may overflow: no guarantee.
    while (seen < j0) add_key(seen++);
    const double rho_state = std::pow(absorb, double(absorbs));
    const bool state_overflow =
        absorbs > 0 && (rho_state * s_up.maxCoeff() >= limit || rho_state * z_up.maxCoeff() >= limit);
    const double intra = (1 + gamma32(double(m))) * (1 + u);
    const double rho = std::pow(1 + u, e) * (1 + gamma32(double(len + m))) * std::max(intra, rho_state);
    for (Index r = 0; r < len; ++r) {
      const Index i = i0 + r, last = j0 + r;  // query i sees keys ≤ last
      while (seen <= last) add_key(seen++);
      const double fq_sum = fqu.row(i).sum();
      // A's stored entries (this chunk's keys up to i): η each, and none may reach the format's largest value.
      double a_max = 0, v_intra = 0;
      for (Index j = j0; j <= last; ++j) a_max = std::max(a_max, (1 + gamma32(double(m))) * fqu.row(i).dot(fku.row(j)));
      const VectorX<double> v_intra_col =
          vau.middleRows(j0, last - j0 + 1).colwise().sum().transpose();  // Σ over the chunk's keys of |V|⁺
      v_intra = double(last - j0 + 1);
      const double absolute_d = (1 + gamma32(double(len + m))) * std::pow(1 + u, e) * eta * v_intra +
                                e * double(absorbs) * eta * rho * fq_sum + e * eta +
                                double(last + 1 + m + len + 4) * eta32 * (1 + 2 * fq_sum) +
                                double(rescales) * eta32 * rho * fq_sum;
      const double d_up = fqu.row(i).dot(z_up), d_abs = fq.row(i).dot(z_abs), d_ref = sq.row(i).dot(z_sgn);
      const double ed = rho * d_up - d_abs + absolute_d + 1e-15 * rho * d_up;
      const double clamp = eager ? 0.0 : fq_signed ? std::max(eps32 * rho * d_up, 2 * min32) : 2 * min32;
      const VectorX<double> n_up = (fqu.row(i) * s_up).transpose(), n_abs = (fq.row(i) * s_abs).transpose();
      const VectorX<double> o = (sq.row(i) * s_sgn).transpose() / d_ref;
      b.reference.row(i) = o.transpose();
      const bool none = global_overflow || state_overflow || a_max >= big / (1 + u) || rho * d_up >= limit ||
                        rho * n_up.maxCoeff() >= limit || !(d_ref - ed > clamp);
      b.rows_without_guarantee += none;
      const double div = std::pow(1 + u32, eager ? 1 : 2);
      for (Index c = 0; c < dv; ++c) {
        if (none) {
          b.output(i, c) = inf;
          continue;
        }
        const double absolute_n = (1 + gamma32(double(len + m))) * std::pow(1 + u, e) * eta * v_intra_col(c) +
                                  e * double(absorbs) * eta * rho * fq_sum + e * eta +
                                  double(last + 1 + m + len + 4) * eta32 * (1 + 2 * fq_sum) +
                                  double(rescales) * eta32 * rho * fq_sum;
        const double en = rho * n_up(c) - n_abs(c) + absolute_n + 1e-15 * rho * n_up(c);
        b.output(i, c) = divided_entry(en, ed, std::abs(o(c)), d_ref, div, u, eta);
      }
      if (!none && (o.cwiseAbs().transpose() + b.output.row(i)).maxCoeff() >= big / (1 + u)) {
        b.output.row(i).setConstant(inf);
        ++b.rows_without_guarantee;
      }
    }
  }
  return b;
}

}  // namespace

KernelRoundingBound linear_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                          const ConstRef<double>& v, LinearFeature feature,
                                          const AttentionOptions& opts, Index chunk) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  require(v.rows() == k.rows(), "linear rounding bound: V has {} rows, K has {}", v.rows(), k.rows());
  require(opts.storage != Storage::native, "linear rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const double u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32, lift = eta / u;
  const double floor32 = kMin32;  // float32's floor on forming a feature (below)
  const double store = (1 + (feature == LinearFeature::Elu ? 2 : 0) * u32) * (1 + u) - 1;
  // φ and its upper envelope Φ⁺ (the header's "features").
  const auto features = [&](const ConstRef<double>& x, MatrixR<double>& f, MatrixR<double>& up) {
    f.resize(x.rows(), x.cols());
    up.resize(x.rows(), x.cols());
    for (Index i = 0; i < x.rows(); ++i)
      for (Index c = 0; c < x.cols(); ++c) {
        const double xv = x(i, c), xbar = std::abs(xv) + lift;
        double phi, a;
        if (feature == LinearFeature::Relu) {
          phi = std::max(xv, 0.0);
          a = xv > 0 ? u * xbar : 0.0;
        } else {
          phi = std::max(xv, 0.0) + std::exp(std::min(xv, 0.0));
          a = u * xbar * std::min(1.0, std::exp(std::min(xv, 0.0) + u * xbar));
        }
        f(i, c) = phi;
        // floor32: float32's own absolute error in forming φ — e^x underflowing in float32, and Eigen's vectorised
        // exp clamping its argument at −88.72 (e^x ≈ 2.9e-39 below it): both under 2⁻¹²⁶.
        up(i, c) = phi + a + (phi + a) * store + eta + floor32;
      }
  };
  MatrixR<double> fq, fqu, fk, fku;
  features(q, fq, fqu);
  features(k, fk, fku);
  const double input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  if (opts.causal) return causal_kernel_bound(fq, fqu, fk, fku, v, input_max, chunk, opts);
  return kernel_bound(fq, fqu, fk, fku, v, input_max, k.rows(), opts);
}

namespace {

/// The float32 projections s^½x̂ω₃₂ᵀ of the stored rows x̂ (known exactly: round_to) against the exact p = s^½xωᵀ:
/// |p̂ − p| ≤ Δp = |s^½x̂ω₃₂ᵀ − p| + e_proj·s^½|x̂||ω₃₂|ᵀ, e_proj = (1+u₃₂)²(1+γ_d) − 1 (s^½ rounded, s^½x rounded, the
/// dot product), plus float64's own rounding of p. Performer's and Scatterbrain's features.
void projection_bound(Format format, const ConstRef<double>& x, const ConstRef<double>& omega,
                      const ConstRef<double>& omega32, double rs, double e_proj, MatrixR<double>& p,
                      MatrixR<double>& dp) {
  const Index d = x.cols();
  const MatrixR<double> xs = stored_in(format, x);
  p = rs * x * omega.transpose();
  dp = (rs * xs * omega32.transpose() - p).cwiseAbs() + e_proj * rs * xs.cwiseAbs() * omega32.cwiseAbs().transpose();
  dp.array() += 2 * double(d + 2) * std::ldexp(1.0, -53) * (rs * x.cwiseAbs() * omega.cwiseAbs().transpose()).array();
}

/// The half squared norms ½‖s^½x‖² (hn, exact) and the bound on their float32 values from the stored rows xs (dhn):
/// |formed − exact| + e_norm·formed, e_norm = (1+u₃₂)⁵(1+γ_d) − 1, plus float64's own rounding.
void half_norm_bound(const ConstRef<double>& x, const ConstRef<double>& xs, double rs, double e_norm,
                     VectorX<double>& hn, VectorX<double>& dhn) {
  const Index n = x.rows(), d = x.cols();
  hn.resize(n);
  dhn.resize(n);
  for (Index j = 0; j < n; ++j) {
    const double exact = 0.5 * rs * rs * x.row(j).squaredNorm(), formed = 0.5 * rs * rs * xs.row(j).squaredNorm();
    hn(j) = exact;
    dhn(j) = std::abs(formed - exact) + e_norm * formed + 4 * double(d + 2) * std::ldexp(1.0, -53) * formed;
  }
}

/// A careful Performer key's weight e^{g − m_c}·e^{m_c − max} as streamed_kernel_output forms it (two float32 exps,
/// each within 4u₃₂ and underflowing to at most 2⁻¹²⁶): its upper envelope, gc = g − C its exact exponent and dgmax
/// the log-scales' largest move.
double key_weight_up(double gc, double dgmax) {
  const double e32 = 4 * kU32;
  return std::exp(gc + 3 * dgmax + kU32 * 2 * (std::abs(gc) + 2 * dgmax)) * (1 + e32) * (1 + e32) + 3 * kMin32;
}

/// streamed_kernel_output's key chunks (2048 keys) form their sums in float32 before their factor e^{m_c − max}
/// scales them: each term f̂·ŵ·|v̂| ≤ (1+4u₃₂)²(1+u)·|V̂| (|f̂|, ŵ ≤ 1 up to their exp's error), so where a chunk's
/// Σ|V̂| (vs: the stored V) may pass float32's largest value there is no guarantee anywhere.
bool key_chunk_sums_may_overflow(const MatrixR<double>& vs, double u) {
  const double e32 = 4 * kU32, gc = gamma32(2048.0);
  for (Index c0 = 0; c0 < vs.rows(); c0 += 2048) {
    const Index len = std::min<Index>(2048, vs.rows() - c0);
    const double worst = vs.middleRows(c0, len).cwiseAbs().colwise().sum().maxCoeff();
    if ((1 + gc) * (1 + e32) * (1 + e32) * (1 + u) * (1 + kU32) * worst >= kMax32) return true;
  }
  return false;
}

/// performer_rounding_bound's careful causal form, as emulated_causal_kernel_output computes it (operators/kernel.cpp):
/// the same stored query features (fq, fqu) and key projections (pk, Δpk) and log-scales (g, Δg) as the non-causal
/// form; then each key enters with its stored feature f̂ = e^{p − max p}, a float32 weight e^{ĝ − m̂} against the
/// running maximum m̂ of the log-scales seen when it is absorbed (or, in its own chunk, the current one), and the
/// state it joins is multiplied in float32 by e^{m̂_old − m̂_new} whenever a later chunk raises the maximum: at most
/// R = ⌈n_q/chunk⌉ times. Every row reads its keys in units of its own final m̂; divided by the exact e^{C − m}
/// (C = max g ≥ m: a factor common to the row, which cancels in O and only shrinks the absolute terms), key j's
/// value is ψ_j = e^{a + g_j − C} times e^θ, θ = Δa + Δg_j + ΔG + u₃₂(|ĝ_j − m̂| + Σ|m̂_old − m̂_new|) — the maxima
/// telescope, and m̂ is non-decreasing, so the subtractions' sum is at most 2(C − g_j + ΔG + Δg_j) —, times (1+4u₃₂)
/// per exp (1 + R + the feature's), (1+u₃₂) per float32 product (the weight's, each rescaling's: 2R + 2 counted)
/// and the storing of f̂; each exp's underflow (2⁻¹²⁶) an absolute term beside the other factors' largest values,
/// each rescaling's η₃₂ one more absolute term per state entry (causal_kernel_bound's `rescales`). Every weight is
/// at most 1 in the emulation's own units, so its sums cannot overflow float32 unless (M + 1)·Σ|V̂| could: then no
/// guarantee anywhere.
/// The careful causal form's key weights (performer_careful_causal's header): per key j, its weight's main term
/// e^{g_j − C + θ_w}(1+4u₃₂)^{R+1} and absolute term (R + 1)·2⁻¹²⁶·b^R (b the largest value one weight or rescaling
/// factor may take), in units of the exact e^{C − m}; `largest` the largest value a weight may take, `mults` the
/// float32 products' (1+u₃₂)^{2R+2}.
struct CausalKeyWeights {
  VectorX<double> main, abs;
  double largest = 0, mults = 1;
  Index rescales = 0;
};

CausalKeyWeights careful_causal_weights(const VectorX<double>& g, const VectorX<double>& dg, Index nq, Index chunk) {
  const double u32 = kU32, e32 = 4 * u32, floor32 = kMin32;
  CausalKeyWeights w;
  w.rescales = (nq + chunk - 1) / chunk;
  const double c = g.maxCoeff(), dgmax = dg.maxCoeff(), r = double(w.rescales);
  w.mults = std::pow(1 + u32, 2 * r + 2);
  w.main.resize(g.size());
  w.abs.resize(g.size());
  for (Index j = 0; j < g.size(); ++j) {
    const double theta_w = dg(j) + dgmax + 2 * u32 * (c - g(j) + dgmax + dg(j));
    // The largest value any one weight or rescaling factor may take (their exact exponents are ≤ 0).
    const double b = std::exp(theta_w) * (1 + e32) + floor32;
    w.main(j) = std::exp(g(j) - c + theta_w) * std::pow(1 + e32, r + 1);
    w.abs(j) = (r + 1) * floor32 * std::pow(b, r);
    w.largest = std::max(w.largest, std::pow(b, r + 1));
  }
  return w;
}

/// The careful causal form's bound from its features (fq, fqu; fk, fku and the signed ones where the kernel's are
/// signed) and weights: causal_kernel_bound with the rescalings' terms, and no guarantee anywhere where a sum may pass
/// float32's largest value — in the emulation's units every weight is at most 1 (up to its rounding), so the state,
/// key sum, numerators and normalisers stay below (M + 1)·max(Σ|V̂|, n) times the features' and weights' largest
/// values (`feature_max` the keys'), the stored scores A below M times them.
KernelRoundingBound careful_causal_bound(const MatrixR<double>& fq, const MatrixR<double>& fqu,
                                         const MatrixR<double>& fk, const MatrixR<double>& fku,
                                         const ConstRef<double>& v, double input_max, Index chunk,
                                         const AttentionOptions& opts, const CausalKeyWeights& w, double feature_max,
                                         const MatrixR<double>* fq_signed = nullptr,
                                         const MatrixR<double>* fk_signed = nullptr) {
  const Format format = storage_format(opts.storage);
  const double u = unit_roundoff(format), big = largest_finite(format);
  const Index nq = fq.rows(), nk = fk.rows(), mf = fk.cols();
  KernelRoundingBound bound =
      causal_kernel_bound(fq, fqu, fk, fku, v, input_max, chunk, opts, fq_signed, fk_signed, w.rescales);
  const MatrixR<double> vs = stored_in(format, v);
  const double sums = std::max(vs.cwiseAbs().colwise().sum().maxCoeff(), double(nk));
  const double scale = (1 + gamma32(double(nk + mf + 2))) * fqu.maxCoeff() * feature_max * w.largest * w.mults;
  if (double(mf + 1) * scale * sums >= kMax32 || double(mf) * scale >= big / (1 + u)) {
    bound.output.setConstant(std::numeric_limits<double>::infinity());
    bound.rows_without_guarantee = nq;
  }
  return bound;
}

KernelRoundingBound performer_careful_causal(const MatrixR<double>& fq, const MatrixR<double>& fqu,
                                             const MatrixR<double>& pk, const MatrixR<double>& dpk,
                                             const VectorX<double>& g, const VectorX<double>& dg,
                                             const ConstRef<double>& v, double input_max, Index chunk,
                                             const AttentionOptions& opts) {
  const Format format = storage_format(opts.storage);
  const double u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32, e32 = 4 * u32;
  const double floor32 = kMin32;
  const Index nk = pk.rows(), mf = pk.cols();
  const double c = g.maxCoeff();
  const CausalKeyWeights w = careful_causal_weights(g, dg, fq.rows(), chunk);
  MatrixR<double> fk(nk, mf), fku(nk, mf);
  double feature_max = 0;
  for (Index j = 0; j < nk; ++j) {
    const double mx = pk.row(j).maxCoeff(), dm = dpk.row(j).maxCoeff();
    for (Index m = 0; m < mf; ++m) {
      const double a = pk(j, m) - mx, theta_a = dpk(j, m) + dm + u32 * (std::abs(a) + 2 * dm);
      const double f_main = std::exp(a + theta_a) * (1 + e32) * (1 + u), f_abs = floor32 * (1 + u) + eta;
      const double f_up = std::min(std::exp(std::min(a + theta_a, 0.0) + u32 * (std::abs(a) + 2 * dm)), 1.0 + e32) *
                              (1 + e32) * (1 + u) +
                          f_abs;
      feature_max = std::max(feature_max, f_up);
      fk(j, m) = std::exp(a + g(j) - c);
      fku(j, m) = (f_main * w.main(j) + f_abs * (w.main(j) + w.abs(j)) + f_up * w.abs(j)) * w.mults;
    }
  }
  return careful_causal_bound(fq, fqu, fk, fku, v, input_max, chunk, opts, w, feature_max);
}

/// performer_rounding_bound under eager (the header: the reference code's features, every step stored). Per row x,
/// with σ = s^½ and the stored row x̂ and ω̂ (both known exactly: round_to), every stored step's distance from its
/// float64 value is bounded in turn — the rounding of a stored value within u·|x| + η, a float32 product or sum of m
/// terms within γ_m of its magnitudes:
///   s^½x      Δxs = σ|x̂ − x| + σ|x̂|((1+u₃₂)²(1+u) − 1) + η (the scale as float32 holds it, the product, storing)
///   ωᵀx       Δp = (Δxs·|ω̂| + σ|x|·|ω̂ − ω| + γ_d·XS⁺·|ω̂| + d·η₃₂)(1+u) + u|p| + η, XS⁺ = σ|x̂|(1+u₃₂)²(1+u) + η
///   x∘x, ‖x‖², ‖x‖²/2: each square within Δxs(2σ|x| + Δxs) + ((1+u₃₂)(1+u) − 1)XS⁺² + η, their float32 sum γ_d, the
///             storings, the halving (exact in float32 but for η₃₂)
///   exponent  p − ‖x‖²/2 in float32, stored; less the maximum (a query's largest projection, or the largest over
///             every key: within max Δp of the exact one), in float32, stored: θ the sum of these moves
///   feature   e^{â} in float32 (4u₃₂, 2⁻¹²⁶ absolute), stored: Φ⁺ = (φe^θ(1+4u₃₂) + 2⁻¹²⁶)(1+u) + η
/// then linear attention's eager sums and division (kernel_bound, as linear_rounding_bound). The query's maximum is
/// a factor that cancels, the keys' a common one: counting their moves in θ is conservative. No guarantee for a query
/// whose stored intermediates may reach the format's largest value, nor anywhere when a key's may; rows whose
/// features all underflow (e^{−‖x‖²/2}: long queries in fp16) give up through kernel_bound's D ≤ E_D.
/// Causal: the same features (the keys' stabiliser is still the largest projection over every key, as the reference
/// code takes it), then linear attention's chunked transcription in chunks of `chunk` (causal_kernel_bound).
KernelRoundingBound performer_eager_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                          const ConstRef<double>& v, const ConstRef<double>& omega,
                                          const ConstRef<double>& omega32, const AttentionOptions& opts,
                                          Index chunk) {
  const Format format = storage_format(opts.storage);
  const double u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32, eta32 = kEta32;
  const double big = largest_finite(format), floor32 = kMin32, e32 = 4 * u32, f64 = std::ldexp(1.0, -50);
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), mf = omega.rows();
  const double sigma = std::sqrt(opts.resolved_scale(d)), gd = gamma32(double(d));
  const MatrixR<double> om_s = stored_in(format, omega32), om_abs = om_s.cwiseAbs();
  const MatrixR<double> om_err = (om_s - omega).cwiseAbs();
  struct Rows {
    MatrixR<double> p, dp;  // exact projections σxωᵀ and the stored ones' distance
    VectorX<double> h, dh;  // exact ‖σx‖²/2, the stored one's distance
    VectorX<double> dmax;   // max over m of dp
    std::vector<char> overflow;
  };
  const auto rows = [&](const ConstRef<double>& x) {
    Rows r;
    const MatrixR<double> xs = stored_in(format, x);
    const MatrixR<double> dxs = (sigma * (xs - x).cwiseAbs().array() +
                                 sigma * xs.cwiseAbs().array() * ((1 + u32) * (1 + u32) * (1 + u) - 1) + eta)
                                    .matrix();
    const MatrixR<double> xs_up = (sigma * xs.cwiseAbs().array() * (1 + u32) * (1 + u32) * (1 + u) + eta).matrix();
    r.p = sigma * x * omega.transpose();
    // One product for the three magnitude terms: [Δxs + γ_d·XS⁺ | σ|x|]·[|ω̂| | |ω̂ − ω|]ᵀ, each side also carrying
    // float64's own rounding of p (≤ 2⁻⁵⁰·σ|x|ᵀ|ω|, with σ|x| ≤ XS⁺ + Δxs and |ω| ≤ |ω̂| + |ω̂ − ω|).
    MatrixR<double> left(x.rows(), 2 * d), right(mf, 2 * d);
    left << dxs + gd * xs_up + f64 * (dxs + xs_up), (1 + f64) * sigma * x.cwiseAbs();
    right << om_abs, om_err;
    const MatrixR<double> formed = (left * right.transpose()).array() + double(d) * eta32;
    r.dp = (formed.array() * (1 + u) + u * r.p.array().abs() + eta).matrix();
    r.h.resize(x.rows());
    r.dh.resize(x.rows());
    r.dmax = r.dp.rowwise().maxCoeff();
    r.overflow.assign(std::size_t(x.rows()), 0);
    for (Index i = 0; i < x.rows(); ++i) {
      double sq_err = 0, sq_up = 0;
      for (Index c = 0; c < d; ++c) {
        const double up = xs_up(i, c) * xs_up(i, c);
        sq_err += dxs(i, c) * (2 * sigma * std::abs(x(i, c)) + dxs(i, c)) + ((1 + u32) * (1 + u) - 1) * up + eta;
        sq_up += up * (1 + u32) * (1 + u) + eta;
      }
      const double norm2 = sigma * sigma * x.row(i).squaredNorm();
      const double d_norm2 = (sq_err + gd * sq_up) * (1 + u) + u * norm2 + eta + f64 * norm2;  // ‖x‖² stored
      r.h(i) = norm2 / 2;
      r.dh(i) = d_norm2 / 2 + eta32 + u * (r.h(i) + d_norm2 / 2) + eta;  // halved, stored
      const double p_up = (r.p.row(i).cwiseAbs() + r.dp.row(i)).maxCoeff();
      r.overflow[std::size_t(i)] =
          xs_up.row(i).maxCoeff() >= big || p_up >= big || sq_up * (1 + u) >= big || p_up + r.h(i) + r.dh(i) >= big;
    }
    return r;
  };
  const Rows rq = rows(q), rk = rows(k);
  const double g_max = rk.p.maxCoeff(), dg_max = rk.dmax.maxCoeff();
  bool key_overflow = false;
  for (const char o : rk.overflow) key_overflow = key_overflow || o;
  // The features and their envelopes: exponent a = p − h − M (M the query's largest projection, or every key's).
  const auto features = [&](const Rows& r, bool keys, MatrixR<double>& f, MatrixR<double>& up) {
    const Index n = r.p.rows();
    f.resize(n, mf);
    up.resize(n, mf);
    for (Index i = 0; i < n; ++i) {
      const double mx = keys ? g_max : r.p.row(i).maxCoeff(), dm = keys ? dg_max : r.dmax(i);
      for (Index m = 0; m < mf; ++m) {
        const double diff = r.p(i, m) - r.h(i), a = diff - mx;
        const double df = r.dp(i, m) + r.dh(i) + (u32 + u + u * u32) * (std::abs(diff) + r.dp(i, m) + r.dh(i)) + eta;
        const double theta = df + dm + ((1 + u32) * (1 + u) - 1) * (std::abs(a) + df + dm) + eta;
        f(i, m) = std::exp(a);
        up(i, m) = (f(i, m) * std::exp(theta) * (1 + e32) + floor32) * (1 + u) + eta;
      }
    }
  };
  MatrixR<double> fq, fqu, fk, fku;
  features(rq, false, fq, fqu);
  features(rk, true, fk, fku);
  const double input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  KernelRoundingBound b = opts.causal ? causal_kernel_bound(fq, fqu, fk, fku, v, input_max, chunk, opts)
                                       : kernel_bound(fq, fqu, fk, fku, v, input_max, nk, opts);
  const double inf = std::numeric_limits<double>::infinity();
  for (Index i = 0; i < nq; ++i)
    if ((key_overflow || rq.overflow[std::size_t(i)]) && b.output.row(i).allFinite()) {
      b.output.row(i).setConstant(inf);
      ++b.rows_without_guarantee;
    }
  return b;
}

/// Performer's trigonometric kernel under careful (the one policy that emulates it), non-causal: φ(x) = e^{‖x_s‖²/2}
/// [sin p, cos p]/√M (Choromanski et al. 2021, the trigonometric features of methods/performer.hpp), as
/// streamed_kernel_output computes it. Queries: [sin p̂, cos p̂] from the float32 projections of the stored rows,
/// stored (their factor e^{‖x_s‖²/2} is the row's and cancels). Keys: the same, stored, then weighted in float32 by
/// e^{ĝ − m_c} and their chunk's sums by e^{m_c − max}, ĝ = ½‖s^½k̂‖² − ½log M. sin and cos are 1-Lipschitz, so a
/// feature moves by at most min(Δp, 2) plus float32's sin or cos error, within kTrigAbs = 2⁻²² of the exact value of
/// its float32 argument below kTrigRange (Eigen's vectorised sin and cos state "absolute error < 5.9605e-08" up to
/// 71476; tests/test_precision.cpp measures up to 8.1e-08 on 2²³ arguments, and checks kTrigAbs), and |f̂ − f| ≤ Δf =
/// (min(Δp, 2) + kTrigAbs)(1+u) + u|f| + η once stored. A key's value ψ̂ = f̂·ŵ has |ψ̂ − ψ| ≤ (|f| + Δf)·W⁺ − |f|·w
/// with W⁺ the weight's upper envelope (as the positive kernel's), and the signed features then enter linear
/// attention's sums and division (kernel_bound's signed form: the error terms from the magnitudes, the normaliser and O
/// from the signed features; a row whose normaliser may vanish, or be clamped by the guarded reciprocal, has no
/// guarantee — with signed features the estimate of the normaliser can be small or negative). Causal
/// (emulated_causal_kernel_output): the same stored features, the keys weighted against the running maximum of their
/// log-scales and the state rescaled as the positive kernel's careful causal form (careful_causal_weights), then the
/// chunked transcription's bound in its signed form (causal_kernel_bound, as Taylor's).
constexpr double kTrigAbs = 0x1p-22, kTrigRange = 65536.0;
KernelRoundingBound performer_trig_careful(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v, const ConstRef<double>& omega,
                                           const ConstRef<double>& omega32, const AttentionOptions& opts,
                                           Index chunk) {
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), mf = omega.rows();
  const Format format = storage_format(opts.storage);
  const double u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32;
  const double e32 = 4 * u32;
  const double rs = std::sqrt(opts.resolved_scale(d)), lscale = 0.5 * std::log(double(mf));
  const double e_proj = (1 + u32) * (1 + u32) * (1 + gamma32(double(d))) - 1;
  const double e_norm = std::pow(1 + u32, 5) * (1 + gamma32(double(d))) - 1;
  const double d_l = lscale * ((1 + e32) * (1 + u32) - 1);
  bool in_range = true;
  // The features [sin p, cos p] (signed) and the envelopes |f| + Δf of their stored values.
  const auto features = [&](const ConstRef<double>& x, MatrixR<double>& f, MatrixR<double>& fu) {
    MatrixR<double> p, dp;
    projection_bound(format, x, omega, omega32, rs, e_proj, p, dp);
    in_range = in_range && (p.cwiseAbs() + dp).maxCoeff() < kTrigRange;
    f.resize(x.rows(), 2 * mf);
    fu.resize(x.rows(), 2 * mf);
    for (Index i = 0; i < x.rows(); ++i)
      for (Index m = 0; m < mf; ++m) {
        const double a = std::min(dp(i, m), 2.0) + kTrigAbs;
        f(i, m) = std::sin(p(i, m));
        f(i, mf + m) = std::cos(p(i, m));
        fu(i, m) = (std::abs(f(i, m)) + a) * (1 + u) + eta + 1e-15;
        fu(i, mf + m) = (std::abs(f(i, mf + m)) + a) * (1 + u) + eta + 1e-15;
      }
  };
  MatrixR<double> fq, fqu, fk, fku;
  features(q, fq, fqu);
  features(k, fk, fku);
  // Keys' log-scales g = ½‖s^½k‖² − ½log M (one float32 subtraction after the half norm) and their largest, C.
  const MatrixR<double> ks = stored_in(format, k);
  VectorX<double> hn, dhn, g(nk), dg(nk);
  half_norm_bound(k, ks, rs, e_norm, hn, dhn);
  for (Index j = 0; j < nk; ++j) {
    g(j) = hn(j) - lscale;
    dg(j) = dhn(j) + d_l + u32 * (std::abs(g(j)) + dhn(j) + d_l);
  }
  const double c = g.maxCoeff(), dgmax = dg.maxCoeff();
  const MatrixR<double> fqa = fq.cwiseAbs();
  const double input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  const double inf = std::numeric_limits<double>::infinity();
  MatrixR<double> sk(nk, 2 * mf);
  if (opts.causal) {
    // The causal form's weights against the running maximum (careful_causal_weights, as the positive kernel's): key
    // j's value f̂·ŵ within (|f| + Δf)·W⁺ of f·e^{g − C}, W⁺ = (main + abs)·mults.
    const CausalKeyWeights w = careful_causal_weights(g, dg, nq, chunk);
    const double feature_max = fku.maxCoeff();
    for (Index j = 0; j < nk; ++j) {
      const double we = std::exp(g(j) - c);
      sk.row(j) = fk.row(j) * we;
      fk.row(j) = fk.row(j).cwiseAbs() * we;
      fku.row(j) *= (w.main(j) + w.abs(j)) * w.mults;
    }
    KernelRoundingBound b =
        careful_causal_bound(fqa, fqu, fk, fku, v, input_max, chunk, opts, w, feature_max, &fq, &sk);
    if (!in_range) {  // beyond kTrigRange float32's sin and cos are not held to kTrigAbs here
      b.output.setConstant(inf);
      b.rows_without_guarantee = nq;
    }
    return b;
  }
  for (Index j = 0; j < nk; ++j) {
    const double gc = g(j) - c;
    // The weight e^{g − m_c}·e^{m_c − max} (two exps, each underflowing to at most 2⁻¹²⁶; the two float32 products).
    const double w = std::exp(gc);
    const double w_up = key_weight_up(gc, dgmax) * (1 + u32) * (1 + u32);
    sk.row(j) = fk.row(j) * w;
    fk.row(j) = fk.row(j).cwiseAbs() * w;
    fku.row(j) *= w_up;
  }
  const Index chunks = (nk + 2047) / 2048;
  KernelRoundingBound b = kernel_bound(fqa, fqu, fk, fku, v, input_max, nk + chunks, opts, &fq, &sk);
  // Beyond kTrigRange float32's sin and cos are not held to kTrigAbs here; and a chunk's float32 sums must not
  // overflow.
  if (!in_range || key_chunk_sums_may_overflow(stored_in(format, v), u)) {
    b.output.setConstant(inf);
    b.rows_without_guarantee = nq;
  }
  return b;
}

}  // namespace

KernelRoundingBound performer_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                             const ConstRef<double>& v, const ConstRef<double>& omega,
                                             const ConstRef<double>& omega32, PerformerKernel kernel,
                                             const AttentionOptions& opts, Index chunk) {
  const bool careful = opts.policy == Policy::careful;
  require(kernel == PerformerKernel::Positive || (kernel != PerformerKernel::Positive && careful),
          "performer rounding bound: derived for the positive features (kernel=positive) and, under careful (the "
          "only policy that emulates them), the hyperbolic and trigonometric ones");
  const bool hyperbolic = kernel == PerformerKernel::Hyperbolic;
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), mf = omega.rows();
  require(v.rows() == nk && omega.cols() == d && omega32.rows() == mf && omega32.cols() == d && mf >= 1,
          "performer rounding bound: V {} rows, K {}; ω {}×{}, its float32 draw {}×{}", v.rows(), nk, mf,
          omega.cols(), omega32.rows(), omega32.cols());
  require(!opts.causal || chunk >= 1, "performer rounding bound: chunk = {}", chunk);
  require(opts.storage != Storage::native, "performer rounding bound: give a reduced storage (bf16 or fp16)");
  if (opts.policy == Policy::eager) return performer_eager_bound(q, k, v, omega, omega32, opts, chunk);
  if (kernel == PerformerKernel::Trig) return performer_trig_careful(q, k, v, omega, omega32, opts, chunk);
  // Hyperbolic features [e^{p − max|p|}, e^{−p − max|p|}] (log-scale max|p| − ‖s^½x‖²/2 − ½log 2M) are the positive
  // ones of the 2M projections [p, −p] (negation is exact): the same derivation over them.
  const Index mfe = hyperbolic ? 2 * mf : mf;
  const Format format = storage_format(opts.storage);
  const double u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32;
  const double floor32 = kMin32, e32 = 4 * u32;  // an exp's absolute floor and relative error
  const double rs = std::sqrt(opts.resolved_scale(d)), lscale = 0.5 * std::log(double(mfe));
  const double e_proj = (1 + u32) * (1 + u32) * (1 + gamma32(double(d))) - 1;  // s^½x in float32, then ωᵀ(s^½x)
  const double e_norm = std::pow(1 + u32, 5) * (1 + gamma32(double(d))) - 1;   // ½‖s^½x‖² in float32
  const double d_l = lscale * ((1 + e32) * (1 + u32) - 1);                   // ½·log M in float32
  // Per row: the exact projections p = s^½xωᵀ, and the bound Δp on the float32 projections of the stored rows.
  const auto projections = [&](const ConstRef<double>& x, MatrixR<double>& p, MatrixR<double>& dp) {
    projection_bound(format, x, omega, omega32, rs, e_proj, p, dp);
    if (hyperbolic) {
      MatrixR<double> both(p.rows(), 2 * mf), dboth(p.rows(), 2 * mf);
      both << p, -p;
      dboth << dp, dp;
      p.swap(both);
      dp.swap(dboth);
    }
  };
  // Queries: φ = e^{p − max p}; the row's stabiliser moves by at most max Δp and the subtraction rounds.
  MatrixR<double> pq, dpq;
  projections(q, pq, dpq);
  MatrixR<double> fq(nq, mfe), fqu(nq, mfe);
  for (Index i = 0; i < nq; ++i) {
    const double mx = pq.row(i).maxCoeff(), dm = dpq.row(i).maxCoeff();
    for (Index m = 0; m < mfe; ++m) {
      const double a = pq(i, m) - mx;
      const double theta = dpq(i, m) + dm + u32 * (std::abs(a) + dpq(i, m) + dm);
      fq(i, m) = std::exp(a);
      fqu(i, m) = (fq(i, m) * std::exp(theta) * (1 + e32) + floor32) * (1 + u) + eta;
    }
  }
  // Keys: ψ = e^{p − ‖s^½k‖²/2 − ½log M − C} with C the largest log-scale g = max p − ‖s^½k‖²/2 − ½log M. The
  // emulation's key stabilisers (its row maximum, its chunk's and the global largest log-scale) cancel in the
  // exponents it adds up to, apart from each subtraction's rounding; the global one moves by at most ΔG.
  MatrixR<double> pk, dpk;
  projections(k, pk, dpk);
  const MatrixR<double> ks = stored_in(format, k);
  VectorX<double> hn(nk), dhn(nk), g(nk), dg(nk);
  half_norm_bound(k, ks, rs, e_norm, hn, dhn);
  for (Index j = 0; j < nk; ++j) {
    const double mx = pk.row(j).maxCoeff(), dm = dpk.row(j).maxCoeff();
    g(j) = mx - hn(j) - lscale;
    dg(j) = dm + dhn(j) + d_l + u32 * (std::abs(mx) + dm + hn(j) + dhn(j)) + u32 * (std::abs(g(j)) + dm + dhn(j) + d_l);
  }
  const double c = g.maxCoeff(), dgmax = dg.maxCoeff();
  const double input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  if (opts.causal) return performer_careful_causal(fq, fqu, pk, dpk, g, dg, v, input_max, chunk, opts);
  MatrixR<double> fk(nk, mfe), fku(nk, mfe);
  for (Index j = 0; j < nk; ++j) {
    const double mx = pk.row(j).maxCoeff(), dm = dpk.row(j).maxCoeff(), gc = g(j) - c;
    // The weight e^{g − m_c}·e^{m_c − max}: upper envelope of its float32 value (two exps, each underflowing to at
    // most 2⁻¹²⁶).
    const double wc_up = key_weight_up(gc, dgmax);
    for (Index m = 0; m < mfe; ++m) {
      const double a = pk(j, m) - mx;
      const double theta = dpk(j, m) + dhn(j) + d_l + dgmax +
                           u32 * ((std::abs(a) + 2 * dm) + (std::abs(mx) + hn(j) + dm + dhn(j)) +
                                  (std::abs(g(j)) + dg(j)) + 2 * (std::abs(gc) + 2 * dgmax));
      fk(j, m) = std::exp(a + gc);
      const double f_up = (std::exp(std::min(a + dpk(j, m) + dm + u32 * (std::abs(a) + 2 * dm), 0.0) +
                                    u32 * (std::abs(a) + 2 * dm)) *
                               (1 + e32) +
                           floor32) *
                              (1 + u) +
                          eta;
      fku(j, m) = fk(j, m) * std::exp(theta) * std::pow(1 + e32, 3) * (1 + u) * (1 + u32) * (1 + u32) +
                  ((eta + floor32 * (1 + u)) * wc_up + f_up * 3 * floor32) * (1 + u32) * (1 + u32);
    }
  }
  const Index chunks = (nk + 2047) / 2048;  // streamed_kernel_output's key chunks: their weighted sums added
  KernelRoundingBound b = kernel_bound(fq, fqu, fk, fku, v, input_max, nk + chunks, opts);
  // A chunk's sums are formed in float32 before its factor e^{m_c − max} scales them.
  if (key_chunk_sums_may_overflow(stored_in(format, v), u)) {
    b.output.setConstant(std::numeric_limits<double>::infinity());
    b.rows_without_guarantee = nq;
  }
  return b;
}

KernelRoundingBound scatterbrain_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                                const ConstRef<double>& v, const ConstRef<double>& omega,
                                                const ConstRef<double>& omega32, Index window,
                                                const AttentionOptions& opts) {
  require(!opts.causal, "scatterbrain rounding bound: Scatterbrain is non-causal");
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), mf = omega.rows(), dv = v.cols();
  require(v.rows() == nk && omega.cols() == d && omega32.rows() == mf && omega32.cols() == d && mf >= 1 &&
              window >= 0,
          "scatterbrain rounding bound: V {} rows, K {}; ω {}×{}, its float32 draw {}×{}; window {}", v.rows(), nk,
          mf, omega.cols(), omega32.rows(), omega32.cols(), window);
  require(opts.storage != Storage::native, "scatterbrain rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  const double e = eager ? 1 : 0;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32, e32 = 4 * u32, floor32 = kMin32, eta32 = kEta32;
  const double big = largest_finite(format), max32 = kMax32, inf = std::numeric_limits<double>::infinity();
  const double s = opts.resolved_scale(d), rs = std::sqrt(s), lscale = 0.5 * std::log(double(mf));
  const double e_proj = (1 + u32) * (1 + u32) * (1 + gamma32(double(d))) - 1;
  const double e_norm = std::pow(1 + u32, 5) * (1 + gamma32(double(d))) - 1;
  const double d_l = lscale * ((1 + e32) * (1 + u32) - 1);
  // The band logits s^½q̂·s^½k̂ in float32: s^½ and each product rounded on both sides, then the dot product.
  const double e_logit = std::pow(1 + u32, 4) * (1 + gamma32(double(d))) - 1;
  const double f64 = 2 * double(d + 2) * std::ldexp(1.0, -53);
  const MatrixR<double> qs = stored_in(format, q), ks = stored_in(format, k), vs = stored_in(format, v);
  MatrixR<double> pq, dpq, pk, dpk;
  projection_bound(format, q, omega, omega32, rs, e_proj, pq, dpq);
  projection_bound(format, k, omega, omega32, rs, e_proj, pk, dpk);
  VectorX<double> hnq, dhnq, hnk, dhnk;
  half_norm_bound(q, qs, rs, e_norm, hnq, dhnq);
  half_norm_bound(k, ks, rs, e_norm, hnk, dhnk);
  // Log-scales l = max p − ½‖s^½x‖² − ½log M (two float32 subtractions) and their moves; gk = max_j lk_j.
  const auto log_scale = [&](Index r, const MatrixR<double>& p, const MatrixR<double>& dp, const VectorX<double>& hn,
                             const VectorX<double>& dhn, double& mx, double& dm, double& l, double& dlv) {
    mx = p.row(r).maxCoeff();
    dm = dp.row(r).maxCoeff();
    l = mx - hn(r) - lscale;
    dlv = dm + dhn(r) + d_l + u32 * (std::abs(mx - hn(r)) + dm + dhn(r)) + u32 * (std::abs(l) + dm + dhn(r) + d_l);
  };
  VectorX<double> mxk(nk), dmk(nk), lk(nk), dlk(nk);
  for (Index j = 0; j < nk; ++j) log_scale(j, pk, dpk, hnk, dhnk, mxk(j), dmk(j), lk(j), dlk(j));
  const double gk = lk.maxCoeff(), dgk = dlk.maxCoeff();
  // Keys: Ψ_jm = e^{lk_j − gk + pk_jm − mxk_j} (kscaled: two float32 exps, their product, stored). The pivots mx̂k
  // and ĝk cancel against the queries' in every product term; alone, a key's value moves by e^{dmk + Δgk} more,
  // which the absolute terms' factor 2 covers.
  MatrixR<double> psi(nk, mf), psiu(nk, mf);
  const double f2 = 2 * ((2 * floor32 * (1 + e32)) * (1 + u32) * (1 + u) + eta);
  for (Index j = 0; j < nk; ++j)
    for (Index m = 0; m < mf; ++m) {
      const double a = pk(j, m) - mxk(j);
      const double theta = dpk(j, m) + dhnk(j) + d_l +
                           u32 * (std::abs(a) + dpk(j, m) + dmk(j) + std::abs(mxk(j) - hnk(j)) + dmk(j) + dhnk(j) +
                                  std::abs(lk(j)) + dlk(j) + std::abs(lk(j) - gk) + dlk(j) + dgk);
      psi(j, m) = std::exp(lk(j) - gk + a);
      psiu(j, m) = psi(j, m) * std::exp(theta) * (1 + e32) * (1 + e32) * (1 + u32) * (1 + u) + f2;
    }
  const VectorX<double> zpsi = psi.colwise().sum().transpose(), zpsiu = psiu.colwise().sum().transpose();
  const MatrixR<double> va = v.cwiseAbs(), vau = (va.array() * (1 + u) + eta).matrix();
  const MatrixR<double> spsi = psi.transpose() * v, spsia = psi.transpose() * va, spsiu = psiu.transpose() * vau;
  const double input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  // Eager stores the key sum and the key–value state: their envelopes in the format.
  const double rho_state = (1 + gamma32(double(nk + 1))) * std::pow(1 + u, e);
  const bool global_none = input_max >= big || psiu.maxCoeff() >= big ||
                           (eager && rho_state * std::max(zpsiu.maxCoeff(), spsiu.maxCoeff()) >= big);
  const Index off = nk - nq;
  b.reference.resize(nq, dv);
  b.output.resize(nq, dv);
  VectorX<double> phi(mf), phiu(mf);
  for (Index i = 0; i < nq; ++i) {
    double mxq, dmq, lq, dlq;
    log_scale(i, pq, dpq, hnq, dhnq, mxq, dmq, lq, dlq);
    const double base = lq + gk, dbase = dlq + dgk + u32 * (std::abs(base) + dlq + dgk);
    // The row's band and its logits ℓ_ij = s·q_iᵀk_j with their moves D_ij (eager: stored once more).
    const Index c = i + off, first = std::max<Index>(0, c - window), last = std::min(nk - 1, c + window);
    const Index len = std::max<Index>(0, last - first + 1);
    VectorX<double> ell(len), dell(len);
    bool none = global_none;
    double rmax = base, dr = dbase;
    for (Index t = 0; t < len; ++t) {
      const Index j = first + t;
      ell(t) = (rs * q.row(i)).dot(rs * k.row(j));
      const double formed = (rs * qs.row(i)).dot(rs * ks.row(j));
      const double mag = s * qs.row(i).cwiseAbs().dot(ks.row(j).cwiseAbs());
      dell(t) = std::abs(formed - ell(t)) + e_logit * mag + double(d) * eta32 +
                f64 * s * q.row(i).cwiseAbs().dot(k.row(j).cwiseAbs());
      if (eager) {
        none = none || std::abs(ell(t)) + dell(t) >= big / (1 + u);
        dell(t) += u * (std::abs(ell(t)) + dell(t)) + eta;
      }
      rmax = std::max(rmax, ell(t));
      dr = std::max(dr, dell(t));
    }
    // The row's reference R̂ (the emulation's max(b̂ase, max ℓ̂)) is within ΔR of R; a factor e^{R − R̂} common to
    // the row's numerators and row sum cancels in O, so everything is in units of e^{R} and the absolute terms
    // (formed in units of e^{R̂}) grow by e^{ΔR}.
    const double r = rmax, er = std::exp(dr);
    // Queries: Φ_im = e^{base − R}·e^{pq_im − mxq} (est_scale, a float32 exp; the stored feature, another): the pivot
    // mx̂q cancels between the two, ĝk with the keys'.
    const double f1 = 2 * er * (1 + e32) * (2 * floor32 * (1 + u) + eta);
    for (Index m = 0; m < mf; ++m) {
      const double a = pq(i, m) - mxq;
      const double theta = dpq(i, m) + dhnq(i) + d_l +
                           u32 * (std::abs(a) + dpq(i, m) + dmq + std::abs(mxq - hnq(i)) + dmq + dhnq(i) +
                                  std::abs(lq) + dlq + std::abs(base) + dbase + std::abs(base - r) + dbase + dr);
      phi(m) = std::exp(base - r + a);
      phiu(m) = phi(m) * std::exp(theta) * (1 + e32) * (1 + e32) * (1 + u) + f1;
    }
    const double phiu_sum = phiu.sum();
    // Float32's underflowing products (η₃₂ each) in the row's sums, in units of e^{R}.
    const double under = double(nk + mf + len + 4) * eta32 * er * (1 + 2 * phiu_sum);
    // The estimate over every key: row sum est_scale·(φ̂·Σψ̂), numerator (φ̂·Ψ̂ᵀV̂)·est_scale; under eager the
    // stored key sum and state (η per entry).
    const double rho_d = rho_state * (1 + gamma32(double(mf + 1))) * (1 + u32);
    const double rho_n = rho_d * (1 + gamma32(double(len + 2)));
    const double est_d_up = rho_d * phiu.dot(zpsiu) + e * eta * er * phiu_sum * 1.01 + under;
    const double est_d_ref = phi.dot(zpsi);
    // The band: Ĉ_ij = stored(e^{ℓ̂ − R̂} − est_scale·φ̂ᵀψ̂_j), C_ij = e^{ℓ − R} − φᵀψ_j.
    double den_ref = est_d_ref, band_err_d = 0, band_abs = 0;
    VectorX<double> cref(len), cerr(len), cup(len);
    for (Index t = 0; t < len; ++t) {
      const Index j = first + t;
      const double x = std::exp(ell(t) - r);
      const double thx = dell(t) + u32 * (r - ell(t) + dell(t) + dr);
      const double x_up = x * std::exp(thx) * (1 + e32) + floor32 * er;
      const double x_err = x * (std::exp(thx) * (1 + e32) - 1) + 2 * floor32 * er;
      const double est = phi.dot(psi.row(j).transpose());
      const double est_up = (1 + u32) * (1 + gamma32(double(mf))) * phiu.dot(psiu.row(j).transpose()) +
                            double(mf + 1) * eta32 * er;
      const double pre_up = x_up + est_up;
      if ((1 + u32) * pre_up * er >= big / (1 + u)) none = true;  // Ĉ stored in the format (in units of e^{R̂})
      cref(t) = x - est;
      cerr(t) = x_err + (est_up - est) + u32 * pre_up + u * (1 + u32) * pre_up + eta * er;
      cup(t) = std::abs(cref(t)) + cerr(t);
      den_ref += cref(t);
      band_err_d += cerr(t);
      band_abs += cup(t);
    }
    const double gl = gamma32(double(len + 1));
    double ed = (est_d_up - est_d_ref) + band_err_d + gl * band_abs + u32 * (est_d_up + (1 + gl) * band_abs) +
                1e-15 * (est_d_up + band_abs);
    const double den_up = den_ref + ed;
    if (eager) ed += u * den_up + eta * er;  // the row sum stored
    none = none || den_up * er >= (eager ? big / (1 + u) : max32) || !(den_ref - ed > 0);
    const bool counted = none;
    b.rows_without_guarantee += counted;
    for (Index cc = 0; cc < dv; ++cc) {
      double num_ref = phi.dot(spsi.col(cc)), num_abs = phi.dot(spsia.col(cc));
      double band_err_n = 0, band_up = 0;
      for (Index t = 0; t < len; ++t) {
        const Index j = first + t;
        num_ref += cref(t) * v(j, cc);
        num_abs += std::abs(cref(t)) * va(j, cc);
        band_err_n += cerr(t) * vau(j, cc) + std::abs(cref(t)) * (u * va(j, cc) + eta);
        band_up += cup(t) * vau(j, cc);
      }
      const double o = num_ref / den_ref;
      b.reference(i, cc) = o;
      if (none) {
        b.output(i, cc) = inf;
        continue;
      }
      const double est_n_up = rho_n * phiu.dot(spsiu.col(cc)) + e * eta * er * phiu_sum * 1.01 + under;
      const double est_n_ref = phi.dot(spsia.col(cc));
      double en = (est_n_up - est_n_ref) + band_err_n + gl * band_up + 1e-15 * (est_n_up + band_up);
      const double num_up = std::abs(num_ref) + en;
      if (num_up * er >= (eager ? big / (1 + u) : max32)) {
        b.output(i, cc) = inf;
        none = true;
        continue;
      }
      if (eager) en += u * num_up + eta * er;  // the numerators stored
      b.output(i, cc) = divided_entry(en, ed, std::abs(o), den_ref, 1 + u32, u, eta) +
                        1e-12 * (std::abs(o) + num_abs / den_ref);
    }
    if (none) {  // (a numerator that may overflow: the whole row without a guarantee)
      b.output.row(i).setConstant(inf);
      b.rows_without_guarantee += !counted;
    }
    // O is stored in the format: a row whose entries may reach its largest value has no guarantee.
    if (!none && (b.reference.row(i).cwiseAbs() + b.output.row(i)).maxCoeff() >= big / (1 + u)) {
      b.output.row(i).setConstant(inf);
      ++b.rows_without_guarantee;
    }
  }
  return b;
}

KernelRoundingBound nystrom_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v, Index landmarks, const ConstRef<double>& z,
                                           const ConstRef<double>& z32, const AttentionOptions& opts,
                                           const std::vector<Index>& rows_q, const std::vector<Index>& rows_k) {
  require(!opts.causal, "nystrom rounding bound: Nyström is non-causal");
  require(rows_q.size() == rows_k.size() && (rows_q.empty() || Index(rows_q.size()) == landmarks),
          "nystrom rounding bound: {} and {} landmark rows for {} landmarks", rows_q.size(), rows_k.size(),
          landmarks);
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), m = landmarks;
  require(v.rows() == nk && m >= 1 && m <= std::min(nq, nk) && z.rows() == m && z.cols() == m && z32.rows() == m &&
              z32.cols() == m,
          "nystrom rounding bound: V {} rows, K {}; {} landmarks; Z {}×{}, the emulated run's {}×{}", v.rows(), nk, m,
          z.rows(), z.cols(), z32.rows(), z32.cols());
  require(opts.storage != Storage::native, "nystrom rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  const double e = eager ? 1 : 0;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32, eta32 = kEta32, f64 = std::ldexp(1.0, -53);
  const double big = largest_finite(format);
  const double s = opts.resolved_scale(d);
  // A logit: d products summed, stored (eager), times the scale — itself rounded to float32 —, stored (eager).
  const double ez = scaled_logit_error(d, u, eager);
  const double p_abs = stored_exp_floor(u, eta);
  const MatrixR<double> qs = stored_in(format, q), ks = stored_in(format, k), vs = stored_in(format, v);
  // The landmarks: segment means of the stored rows in float32 (a sum of len terms and a division), stored; or
  // (select=random) the sampled stored rows themselves, exactly.
  const auto landmark = [&](const ConstRef<double>& x, const MatrixR<double>& xs, const std::vector<Index>& rows,
                            MatrixR<double>& l, MatrixR<double>& dl) {
    const Index n = x.rows();
    l.resize(m, d);
    dl.resize(m, d);
    for (Index g = 0; g < m && !rows.empty(); ++g) {
      const Index r = rows[std::size_t(g)];
      require(r >= 0 && r < n, "nystrom rounding bound: landmark row {} of {}", r, n);
      l.row(g) = x.row(r);
      dl.row(g) = (xs.row(r) - x.row(r)).cwiseAbs();
    }
    for (Index g = 0; g < m && rows.empty(); ++g) {
      const Index b0 = segment_begin(g, n, m), len = segment_begin(g + 1, n, m) - b0;
      const double gl = gamma32(double(len + 1));
      const MatrixR<double> mag = xs.middleRows(b0, len).cwiseAbs().colwise().mean();
      const MatrixR<double> formed = xs.middleRows(b0, len).colwise().mean();
      l.row(g) = x.middleRows(b0, len).colwise().mean();
      dl.row(g) = (formed - l.row(g)).cwiseAbs() + gl * mag + 4 * double(len + 2) * f64 * mag;
      dl.row(g).array() += u * (formed.cwiseAbs().array() + gl * mag.array()) + eta + eta32;
    }
  };
  MatrixR<double> ql, dql, kl, dkl;
  landmark(q, qs, rows_q, ql, dql);
  landmark(k, ks, rows_k, kl, dkl);
  // A materialised softmax's rows (exact_matrix: the logits QKᵀ and s·QKᵀ, stored under eager; P stored): given each
  // logit's move D_ij, every probability within [p/R_i, p·R_i] ± p_abs, R_i = e^{2 max_j D_ij}(1+u)²(1+γ_{n+8})²
  // (SoftmaxRoundingAnalysis' materialised bound). `mag` bounds the computed logits' magnitudes; a row whose logits
  // may reach the largest value of what holds them (eager: the format), before the scale or after it, has none.
  const auto softmax_rows = [&](const MatrixR<double>& logits, const MatrixR<double>& moves, const MatrixR<double>& mag,
                                MatrixR<double>& p, MatrixR<double>& dp, std::vector<char>& none) {
    const Index rows = logits.rows(), cols = logits.cols();
    const double limit = eager ? big / (1 + u) : kMax32;
    p.resize(rows, cols);
    dp.resize(rows, cols);
    none.assign(std::size_t(rows), 0);
    for (Index i = 0; i < rows; ++i) {
      const double mx = logits.row(i).maxCoeff(), zmax = mag.row(i).maxCoeff() * (1 + ez);
      none[std::size_t(i)] = zmax * std::max(1.0, 1 / s) >= limit;
      const double dmax = moves.row(i).maxCoeff() + 2 * u32 * zmax + 2 * e * eta;
      const double r = std::exp(2 * dmax) * (1 + u) * (1 + u) * std::pow(1 + gamma32(double(cols + 8)), 2);
      p.row(i) = (logits.row(i).array() - mx).exp();
      p.row(i) /= p.row(i).sum();
      dp.row(i) = ((r - 1) * p.row(i).array() + p_abs + 1e-15 * p.row(i).array()).matrix();
    }
  };
  // F = softmax(s·QK̃ᵀ) (n_q × m): queries stored (known exactly), landmark keys within ΔK̃.
  const MatrixR<double> klu = kl.cwiseAbs() + dkl;
  MatrixR<double> mag_f = s * qs.cwiseAbs() * klu.transpose();
  MatrixR<double> moves_f = s * ((qs - q).cwiseAbs() * klu.transpose() + q.cwiseAbs() * dkl.transpose()) +
                            ez * mag_f + 2 * double(d + 2) * f64 * s * (q.cwiseAbs() * kl.cwiseAbs().transpose());
  MatrixR<double> f, df;
  std::vector<char> none_f;
  softmax_rows(s * q * kl.transpose(), moves_f, mag_f, f, df, none_f);
  // B = softmax(s·Q̃Kᵀ) (m × n_k): landmark queries within ΔQ̃, keys stored (known exactly).
  const MatrixR<double> qlu = ql.cwiseAbs() + dql, ksa = ks.cwiseAbs();
  MatrixR<double> mag_b = s * qlu * ksa.transpose();
  MatrixR<double> moves_b = s * (dql * ksa.transpose() + ql.cwiseAbs() * (ks - k).cwiseAbs().transpose()) +
                            ez * mag_b + 2 * double(d + 2) * f64 * s * (ql.cwiseAbs() * k.cwiseAbs().transpose());
  MatrixR<double> bm, db;
  std::vector<char> none_b;
  softmax_rows(s * ql * k.transpose(), moves_b, mag_b, bm, db, none_b);
  const bool any_b = std::any_of(none_b.begin(), none_b.end(), [](char c) { return c != 0; });
  // B·V (m × d_v), summed in float32 over n_k, stored: |B̂V̂ − BV| ≤ ΔB|V̂| + B|V̂ − V| + γ_{n_k}(B + ΔB)|V̂|.
  const MatrixR<double> vsa = vs.cwiseAbs(), bv = bm * v;
  const MatrixR<double> ew =
      stored_error(product_error(bm, db, bm + db, v.cwiseAbs(), (vs - v).cwiseAbs(), vsa, nk, 1e-15), bv, u, eta);
  const MatrixR<double> wu = bv.cwiseAbs() + ew;
  // A float32 partial sum may pass float32's largest value before it cancels: bounded by the magnitudes' product.
  const bool bv_over = wu.maxCoeff() >= big / (1 + u) || ((bm + db) * vsa).maxCoeff() >= kMax32;
  // F·Ẑ (n_q × m), summed in float32 over m, stored — with the emulated run's Ẑ against the float64 run's Z: their
  // difference enters as computed.
  const MatrixR<double> fz = f * z;
  const MatrixR<double> ey = stored_error(
      product_error(f, df, f + df, z.cwiseAbs(), (z32 - z).cwiseAbs(), z32.cwiseAbs(), m, 1e-15), fz, u, eta);
  const MatrixR<double> yu = fz.cwiseAbs() + ey;
  // O = (F·Ẑ)·(B·V), summed in float32 over m, stored.
  b.reference = fz * bv;
  const MatrixR<double> eo = product_error(fz.cwiseAbs(), ey, yu, bv.cwiseAbs(), ew, wu, m, 1e-12);
  b.output = (eo.array() * (1 + u) + u * b.reference.cwiseAbs().array() + eta).matrix();
  const VectorX<double> fz_sums = ((f + df) * z32.cwiseAbs()).rowwise().maxCoeff(),
                        o_sums = (yu * wu).rowwise().maxCoeff();
  give_up_rows(b, big, u, [&](Index i) {
    return any_b || bv_over || none_f[std::size_t(i)] || yu.row(i).maxCoeff() >= big / (1 + u) ||
           fz_sums(i) >= kMax32 || o_sums(i) >= kMax32;
  });
  return b;
}

namespace {

/// P = softmax(s·QKᵀ) (n_q × n_k, float64 from the exact inputs) and what float32's ExactOperator makes of it from the
/// stored rows `qs`, `ks` (row_lse, then exp(ℓ̂_ij − L̂_i) per entry: cur_rounding_bound's header): every entry within
/// [p/ρ_i, p·ρ_i] ± p_abs, so |P̂ − P| ≤ dp = (ρ_i − 1)·p + p_abs (+ float64's own rounding); `none` the rows where a
/// logit, before or after the scale, may reach float32's largest value.
struct StreamedProbabilities {
  MatrixR<double> p, dp;
  VectorX<double> rho;
  std::vector<char> none;
  double p_abs = kMin32 * (1 + kU32) + kEta32;
};

StreamedProbabilities streamed_probabilities(const ConstRef<double>& q, const ConstRef<double>& k,
                                             const MatrixR<double>& qs, const MatrixR<double>& ks, double s) {
  const Index nq = q.rows(), nk = k.rows(), d = q.cols();
  const double u32 = kU32, f64 = std::ldexp(1.0, -53);
  const MatrixR<double> logits = s * q * k.transpose();
  const MatrixR<double> mag = s * qs.cwiseAbs() * ks.cwiseAbs().transpose();
  // A logit: d products summed, times the scale (itself rounded to float32), in float32.
  const double ez = (1 + gamma32(double(d))) * (1 + u32) * (1 + u32) - 1;
  const MatrixR<double> moves = s * ((qs - q).cwiseAbs() * ks.cwiseAbs().transpose() +
                                     q.cwiseAbs() * (ks - k).cwiseAbs().transpose()) +
                                ez * mag + 2 * double(d + 2) * f64 * s * (q.cwiseAbs() * k.cwiseAbs().transpose());
  StreamedProbabilities r;
  r.p.resize(nq, nk);
  r.rho.resize(nq);
  r.none.assign(std::size_t(nq), 0);
  const double ln_n = std::log(double(nk));
  for (Index i = 0; i < nq; ++i) {
    const double zi = mag.row(i).maxCoeff() * (1 + ez);
    r.none[std::size_t(i)] = zi * std::max(1.0, 1 / s) >= kMax32 / 2;  // q·k is formed before the scale
    const double eps = 2 * gamma32(double(2 * nk + 8)) + u32 * (8 * zi + 4 * ln_n + 4);
    r.rho(i) = std::exp(2 * moves.row(i).maxCoeff() + eps) * (1 + 4 * u32);  // Eigen's float32 exp: within 4u₃₂
    const double mx = logits.row(i).maxCoeff();
    r.p.row(i) = (logits.row(i).array() - mx).exp();
    r.p.row(i) /= r.p.row(i).sum();
  }
  r.dp.resize(nq, nk);
  for (Index i = 0; i < nq; ++i)
    r.dp.row(i) = (r.rho(i) - 1) * r.p.row(i).array() + r.p_abs + 1e-15 * r.p.row(i).array();
  return r;
}

/// A state W = X·V (X: m × n_k, within dx of the reference x, its stored values' magnitudes at most xu) summed in
/// float32 over n_k and stored under eager: W (float64, from x), the bound ew on the stored state's distance from it
/// and the envelope wu = |W| + ew. CUR's R·V, the SVD oracle's V_Rᵀ·V, soft VQ's RᵀV and Rᵀ1.
struct StoredState {
  MatrixR<double> w, ew, wu;
};

StoredState stored_state(const MatrixR<double>& x, const MatrixR<double>& dx, const MatrixR<double>& xu,
                         const ConstRef<double>& v, const MatrixR<double>& vs, bool eager, double u, double eta) {
  StoredState st;
  st.w = x * v;
  st.ew = product_error(x.cwiseAbs(), dx, xu, v.cwiseAbs(), (vs - v).cwiseAbs(), vs.cwiseAbs(), x.cols(), 1e-15);
  if (eager) st.ew = stored_error(st.ew, st.w, u, eta);
  st.wu = st.w.cwiseAbs() + st.ew;
  return st;
}

/// `x`·G with G the orthogonal matrix nearest to taking x to `target` (orthogonal Procrustes, Schönemann 1966:
/// G = U·Wᵀ from xᵀ·target = U·Σ·Wᵀ): two bases of (nearly) one subspace, aligned.
MatrixR<double> procrustes_aligned(const ConstRef<double>& x, const ConstRef<double>& target) {
  const DenseSvd svd = jacobi_svd(Eigen::MatrixXd(x.transpose() * target), Eigen::ComputeFullU | Eigen::ComputeFullV);
  return x * (svd.u * svd.v.transpose());
}

/// The last product of a factored output, O = A·W summed in float32 over `depth` and stored (CUR's, the SVD oracle's):
/// b.reference and b.output from A, W (n_q × depth, depth × d_v), their error bounds ea, ew and envelopes au, wu; then
/// the rows without a guarantee: those `none(i)` names, and where A's row may reach the format's largest value `big`
/// or a float32 partial sum float32's (`a_sums`: each row's largest Σ of A's terms' magnitudes; the O sums' |Â||Ŵ|).
template <typename None>
void stored_last_product(KernelRoundingBound& b, const MatrixR<double>& a, const MatrixR<double>& ea,
                         const MatrixR<double>& au, const MatrixR<double>& w, const MatrixR<double>& ew,
                         const MatrixR<double>& wu, Index depth, const VectorX<double>& a_sums, double big, None none) {
  const double u = b.u;
  b.reference = a * w;
  const MatrixR<double> eo = product_error(a.cwiseAbs(), ea, au, w.cwiseAbs(), ew, wu, depth, 1e-12);
  b.output = stored_error(eo, b.reference, u, b.eta);
  const VectorX<double> o_sums = (au * wu).rowwise().maxCoeff();
  give_up_rows(b, big, u, [&](Index i) {
    return none(i) || au.row(i).maxCoeff() >= big / (1 + u) || a_sums(i) >= kMax32 || o_sums(i) >= kMax32;
  });
}

}  // namespace

KernelRoundingBound cur_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k, const ConstRef<double>& v,
                                       const std::vector<Index>& rows, const std::vector<Index>& cols,
                                       const ConstRef<double>& z, const ConstRef<double>& z32,
                                       const AttentionOptions& opts) {
  require(!opts.causal, "cur rounding bound: CUR is non-causal");
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), c = Index(cols.size());
  require(v.rows() == nk && c >= 1 && Index(rows.size()) == c && z.rows() == c && z.cols() == c &&
              z32.rows() == c && z32.cols() == c,
          "cur rounding bound: V {} rows, K {}; {} rows and {} columns sampled; Z {}×{}, the emulated run's {}×{}",
          v.rows(), nk, rows.size(), c, z.rows(), z.cols(), z32.rows(), z32.cols());
  for (Index j : cols) require(j >= 0 && j < nk, "cur rounding bound: column {} of {}", j, nk);
  for (Index i : rows) require(i >= 0 && i < nq, "cur rounding bound: row {} of {}", i, nq);
  require(opts.storage != Storage::native, "cur rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta;
  const double big = largest_finite(format);
  const double s = opts.resolved_scale(d);
  const MatrixR<double> qs = stored_in(format, q), ks = stored_in(format, k), vs = stored_in(format, v);
  // P (n_q × n_k) and each row's probability ratio ρ_i.
  const StreamedProbabilities sp = streamed_probabilities(q, k, qs, ks, s);
  const MatrixR<double>& p = sp.p;
  const VectorX<double>& rho = sp.rho;
  const std::vector<char>& none = sp.none;
  const double p_abs32 = sp.p_abs;
  // C = P[:, J] in float32; R = P[I, :] in float32, then stored.
  MatrixR<double> cm(nq, c), dc(nq, c), rm(c, nk), dr(c, nk);
  for (Index t = 0; t < c; ++t) {
    cm.col(t) = p.col(cols[std::size_t(t)]);
    dc.col(t) = sp.dp.col(cols[std::size_t(t)]);
    rm.row(t) = p.row(rows[std::size_t(t)]);
  }
  bool any_r = false;
  for (Index t = 0; t < c; ++t) {
    const Index i = rows[std::size_t(t)];
    any_r = any_r || none[std::size_t(i)];
    dr.row(t) = ((rho(i) * (1 + u) - 1) * rm.row(t).array() + p_abs32 * (1 + u) + eta + 1e-15 * rm.row(t).array());
  }
  // A = C·Ẑ (n_q × c), summed in float32 over c, stored (both policies) — the emulated run's Ẑ against the float64
  // run's Z: their difference enters as computed.
  const MatrixR<double> a = cm * z;
  const MatrixR<double> ea = stored_error(
      product_error(cm, dc, cm + dc, z.cwiseAbs(), (z32 - z).cwiseAbs(), z32.cwiseAbs(), c, 1e-15), a, u, eta);
  const MatrixR<double> au = a.cwiseAbs() + ea;
  // R·V (c × d_v), summed in float32 over n_k; stored under eager.
  const MatrixR<double> ru = rm + dr;
  const StoredState w = stored_state(rm, dr, ru, v, vs, eager, u, eta);
  // A float32 partial sum may pass float32's largest value before it cancels: bounded by the magnitudes' product.
  const bool w_over = w.wu.maxCoeff() >= (eager ? big / (1 + u) : kMax32) || (ru * vs.cwiseAbs()).maxCoeff() >= kMax32;
  // O = A·(R·V), summed in float32 over c, stored.
  stored_last_product(b, a, ea, au, w.w, w.ew, w.wu, c, ((cm + dc) * z32.cwiseAbs()).rowwise().maxCoeff(), big,
                      [&](Index i) { return any_r || w_over || none[std::size_t(i)]; });
  return b;
}

KernelRoundingBound svd_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k, const ConstRef<double>& v,
                                       const ConstRef<double>& vr, const ConstRef<double>& vr32,
                                       const AttentionOptions& opts) {
  require(!opts.causal, "svd rounding bound: the SVD oracle is non-causal");
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  const Index nk = k.rows(), d = q.cols(), r = vr.cols();
  require(v.rows() == nk && r >= 1 && vr.rows() == nk && vr32.rows() == nk && vr32.cols() == r,
          "svd rounding bound: V {} rows, K {}; V_R {}×{}, the emulated run's {}×{}", v.rows(), nk, vr.rows(), r,
          vr32.rows(), vr32.cols());
  require(opts.storage != Storage::native, "svd rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta;
  const double big = largest_finite(format);
  const MatrixR<double> qs = stored_in(format, q), ks = stored_in(format, k), vs = stored_in(format, v);
  const StreamedProbabilities sp = streamed_probabilities(q, k, qs, ks, opts.resolved_scale(d));
  const MatrixR<double>& p = sp.p;
  const MatrixR<double>& dp = sp.dp;
  // The basis of the top singular subspace is arbitrary (a sign per vector; any rotation among close singular
  // values) and P·V_R·V_Rᵀ is the same for V_R·G, G orthogonal: the float64 run's basis is taken as V_R·G with G the
  // rotation nearest the emulated run's (orthogonal Procrustes: G = U·Wᵀ from V_Rᵀ·V̂_R = U·Σ·Wᵀ), so that only the
  // subspace's move counts as rounding. The float64 output is unchanged but for float64's rounding (the slack).
  const MatrixR<double> z = procrustes_aligned(vr, vr32);
  // A = P̂·V_R (n_q × R) in float32 over n_k, from the emulated run's V_R before its storing (ExactOperator::apply),
  // then stored (both policies): V̂_R − V_R enters as computed.
  const MatrixR<double> a = p * z;
  const MatrixR<double> ea = stored_error(
      product_error(p, dp, p + dp, z.cwiseAbs(), (vr32 - z).cwiseAbs(), vr32.cwiseAbs(), nk, 1e-15), a, u, eta);
  const MatrixR<double> au = a.cwiseAbs() + ea;
  // B = V_R stored (both policies; known exactly), W = B̂ᵀ·V̂ (R × d_v) in float32 over n_k, stored under eager.
  const MatrixR<double> bs = stored_in(format, vr32), bu = bs.transpose().cwiseAbs();
  const StoredState w = stored_state(z.transpose(), (bs - z).transpose().cwiseAbs(), bu, v, vs, eager, u, eta);
  // A float32 partial sum may pass float32's largest value before it cancels: bounded by the magnitudes' product.
  const bool w_over = w.wu.maxCoeff() >= (eager ? big / (1 + u) : kMax32) || (bu * vs.cwiseAbs()).maxCoeff() >= kMax32;
  // O = Â·Ŵ over R, stored.
  stored_last_product(b, a, ea, au, w.w, w.ew, w.wu, r, ((p + dp) * vr32.cwiseAbs()).rowwise().maxCoeff(), big,
                      [&](Index i) { return w_over || sp.none[std::size_t(i)]; });
  return b;
}

KernelRoundingBound taylor_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                          const ConstRef<double>& v, const AttentionOptions& opts, Index chunk) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  require(v.rows() == k.rows(), "taylor rounding bound: V has {} rows, K has {}", v.rows(), k.rows());
  require(opts.storage != Storage::native, "taylor rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const double u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32;
  const double floor32 = kMin32;
  const Index d = q.cols();
  const double gd = gamma32(double(d));
  // x/‖x‖ in float32: the squared norm within γ_d, its square root and the division each within u₃₂.
  const double e_t = (1 + u32) * (1 + u32) / (std::sqrt(1 - gd) * (1 - u32)) - 1;
  // φ = [1, x/‖x‖] (0 for a zero row, as the method takes it), |φ| and Φ⁺ = |φ| + |φ̂ − φ|: the stored row known
  // exactly (round_to), so |φ(x̂) − φ(x)| is computed; then float32's relative e_t and its floor, the storing.
  const auto features = [&](const ConstRef<double>& x, MatrixR<double>& f, MatrixR<double>& fa, MatrixR<double>& up) {
    const Index n = x.rows();
    f.resize(n, d + 1);
    up.resize(n, d + 1);
    f.col(0).setOnes();
    up.col(0).setOnes();  // the constant feature is exact in every format
    for (Index i = 0; i < n; ++i) {
      VectorX<double> xs(d);
      for (Index c = 0; c < d; ++c) xs(c) = round_to(format, double(float(x(i, c))));
      const double nx = x.row(i).norm(), ns = xs.norm();
      // float32's ‖x̂‖² may overflow (the norm inf, the direction 0) or lose its relative accuracy among subnormal
      // squares (bf16 holds such rows; fp16 cannot): no guarantee for such a row — an infinite envelope, so a query
      // row gives up and a key row gives up for every query that sees it.
      const double sq = ns * ns;
      if (sq > 0 && (sq < std::ldexp(1.0, -100) ||
                     sq * (1 + gd) * (1 + u32) * (1 + u32) >= kMax32)) {
        for (Index c = 0; c < d; ++c) f(i, c + 1) = nx > 0 ? x(i, c) / nx : 0.0;
        up.row(i).tail(d).setConstant(std::numeric_limits<double>::infinity());
        continue;
      }
      for (Index c = 0; c < d; ++c) {
        const double exact = nx > 0 ? x(i, c) / nx : 0.0, known = ns > 0 ? xs(c) / ns : 0.0;
        f(i, c + 1) = exact;
        const double formed = std::abs(known) * (1 + e_t) + floor32;
        up(i, c + 1) = std::abs(exact) + std::abs(known - exact) + std::abs(known) * e_t + floor32 + u * formed + eta +
                       4 * std::ldexp(1.0, -53) * double(d + 2) * (std::abs(known) + std::abs(exact));
      }
    }
    fa = f.cwiseAbs();
  };
  MatrixR<double> fq, fqa, fqu, fk, fka, fku;
  features(q, fq, fqa, fqu);
  features(k, fk, fka, fku);
  const double input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  if (opts.causal) return causal_kernel_bound(fqa, fqu, fka, fku, v, input_max, chunk, opts, &fq, &fk);
  return kernel_bound(fqa, fqu, fka, fku, v, input_max, k.rows(), opts, &fq, &fk);
}

KernelRoundingBound efficient_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                             const ConstRef<double>& v, const AttentionOptions& opts) {
  require(q.cols() == k.cols() && v.rows() == k.rows() && q.rows() >= 1 && k.rows() >= 1,
          "efficient rounding bound: Q {}×{}, K {}×{}, V {} rows", q.rows(), q.cols(), k.rows(), k.cols(), v.rows());
  require(!opts.causal, "efficient rounding bound: efficient attention is non-causal");
  require(opts.storage != Storage::native, "efficient rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32, e32 = 4 * u32, floor32 = kMin32;
  const double eta32 = kEta32, big = largest_finite(format);
  const double inf = std::numeric_limits<double>::infinity();
  const Index n = k.rows(), d = q.cols();
  // A softmax over a vector x in float32 from its stored x̂ (the max, e^{x̂ − max} within 4u₃₂ after the
  // subtraction's u₃₂, their sum within γ_m, the division within u₃₂), then stored: each entry within
  // p·(R·e^{2Δ}(1+u) − 1) + 2⁻¹²⁶(1+u) + η of the exact softmax p of x, Δ = max|x̂ − x| (its conditioning, as the
  // header's), R = e^{2u₃₂·max|x̂ − max x̂|}(1+4u₃₂)²(1+γ_m)(1+u₃₂).
  bool softmax_overflow = false;  // e^{2Δ} beyond double's range: no guarantee (and 0·inf is NaN)
  const auto softmax_bound = [&](const VectorX<double>& x, const VectorX<double>& xs, VectorX<double>& p,
                                 VectorX<double>& dp) {
    const Index m = x.size();
    const double mx = x.maxCoeff(), mxs = xs.maxCoeff();
    p = (x.array() - mx).exp();
    p /= p.sum();
    const double delta = (xs - x).cwiseAbs().maxCoeff(), width = (xs.array() - mxs).abs().maxCoeff();
    const double r = std::exp(2 * u32 * width) * (1 + e32) * (1 + e32) * (1 + gamma32(double(m))) * (1 + u32);
    const double ratio = r * std::exp(2 * delta) * (1 + u);
    if (!std::isfinite(ratio)) {
      softmax_overflow = true;
      dp = VectorX<double>::Zero(m);
      return;
    }
    dp = (p * (ratio - 1)).array() + floor32 * (1 + u) + eta;
  };
  const MatrixR<double> qs = stored_in(format, q), ks = stored_in(format, k), vs = stored_in(format, v);
  MatrixR<double> a(q.rows(), d), da(q.rows(), d), bk(n, d), db(n, d);
  for (Index i = 0; i < q.rows(); ++i) {
    VectorX<double> p, dp;
    softmax_bound(q.row(i).transpose(), qs.row(i).transpose(), p, dp);
    a.row(i) = p.transpose();
    da.row(i) = dp.transpose();
  }
  for (Index c = 0; c < d; ++c) {
    VectorX<double> p, dp;
    softmax_bound(k.col(c), ks.col(c), p, dp);
    bk.col(c) = p;
    db.col(c) = dp;
  }
  // C = BᵀV (d × d_v): the stored B and V (|V̂ − V| known), the float32 sum over n, stored under eager.
  const MatrixR<double> va = v.cwiseAbs(), vup = va + (vs - v).cwiseAbs();
  const MatrixR<double> bup = bk + db;
  const double e = eager ? 1 : 0;
  const MatrixR<double> c = bk.transpose() * v;
  const MatrixR<double> c_up = ((bup.transpose() * vup) * ((1 + gamma32(double(n))) * std::pow(1 + u, e))).array() +
                               e * eta + double(n) * eta32;
  const MatrixR<double> dc = c_up - bk.transpose() * va;  // ≥ |Ĉ − C|: Ĉ's envelope less the exact |B|ᵀ|V|
  // O = ÂĈ in float32 (γ_d), stored.
  const MatrixR<double> o = a * c;
  b.reference = o;
  const MatrixR<double> err = (da * c_up + a * dc + gamma32(double(d)) * (a + da) * c_up).array() + double(d) * eta32;
  b.output = (err * (1 + u) + u * o.cwiseAbs()).array() + eta;
  const double input_max = std::max({q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff()});
  const bool overflow = softmax_overflow || input_max >= big || (eager && c_up.maxCoeff() >= big) ||
                        !(c_up.maxCoeff() < kMax32);  // C's float32 sums
  for (Index i = 0; i < o.rows(); ++i)
    if (overflow || (o.row(i).cwiseAbs() + b.output.row(i)).maxCoeff() >= big / (1 + u)) {
      b.output.row(i).setConstant(inf);
      ++b.rows_without_guarantee;
    }
  return b;
}

namespace {

/// ProbSparse's causal rows (probsparse_rounding_bound's causal case): the exact rows as the non-causal case; lazy
/// row i with m = i + off + 1 visible keys holds the prefix Σ_{j<m} v̂_j — a running float32 sum, so the computed
/// prefix is a recursive sum of m terms, within γ_m·Σ|v̂_j| (Higham 2002 §4.2) — times fl(1/m) (lazy=mean; 1 under
/// lazy=cumsum, exact) in float32, then stored. Against the float64 method's own prefix (its sum within 4m·2⁻⁵³·Σ|v|):
///   |Ô_ic − O_ic| ≤ F + u·(w|S_c| + F) + η, F = w·|Ŝ_c − S_c| + ((1+γ_m)(1+u₃₂)² − 1)·w·Â_c + 4m·2⁻⁵³·w·(Â_c + A_c),
/// S, Ŝ the prefix sums of V and of the stored V̂, A, Â of their magnitudes, w the weight. +inf where the float32 sum
/// may pass float32's largest value, or the value stored may reach the format's (fp16's 65504: a cumsum row's sum).
KernelRoundingBound probsparse_causal_lazy(const SoftmaxRoundingAnalysis& exact, const SoftmaxRoundingBound& rows,
                                           const ConstRef<double>& v, const MatrixR<double>& vs,
                                           const std::vector<char>& in64, const std::vector<char>& in32, Format format,
                                           bool cumsum) {
  const Index nq = exact.o.rows(), n = v.rows(), dv = v.cols(), off = n - nq;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32, inf = std::numeric_limits<double>::infinity();
  const double big = largest_finite(format), max32 = kMax32, u64 = std::ldexp(1.0, -53);
  b.output.resize(nq, dv);
  b.reference.resize(nq, dv);
  Eigen::Matrix<double, 1, Eigen::Dynamic> s = Eigen::Matrix<double, 1, Eigen::Dynamic>::Zero(dv), ss = s, a = s,
                                           as = s;
  Index next = 0;
  for (Index i = 0; i < nq; ++i) {
    for (; next <= i + off; ++next) {
      s += v.row(next);
      ss += vs.row(next);
      a += v.row(next).cwiseAbs();
      as += vs.row(next).cwiseAbs();
    }
    const double m = double(next), w = cumsum ? 1.0 : 1.0 / m, gm = gamma32(m);
    const bool sel = in64[std::size_t(i)] != 0;
    b.reference.row(i) = sel ? exact.o.row(i) : Eigen::Matrix<double, 1, Eigen::Dynamic>(s * w);
    if (sel != (in32[std::size_t(i)] != 0)) {  // a flipped choice: no rounding bound covers it
      b.output.row(i).setConstant(inf);
      ++b.rows_without_guarantee;
      continue;
    }
    if (sel) {
      b.output.row(i) = rows.output.row(i);
    } else {
      for (Index c = 0; c < dv; ++c) {
        const double formed = w * std::abs(ss(c) - s(c)) + ((1 + gm) * (1 + u32) * (1 + u32) - 1) * w * as(c) +
                              4 * m * u64 * w * (as(c) + a(c));
        const double value = w * std::abs(s(c)) + formed;
        b.output(i, c) = (!((1 + gm) * as(c) < max32) || !(value * (1 + u) < big)) ? inf
                                                                                    : formed + u * value + eta;
      }
    }
    if (!b.output.row(i).allFinite()) ++b.rows_without_guarantee;
  }
  return b;
}

}  // namespace

KernelRoundingBound probsparse_rounding_bound(const SoftmaxRoundingAnalysis& exact, const ConstRef<double>& v,
                                              const std::vector<Index>& selected, const std::vector<Index>& chosen,
                                              const AttentionOptions& opts, bool cumsum) {
  require(!exact.over_pattern, "probsparse rounding bound: give exact attention's analysis of the same Q, K, V");
  require(opts.storage != Storage::native, "probsparse rounding bound: give a reduced storage (bf16 or fp16)");
  const Index nq = exact.o.rows(), n = v.rows(), dv = v.cols();
  require(v.rows() == exact.n_k && dv == exact.o.cols(), "probsparse rounding bound: V is not the analysis' V");
  const Index off = n - nq;
  for (Index i = 0; i < nq; ++i)  // the analysis' mask must be the call's: what each query sees
    require(exact.visible[std::size_t(i)] == (opts.causal ? std::min(n, i + off + 1) : n),
            "probsparse rounding bound: the analysis was formed under another mask than the call's ({})",
            opts.causal ? "causal" : "full");
  const Format format = storage_format(opts.storage);
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32, inf = std::numeric_limits<double>::infinity();
  const double gn = double(n) * u32 / (1 - double(n) * u32);
  std::vector<char> in64(std::size_t(nq), 0), in32(std::size_t(nq), 0);
  for (const auto* set : {&selected, &chosen})
    for (const Index i : *set) require(i >= 0 && i < nq, "probsparse rounding bound: query {} of {}", i, nq);
  for (const Index i : selected) in64[std::size_t(i)] = 1;
  for (const Index i : chosen) in32[std::size_t(i)] = 1;
  // Exact rows: exact attention's streaming bound (the emulation's tiles of kDefaultTile keys).
  const SoftmaxRoundingBound rows = exact.bound(opts, true, kDefaultTile);
  // Lazy rows: mean(V), from the stored V (known exactly) summed in float32 and scaled by fl(1/n), stored.
  const MatrixR<double> vs = stored_in(format, v);
  if (opts.causal) return probsparse_causal_lazy(exact, rows, v, vs, in64, in32, format, cumsum);
  const Eigen::Matrix<double, 1, Eigen::Dynamic> mean = v.colwise().mean(), mean_s = vs.colwise().mean(),
                                                 abs_s = vs.cwiseAbs().colwise().mean();
  Eigen::Matrix<double, 1, Eigen::Dynamic> lazy(dv);
  const double max32 = kMax32;
  for (Index c = 0; c < dv; ++c) {
    if (!((1 + gn) * abs_s(c) * double(n) < max32)) {  // ΣV's float32 partial sums may overflow
      lazy(c) = inf;
      continue;
    }
    const double formed = std::abs(mean_s(c) - mean(c)) + ((1 + gn) * (1 + u32) * (1 + u32) - 1) * abs_s(c) +
                          4 * double(n) * std::ldexp(1.0, -53) * abs_s(c);
    lazy(c) = formed + u * (std::abs(mean(c)) + formed) + eta;
  }
  b.output.resize(nq, dv);
  b.reference.resize(nq, dv);
  for (Index i = 0; i < nq; ++i) {
    const bool sel = in64[std::size_t(i)] != 0;
    b.reference.row(i) = sel ? exact.o.row(i) : mean;
    if (sel != (in32[std::size_t(i)] != 0)) {  // a flipped choice: no rounding bound covers it
      b.output.row(i).setConstant(inf);
      ++b.rows_without_guarantee;
      continue;
    }
    b.output.row(i) = sel ? rows.output.row(i) : lazy;
    if (!b.output.row(i).allFinite()) ++b.rows_without_guarantee;
  }
  return b;
}

KernelRoundingBound reformer_rounding_bound(const SoftmaxRoundingAnalysis& analysis,
                                            const std::vector<std::vector<Index>>& selected,
                                            const std::vector<std::vector<Index>>& chosen, Index rounds,
                                            const AttentionOptions& opts) {
  require(analysis.over_pattern, "reformer rounding bound: give the pattern form of the analysis (its key sets)");
  require(rounds >= 1, "reformer rounding bound: rounds = {}", rounds);
  const Index nq = analysis.o.rows();
  require(Index(selected.size()) == nq && Index(chosen.size()) == nq,
          "reformer rounding bound: key sets for {} and {} queries, the analysis has {}", selected.size(),
          chosen.size(), nq);
  // Non-causal: streamed round by round (at most `rounds` pieces per query); causal: the pattern softmax.
  const SoftmaxRoundingBound rows = analysis.bound_in_pieces(opts, opts.causal ? 0 : rounds);
  KernelRoundingBound b;
  b.u = rows.u;
  b.eta = rows.eta;
  b.output = rows.output;
  b.reference = analysis.o;
  const double inf = std::numeric_limits<double>::infinity();
  for (Index i = 0; i < nq; ++i) {
    // Key sets as P̃'s rows hold them (row_keys: ascending, duplicates merged): a bucket moved by rounding has no
    // rounding bound.
    const auto &a = selected[std::size_t(i)], &c = chosen[std::size_t(i)];
    require(Index(a.size()) == analysis.visible[std::size_t(i)] && std::is_sorted(a.begin(), a.end()) &&
                std::is_sorted(c.begin(), c.end()),
            "reformer rounding bound: row {} holds {} keys (the analysis' row {}); give P̃'s ascending row_keys", i,
            a.size(), analysis.visible[std::size_t(i)]);
    if (a != c) b.output.row(i).setConstant(inf);
    if (!b.output.row(i).allFinite()) ++b.rows_without_guarantee;
  }
  return b;
}

KernelRoundingBound vq_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& v,
                                      const ConstRef<double>& codebook, const std::vector<Index>& assigned,
                                      const std::vector<Index>& chosen, const AttentionOptions& opts) {
  return vq_rounding_bound(q, v, codebook, codebook, assigned, chosen, opts);
}

namespace {

/// Soft VQ's per-code sums as its emulation forms them (vq_soft_rounding_bound): the float64 masses N = Rᵀ1 and value
/// sums S = RᵀV, their envelopes |N| + ΔN and |S| + ΔS, the largest float32 partial sum of a code's values, and
/// `none`: no guarantee anywhere (a responsibility logit may overflow, or a code's stored mass may be 0, which the
/// emulation drops).
struct VqCodeSums {
  VectorX<double> count, n_up;
  MatrixR<double> sum, s_up;
  double partial = 0;
  bool none = false;
};

/// Per-code sums of weights X (codes × n_k, within dx of the reference x, stored magnitudes at most xu) as the soft
/// and two-codebook emulations form them: S = X·V and N = X·1 summed in float32 over n_k and stored under eager
/// (stored_state), and the largest float32 partial sum; `mass_low`, if given, the masses' lower bounds N − ΔN.
VqCodeSums weighted_code_sums(const MatrixR<double>& x, const MatrixR<double>& dx, const MatrixR<double>& xu,
                              const ConstRef<double>& v, const MatrixR<double>& vs, bool eager, double u, double eta,
                              VectorX<double>* mass_low = nullptr) {
  const MatrixR<double> ones = MatrixR<double>::Ones(x.cols(), 1);
  const StoredState sv = stored_state(x, dx, xu, v, vs, eager, u, eta);
  const StoredState sn = stored_state(x, dx, xu, ones, ones, eager, u, eta);
  VqCodeSums sums;
  sums.sum = sv.w;
  sums.s_up = sv.wu;
  sums.count = sn.w.col(0);
  sums.n_up = sn.wu.col(0);
  sums.partial = (1 + gamma32(double(x.cols()))) * (xu * vs.cwiseAbs()).maxCoeff();
  if (mass_low) *mass_low = (sn.w - sn.ew).col(0);
  return sums;
}

/// The two-codebook form's (quantize=both, vq_both_rounding_bound) per query code b the sums S_b, N_b of the key
/// weights G_bj = e^{g_bj − m_b,a(j)} as a VqCodeSums, each query's code b(i) (the float64 run's) and whether the
/// emulated run gave it another (no guarantee for that row), the maxima m_by the joint logits λ_iy + m_b(i),y add
/// and the bound on their move |m̂ − m|, and `none`: no guarantee anywhere (a key's code moved, g or a sum may
/// overflow what holds it).
struct VqBothSums {
  std::vector<VqCodeSums> sums;
  std::vector<Index> row_code;
  std::vector<char> row_flipped;
  MatrixR<double> m, dm;
  bool none = false;
};

/// Two k-means fits may number the same partition differently (k-means++ draws its seeds with probabilities that the
/// rounding moves). O does not depend on how the codes are numbered: where one numbering maps onto the other key for
/// key (a bijection between the codes in use), the emulated run's codes are renumbered as the float64 run's (into
/// chosen_as, codebook_as; true) — their sums over the codes are then taken in another order, which the γ bounds do
/// not see — and the codes no key uses (weight 0 in both runs) are paired in order. Otherwise false: the assignments
/// are compared as they are.
bool renumbered_codes(const std::vector<Index>& assigned, const std::vector<Index>& chosen,
                      const ConstRef<double>& codebook32, std::vector<Index>& chosen_as, MatrixR<double>& codebook_as) {
  const Index codes = codebook32.rows(), nk = Index(assigned.size());
  std::vector<Index> to(std::size_t(codes), -1), from(std::size_t(codes), -1);
  bool same_partition = true, renumbered = false;
  for (Index j = 0; j < nk && same_partition; ++j) {
    const Index a = assigned[std::size_t(j)], c = chosen[std::size_t(j)];
    if (to[std::size_t(c)] < 0 && from[std::size_t(a)] < 0) {
      to[std::size_t(c)] = a;
      from[std::size_t(a)] = c;
      renumbered = renumbered || a != c;
    } else {
      same_partition = to[std::size_t(c)] == a && from[std::size_t(a)] == c;
    }
  }
  if (!same_partition || !renumbered) return false;
  Index next = 0;
  for (Index c = 0; c < codes; ++c) {
    if (to[std::size_t(c)] >= 0) continue;
    while (from[std::size_t(next)] >= 0) ++next;
    to[std::size_t(c)] = next;
    from[std::size_t(next)] = c;
  }
  chosen_as.resize(chosen.size());
  for (std::size_t j = 0; j < chosen.size(); ++j) chosen_as[j] = to[std::size_t(chosen[j])];
  codebook_as.resize(codes, codebook32.cols());
  for (Index c = 0; c < codes; ++c) codebook_as.row(to[std::size_t(c)]) = codebook32.row(c);
  return true;
}

/// vq_rounding_bound, and with `soft` the soft variant's (its per-code sums in place of the assignment's), with
/// `both` the two-codebook form's (per row its query code's sums, and the maxima m added to the logits).
KernelRoundingBound vq_bound(const ConstRef<double>& q, const ConstRef<double>& v, const ConstRef<double>& codebook,
                             const ConstRef<double>& codebook32, const std::vector<Index>& assigned,
                             const std::vector<Index>& chosen, const AttentionOptions& opts, const VqCodeSums* soft,
                             const VqBothSums* both = nullptr) {
  const Index nq = q.rows(), nk = v.rows(), d = q.cols(), dv = v.cols(), codes = codebook.rows();
  require(codebook.cols() == d && codes >= 1 && Index(assigned.size()) == nk && Index(chosen.size()) == nk,
          "vq rounding bound: Q {}×{}, V {} rows, a codebook {}×{}, assignments of {} and {} keys", nq, d, nk,
          codes, codebook.cols(), assigned.size(), chosen.size());
  require(codebook32.rows() == codes && codebook32.cols() == d,
          "vq rounding bound: the emulated run's codebook is {}×{}, the float64 run's {}×{}", codebook32.rows(),
          codebook32.cols(), codes, d);
  const bool causal = opts.causal;
  const Index off = nk - nq, block = VqMethod<double>::kCausalBlock;
  require(!causal || off >= 0, "vq rounding bound: causal with {} queries and {} keys", nq, nk);
  require(opts.storage != Storage::native, "vq rounding bound: give a reduced storage (bf16 or fp16)");
  for (const auto* a : {&assigned, &chosen})
    for (const Index y : *a) require(y >= 0 && y < codes, "vq rounding bound: code {} of {}", y, codes);
  {
    std::vector<Index> chosen_as;
    MatrixR<double> codebook_as;
    if (renumbered_codes(assigned, chosen, codebook32, chosen_as, codebook_as))
      return vq_bound(q, v, codebook, codebook_as, assigned, chosen_as, opts, soft, both);  // numbered alike now
  }
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  const double e = eager ? 1 : 0;
  KernelRoundingBound b;
  b.u = unit_roundoff(format);
  b.eta = half_min_subnormal(format);
  const double u = b.u, eta = b.eta, u32 = kU32, eta32 = kEta32, big = largest_finite(format);
  const double inf = std::numeric_limits<double>::infinity(), s = opts.resolved_scale(d);
  // The stored values, known exactly; per code the key count N_y and the value sum S_y (float64, the reference's)
  // and ΔS, the bound on the stored sum's distance from S: the stored values' own, the float32 sum's (γ_{N_y}) and,
  // eager, the storing. Counts are exact in float32; eager stores them (u·N). (Causal: per row, in the row loop.)
  const MatrixR<double> qs = stored_in(format, q), vs = stored_in(format, v), cs = stored_in(format, codebook32);
  VectorX<double> count, n_up;
  MatrixR<double> sum, sum_abs, s_up;  // s_up: |S| + ΔS
  require(!soft || (!causal && soft->count.size() == codes && soft->sum.rows() == codes && soft->sum.cols() == dv),
          "vq rounding bound: soft sums for {} codes, {} columns", soft ? soft->count.size() : 0,
          soft ? soft->sum.cols() : 0);
  require(!both || (!causal && !soft && Index(both->sums.size()) == both->m.rows() && both->m.cols() == codes &&
                    Index(both->row_code.size()) == nq && Index(both->row_flipped.size()) == nq),
          "vq rounding bound: the two-codebook sums do not match {} queries and {} codes", nq, codes);
  if (soft) {
    count = soft->count;
    sum = soft->sum;
    s_up = soft->s_up;
    n_up = soft->n_up;
  } else if (!causal && !both) {  // both: its query code's sums, per row below
    count = VectorX<double>::Zero(codes);
    sum = MatrixR<double>::Zero(codes, dv);
    MatrixR<double> sum_s = sum;
    sum_abs = sum;
    for (Index j = 0; j < nk; ++j) {
      const Index y = assigned[std::size_t(j)];
      count(y) += 1;
      sum.row(y) += v.row(j);
      sum_s.row(y) += vs.row(j);
      sum_abs.row(y) += vs.row(j).cwiseAbs();
    }
    s_up.resize(codes, dv);
    for (Index y = 0; y < codes; ++y)
      for (Index c = 0; c < dv; ++c) {
        const double formed = std::abs(sum_s(y, c) - sum(y, c)) + gamma32(count(y)) * sum_abs(y, c) +
                              4 * count(y) * std::ldexp(1.0, -53) * sum_abs(y, c);  // float64's own sums
        s_up(y, c) = std::abs(sum(y, c)) + formed + e * (u * (std::abs(sum(y, c)) + formed) + eta);
      }
    n_up = count * (1 + e * u);
  }
  // Logits ℓ = s·QCᵀ (float64) and the bound on the emulated ones' distance: the stored Q and C's own (exact), the
  // float32 product and scaling (the scale as float32 holds it: two u₃₂), eager's two storings (u·|x| + η each).
  const MatrixR<double> l = s * q * codebook.transpose(), ls = s * qs * cs.transpose();
  const MatrixR<double> la = qs.cwiseAbs() * cs.cwiseAbs().transpose();
  const double e_z = scaled_logit_error(d, u, eager);
  // No guarantee where a stored input may overflow, where QĈᵀ or s·QĈᵀ may pass the largest value of what holds it
  // (the format under eager, float32 under careful), where a code's float32 value sum may pass float32's (its
  // partial sums reach (1+γ)·Σ|v̂|) or, eager, the stored sums or counts the format's.
  const double limit = eager ? big : kMax32;  // what holds the logits, numerators and normalisers
  bool global_overflow =
      std::max({q.cwiseAbs().maxCoeff(), v.cwiseAbs().maxCoeff(), codebook.cwiseAbs().maxCoeff(),
                codebook32.cwiseAbs().maxCoeff()}) >= big ||
      std::max(1.0, s) * (1 + e_z) * la.maxCoeff() >= limit;
  Index flips = 0;  // non-causal: any flipped assignment moves every row (causal: the rows that see it, below)
  if (both) {
    global_overflow = global_overflow || both->none;  // its sums' overflow and the keys' codes, checked where formed
  } else if (!causal) {  // causal: the sums' overflow is checked per row
    double partial = soft ? soft->partial : 0;
    for (Index y = 0; y < codes && !soft; ++y)
      partial = std::max(partial, (1 + gamma32(count(y))) * sum_abs.row(y).maxCoeff());
    global_overflow = global_overflow || partial >= kMax32 ||
                      (eager && (s_up.maxCoeff() >= big || n_up.maxCoeff() >= big));
    for (Index j = 0; j < nk && !soft; ++j) flips += assigned[std::size_t(j)] != chosen[std::size_t(j)];
    global_overflow = global_overflow || (soft && soft->none);
  }
  b.output.resize(nq, dv);
  b.reference.resize(nq, dv);
  const double div = 1 + u32;  // num / den in float32
  const double a_w = stored_exp_floor(u, eta);  // a weight's absolute floor
  // Causal (VqMethod::emulated_causal_output): row i sees the keys up to i + off — the cache (the keys before its
  // block of kCausalBlock queries: their float32 per-code sums and counts, stored under eager once filled and after
  // every block, K times in all) and its block's keys up to its own, which enter as products with their codes'
  // weights, not summed first. Per row, the same envelopes over what it sees: the cache's sums within
  // (1+γ_N)(1+u)^K − 1 of their magnitudes (plus K·η), its counts within (1+u)^K; the numerator and normaliser sums
  // over the codes and the block's keys (γ_{codes + len + 1}); a flipped key leaves the rows that see it without a
  // guarantee.
  VectorX<double> cc = VectorX<double>::Zero(codes), cb = cc;  // the cache's and the block's key counts
  MatrixR<double> sc = MatrixR<double>::Zero(codes, dv), sb = sc, ssc = sc, ssb = sc, ac = sc, ab = sc;
  VectorX<double> count_i = cc, n_up_i = cc;
  MatrixR<double> sum_i = sc, s_up_i = sc;
  Index seen = 0, flips_seen = 0;  // keys absorbed so far, flipped among them
  const auto absorb = [&](Index j, VectorX<double>& n, MatrixR<double>& sv, MatrixR<double>& ss, MatrixR<double>& sa) {
    const Index y = assigned[std::size_t(j)];
    n(y) += 1;
    sv.row(y) += v.row(j);
    ss.row(y) += vs.row(j);
    sa.row(y) += vs.row(j).cwiseAbs();
    flips_seen += assigned[std::size_t(j)] != chosen[std::size_t(j)];
  };
  if (causal)
    for (; seen < off; ++seen) absorb(seen, cc, sc, ssc, ac);
  for (Index i = 0; i < nq; ++i) {
    double g = gamma32(double(codes)), terms = double(codes);  // the products num and den sum, and their γ
    bool row_none = false;
    if (causal) {
      if (i % block == 0 && i > 0) {  // the finished block's keys join the cache
        cc += cb, sc += sb, ssc += ssb, ac += ab;
        cb.setZero(), sb.setZero(), ssb.setZero(), ab.setZero();
      }
      absorb(seen++, cb, sb, ssb, ab);
      const double k_stored = eager ? double(1 + i / block) : 0.0, lift_k = std::pow(1 + u, k_stored);
      count_i = cc + cb;
      sum_i = sc + sb;
      n_up_i = cc * lift_k + cb;
      double part = 0;
      for (Index y = 0; y < codes; ++y) {
        part = std::max(part, (1 + gamma32(cc(y))) * ac.row(y).maxCoeff());
        for (Index c = 0; c < dv; ++c) {
          const double formed = std::abs(ssc(y, c) + ssb(y, c) - sum_i(y, c)) +
                                ((1 + gamma32(cc(y))) * lift_k - 1) * ac(y, c) +
                                (cc(y) > 0 ? k_stored * eta * lift_k * (1 + gamma32(cc(y))) : 0.0) +
                                4 * count_i(y) * std::ldexp(1.0, -53) * (ac(y, c) + ab(y, c));
          s_up_i(y, c) = std::abs(sum_i(y, c)) + formed;
        }
      }
      terms = double(codes + i % block + 1);  // the codes' and the block's keys up to row i's own
      g = gamma32(terms + 1);                   // (w·U and the block's el·V summed, then added)
      row_none = flips_seen > 0 || part >= kMax32 || (eager && (s_up_i.maxCoeff() >= big || n_up_i.maxCoeff() >= big));
    }
    const Index bq = both ? both->row_code[std::size_t(i)] : 0;  // the row's query code (quantize=both)
    const VqCodeSums* rs = both ? &both->sums[std::size_t(bq)] : nullptr;
    const VectorX<double>& count_r = causal ? count_i : rs ? rs->count : count;
    const MatrixR<double>& sum_r = causal ? sum_i : rs ? rs->sum : sum;
    const MatrixR<double>& s_up_r = causal ? s_up_i : rs ? rs->s_up : s_up;
    const VectorX<double>& n_up_r = causal ? n_up_i : rs ? rs->n_up : n_up;
    row_none = row_none || (both && both->row_flipped[std::size_t(i)]);
    // The row's logits: s·q_iᵀc_y, and with `both` plus m_by, whose move adds, as does their float32 sum (stored
    // under eager).
    const auto logit = [&](Index y) { return l(i, y) + (both ? both->m(bq, y) : 0.0); };
    double mx = -inf, dz = 0, zabs = 0;
    for (Index y = 0; y < codes; ++y) {
      if (count_r(y) == 0) continue;  // a code without keys weighs exactly 0 in both runs
      mx = std::max(mx, logit(y));
      double dy = std::abs(ls(i, y) - l(i, y)) + e_z * s * la(i, y) + e * eta * (1 + s) + double(d) * eta32 * s;
      if (both) {
        dy += both->dm(bq, y);
        dy += (u32 + e * u) * (1 + u32) * (std::abs(logit(y)) + dy) + e * eta;
      }
      dz = std::max(dz, dy);
      zabs = std::max(zabs, std::abs(logit(y)));
    }
    row_none = row_none || (both && (zabs + dz) * (1 + u) >= limit);
    // Each weight's exponent ℓ̂ − M̂ is ℓ − M plus its own logit's move (≤ D), the float32 subtraction's
    // u₃₂·|ℓ̂ − M̂|, and M − M̂: that last is a factor common to the row, e^{M − M̂} ∈ [e^{−D}, e^{D}], which cancels
    // in num/den but scales the absolute terms (and the values held, for the overflow checks) by up to e^{D}.
    const double theta = dz + u32 * 2 * (zabs + dz);
    const double rho = std::exp(theta) * (1 + 4 * u32) * (1 + u);
    const double lift = std::exp(dz);
    VectorX<double> w_ref(codes), w_up(codes);
    for (Index y = 0; y < codes; ++y) {
      w_ref(y) = count_r(y) > 0 ? std::exp(logit(y) - mx) : 0.0;
      w_up(y) = count_r(y) > 0 ? rho * w_ref(y) + a_w * lift : 0.0;
    }
    const double den = w_ref.dot(count_r), den_up = w_up.dot(n_up_r);
    const Eigen::Matrix<double, 1, Eigen::Dynamic> num = w_ref.transpose() * sum_r,
                                                   num_abs = w_ref.transpose() * sum_r.cwiseAbs(),
                                                   num_up = w_up.transpose() * s_up_r;
    const double floor = terms * eta32 * lift;  // float32's underflowing products
    double ed = (1 + g) * den_up - den + floor + 1e-15 * den_up;
    ed += e * (u * (den + ed) + eta * lift);
    b.reference.row(i) = num / den;
    const bool none = (!causal && flips > 0) || row_none || global_overflow || lift * (1 + g) * den_up >= limit ||
                      lift * (1 + g) * num_up.maxCoeff() >= limit || !(den - ed > 0);
    for (Index c = 0; c < dv; ++c) {
      if (none) {
        b.output(i, c) = inf;
        continue;
      }
      double en = (1 + g) * num_up(c) - num_abs(c) + floor + 1e-15 * num_up(c);
      en += e * (u * (num_abs(c) + en) + eta * lift);
      b.output(i, c) = divided_entry(en, ed, std::abs(b.reference(i, c)), den, div, u, eta);
    }
    if (!none && (b.reference.row(i).cwiseAbs() + b.output.row(i)).maxCoeff() >= big / (1 + u))
      b.output.row(i).setConstant(inf);
    b.rows_without_guarantee += !b.output.row(i).allFinite();
  }
  return b;
}

}  // namespace

KernelRoundingBound vq_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& v,
                                      const ConstRef<double>& codebook, const ConstRef<double>& codebook32,
                                      const std::vector<Index>& assigned, const std::vector<Index>& chosen,
                                      const AttentionOptions& opts) {
  return vq_bound(q, v, codebook, codebook32, assigned, chosen, opts, nullptr);
}

KernelRoundingBound vq_soft_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v, const ConstRef<double>& codebook,
                                           const ConstRef<double>& codebook32, double temperature,
                                           const AttentionOptions& opts) {
  const Index nk = k.rows(), d = k.cols(), codes = codebook.rows();
  require(!opts.causal, "vq rounding bound: assign=soft is bounded non-causal only");
  require(v.rows() == nk && q.cols() == d && codebook.cols() == d && codes >= 1 && codebook32.rows() == codes &&
              codebook32.cols() == d && temperature > 0,
          "vq soft rounding bound: K {}×{}, V {} rows, codebooks {}×{} and {}×{}, T = {}", nk, d, v.rows(), codes,
          codebook.cols(), codebook32.rows(), codebook32.cols(), temperature);
  require(opts.storage != Storage::native, "vq rounding bound: give a reduced storage (bf16 or fp16)");
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  const double e = eager ? 1 : 0, u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32;
  const double big = largest_finite(format), f64 = std::ldexp(1.0, -53);
  const MatrixR<double> ks = stored_in(format, k), vs = stored_in(format, v);
  // The codes paired by the keys' nearest codes in each run (any pairing is valid — O does not depend on the
  // numbering —, this one aligns the two fits).
  const auto nearest = [&](const MatrixR<double>& x, const ConstRef<double>& c) {
    std::vector<Index> a(std::size_t(x.rows()));
    for (Index j = 0; j < x.rows(); ++j) (c.rowwise() - x.row(j)).rowwise().squaredNorm().minCoeff(&a[std::size_t(j)]);
    return a;
  };
  const std::vector<Index> assigned = nearest(k, codebook);
  std::vector<Index> chosen_as;
  MatrixR<double> cb32 = codebook32;
  renumbered_codes(assigned, nearest(ks, codebook32), codebook32, chosen_as, cb32);
  const MatrixR<double> cs = stored_in(format, cb32);
  // Responsibility logits z = (2KCᵀ − ‖k‖² − ‖c‖²)/(2T): the float64 reference's from K and C, and the emulated
  // ones' distance — those of the stored K̂, Ĉ (exact, computed: |z̃ − z|), then the float32 products and norms (γ_d of
  // the magnitudes M = 2|K̂||Ĉ|ᵀ + ‖k̂‖² + ‖ĉ‖²), the two subtractions (u₃₂ each), under eager the five storings of
  // KCᵀ, the norms and the subtractions (u·|x| + η each), the division by 2T (T held in float32: 2u₃₂ with the
  // division) and its storing.
  const VectorX<double> kn = k.rowwise().squaredNorm(), cn = codebook.rowwise().squaredNorm();
  const VectorX<double> kns = ks.rowwise().squaredNorm(), cns = cs.rowwise().squaredNorm();
  MatrixR<double> z = 2 * k * codebook.transpose(), zt = 2 * ks * cs.transpose();
  MatrixR<double> mag = 2 * ks.cwiseAbs() * cs.cwiseAbs().transpose();
  z.colwise() -= kn;
  z.rowwise() -= cn.transpose();
  zt.colwise() -= kns;
  zt.rowwise() -= cns.transpose();
  mag.colwise() += kns;
  mag.rowwise() += cns.transpose();
  const double t2 = 2 * temperature;
  z /= t2;
  zt /= t2;
  const double e_num = (1 + gamma32(double(d))) * std::pow(1 + u32, 2) * std::pow(1 + u, 3 * e) - 1;
  const double e_div = (1 + 2 * u32) * (1 + u32) * std::pow(1 + u, e);
  // The float32 softmax over the codes, entry by entry: R̂_jy / R_jy = e^{(ẑ_jy − z_jy) − (LSE(ẑ_j) − LSE(z_j))} up to
  // the float32 steps. LSE(z + Δ) − LSE(z) = ∫₀¹ softmax(z + tΔ)·Δ dt, and softmax(z + tΔ)_y ≤ e^{2D}·R_jy (D = max_y
  // |Δ_y|), so |ΔLSE_j| ≤ L_j = min(D, e^{2D}·Σ_y R_jy D_jy): a code the row barely weighs does not spread its logit's
  // move to the others. Then the subtraction of the row's largest (u₃₂ of twice the largest |ẑ|, in both exponents),
  // exp within 4u₃₂, the sum within γ_codes, the division; R stored (1+u; the floor below).
  MatrixR<double> r(nk, codes), dz(nk, codes), dr(nk, codes);
  bool overflow = false;
  const double a = stored_exp_floor(u, eta);
  const double steps = (1 + 4 * u32) * std::pow(1 + gamma32(double(codes + 2)), 2) * (1 + u);
  for (Index j = 0; j < nk; ++j) {
    double zj = 0;
    for (Index y = 0; y < codes; ++y) {
      const double m = mag(j, y), num_err = e_num * m + e * 5 * eta * std::pow(1 + u, 3) + 4 * double(d + 2) * kEta32;
      dz(j, y) = std::abs(zt(j, y) - z(j, y)) + 8 * double(d + 4) * f64 * m / t2 + ((m + num_err) * e_div - m) / t2 +
                 e * eta;
      zj = std::max(zj, std::abs(z(j, y)) + dz(j, y));
      overflow = overflow || (m + num_err) * std::max(1.0, 1 / t2) * e_div >= (eager ? big / (1 + u) : kMax32 / 2);
    }
    r.row(j) = (z.row(j).array() - z.row(j).maxCoeff()).exp();
    r.row(j) /= r.row(j).sum();
    const double dmax = dz.row(j).maxCoeff();
    const double lse = std::min(dmax, std::exp(2 * dmax) * r.row(j).dot(dz.row(j)));
    for (Index y = 0; y < codes; ++y) {
      const double rho = std::exp(dz(j, y) + lse + 4 * u32 * zj) * steps;
      dr(j, y) = (rho - 1) * r(j, y) + a + 1e-15 * r(j, y);
    }
  }
  // S = RᵀV and N = Rᵀ1 summed in float32 over n_k, stored under eager.
  const MatrixR<double> rt = r.transpose(), drt = dr.transpose(), rut = rt + drt;
  VectorX<double> mass_low;
  VqCodeSums sums = weighted_code_sums(rt, drt, rut, v, vs, eager, u, eta, &mass_low);
  // A code whose stored mass may be 0 is dropped by the emulation (its weights skip it): no guarantee.
  sums.none = overflow || mass_low.minCoeff() <= 0 || (eager && sums.n_up.maxCoeff() >= big / (1 + u));
  return vq_bound(q, v, codebook, cb32, assigned, assigned, opts, &sums);
}

KernelRoundingBound vq_both_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v, const VqBothRun& run64,
                                           const VqBothRun& run32, const AttentionOptions& opts) {
  const Index nq = q.rows(), nk = k.rows(), d = k.cols();
  const Index codes = run64.codebook.rows(), cq = run64.query_codebook.rows();
  require(!opts.causal, "vq rounding bound: quantize=both is non-causal");
  require(opts.storage != Storage::native, "vq rounding bound: give a reduced storage (bf16 or fp16)");
  require(q.cols() == d && v.rows() == nk && codes >= 1 && cq >= 1,
          "vq both rounding bound: Q {}×{}, K {}×{}, V {} rows", nq, q.cols(), nk, d, v.rows());
  for (const VqBothRun* r : {&run64, &run32}) {
    require(r->codebook.rows() == codes && r->codebook.cols() == d && r->query_codebook.rows() == cq &&
                r->query_codebook.cols() == d && Index(r->key_codes.size()) == nk &&
                Index(r->query_codes.size()) == nq,
            "vq both rounding bound: codebooks {}×{} and {}×{}, {} key and {} query codes, for {} codes, {} query "
            "codes, {} keys, {} queries of d = {}",
            r->codebook.rows(), r->codebook.cols(), r->query_codebook.rows(), r->query_codebook.cols(),
            r->key_codes.size(), r->query_codes.size(), codes, cq, nk, nq, d);
    for (const Index y : r->key_codes)
      require(y >= 0 && y < codes, "vq both rounding bound: key code {} of {}", y, codes);
    for (const Index y : r->query_codes)
      require(y >= 0 && y < cq, "vq both rounding bound: query code {} of {}", y, cq);
  }
  const Format format = storage_format(opts.storage);
  const bool eager = opts.policy == Policy::eager;
  const double e = eager ? 1 : 0, u = unit_roundoff(format), eta = half_min_subnormal(format), u32 = kU32;
  const double big = largest_finite(format), f64 = std::ldexp(1.0, -53), s = opts.resolved_scale(d);
  const double limit = eager ? big : kMax32;
  // Either run's codes may be numbered differently (two k-means fits): renumbered as the float64 run's where the
  // partitions agree. A key whose code moved leaves every row without a guarantee; a query's, its own row.
  const std::vector<Index>&a = run64.key_codes, &b = run64.query_codes;
  std::vector<Index> a32 = run32.key_codes, b32 = run32.query_codes;
  MatrixR<double> cb32 = run32.codebook, cq32 = run32.query_codebook;
  {
    std::vector<Index> as;
    MatrixR<double> cs;
    if (renumbered_codes(a, a32, run32.codebook, as, cs)) a32 = as, cb32 = cs;
    if (renumbered_codes(b, b32, run32.query_codebook, as, cs)) b32 = as, cq32 = cs;
  }
  VqBothSums both;
  both.row_code = b;
  both.row_flipped.resize(std::size_t(nq));
  for (Index i = 0; i < nq; ++i) both.row_flipped[std::size_t(i)] = b[std::size_t(i)] != b32[std::size_t(i)];
  for (Index j = 0; j < nk; ++j) both.none = both.none || a[std::size_t(j)] != a32[std::size_t(j)];
  // The residuals: the float64 run's R = K − ΔC, and the emulated run's exactly as it forms them (K̂ − ΔĈ in float32,
  // stored: an elementwise rounding, known); the key logits g = s·C'Rᵀ, the emulated ones' distance — the stored
  // factors' (computed), the float32 product and scaling and, eager, their two storings (as the logits λ: e_z) —
  // and their maxima m_by = max_{a(j)=y} g_bj, which move by at most the largest move of the g they take.
  const MatrixR<double> ks = stored_in(format, k), cs = stored_in(format, cb32), cqs = stored_in(format, cq32);
  const MatrixR<double> vs = stored_in(format, v);
  MatrixR<double> r(nk, d), rs(nk, d);
  for (Index j = 0; j < nk; ++j)
    for (Index c = 0; c < d; ++c) {
      r(j, c) = k(j, c) - run64.codebook(a[std::size_t(j)], c);
      const float diff = float(ks(j, c)) - float(cs(a[std::size_t(j)], c));
      rs(j, c) = double(diff);
    }
  rs = stored_in(format, rs);
  const MatrixR<double> g = s * run64.query_codebook * r.transpose(), gt = s * cqs * rs.transpose();
  const MatrixR<double> gmag = cqs.cwiseAbs() * rs.cwiseAbs().transpose();
  const double e_z = scaled_logit_error(d, u, eager);
  const MatrixR<double> dg = ((gt - g).cwiseAbs() + (e_z + 8 * double(d + 4) * f64) * s * gmag).array() +
                             (e * eta * (1 + s) + double(d) * kEta32 * s);
  // No guarantee where a key or query codebook entry may overflow when stored (a residual or g then inf or NaN, which
  // the comparisons below would not see).
  both.none = both.none || !rs.allFinite() || !cqs.allFinite() || !gt.allFinite() ||
              std::max({k.cwiseAbs().maxCoeff(), run64.query_codebook.cwiseAbs().maxCoeff(),
                        run32.query_codebook.cwiseAbs().maxCoeff()}) >= big ||
              std::max(1.0, s) * (1 + e_z) * gmag.maxCoeff() >= limit;
  const double inf = std::numeric_limits<double>::infinity();
  both.m = MatrixR<double>::Constant(cq, codes, -inf);
  both.dm = MatrixR<double>::Zero(cq, codes);
  for (Index j = 0; j < nk; ++j)
    for (Index y = a[std::size_t(j)], c = 0; c < cq; ++c) {
      both.m(c, y) = std::max(both.m(c, y), g(c, j));
      both.dm(c, y) = std::max(both.dm(c, y), dg(c, j));
    }
  // Per query code the key weights G_bj = e^{g_bj − m_b,a(j)} ≤ 1 (the emulation's Ĝ: the float32 subtraction and
  // exp, stored under both policies), each within [G/ρ, G·ρ] ± (2⁻¹²⁶(1+u) + η), ρ = e^{δ}(1+4u₃₂)(1+u), δ the moves
  // of g and m and the subtraction's u₃₂; then S_b = Σ_j G_bj e_a(j) v_jᵀ and N_b = Σ_j G_bj e_a(j) summed in float32
  // over the keys (stored under eager) by the product rule. A code that holds keys holds one of weight exactly 1 in
  // both runs (its maximum), so no code's mass vanishes.
  const double floor = stored_exp_floor(u, eta), steps = (1 + 4 * u32) * (1 + u);
  both.sums.resize(std::size_t(cq));
  for (Index c = 0; c < cq; ++c) {
    MatrixR<double> x = MatrixR<double>::Zero(codes, nk), dx = x;
    for (Index j = 0; j < nk; ++j) {
      const Index y = a[std::size_t(j)];
      const double z = g(c, j) - both.m(c, y), move = dg(c, j) + both.dm(c, y);
      const double rho = std::exp(move + u32 * (std::abs(z) + move)) * steps;
      x(y, j) = std::exp(z);
      dx(y, j) = (rho - 1) * x(y, j) + floor + 1e-15 * x(y, j);
    }
    const VqCodeSums& sums = both.sums[std::size_t(c)] = weighted_code_sums(x, dx, x + dx, v, vs, eager, u, eta);
    both.none = both.none || sums.partial >= kMax32 ||
                (eager && std::max(sums.s_up.maxCoeff(), sums.n_up.maxCoeff()) >= big / (1 + u));
  }
  for (Index c = 0; c < cq; ++c)
    for (Index y = 0; y < codes; ++y)
      if (!std::isfinite(both.m(c, y))) both.m(c, y) = 0;  // a code without keys: weight 0, never read
  return vq_bound(q, v, run64.codebook, cb32, a, a, opts, nullptr, &both);
}

}  // namespace attnlab
