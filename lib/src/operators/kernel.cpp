// Kernel feature-map attention: normalized, causal by prefix sums (chunked and recurrent), stabilized.
#include "attnlab/operators/kernel.hpp"

#include <omp.h>

#include "attnlab/core/error.hpp"
#include "detail/tall_products.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {
namespace {

// Segments of blocks the causal backward's scans are split into (operator backward): fixed, not the thread count.
constexpr Index kScanSegments = 8;

template <typename T>
T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

/// 1/den, guarded: a denominator below eps·mag (the size of its terms) is rounding noise and is clamped; a row
/// whose terms all vanish (mag = 0) gets 0.
template <typename T>
T safe_inverse(T den, T mag) {
  if (!(mag > 0)) return T(0);
  const T floor = std::max(std::numeric_limits<T>::epsilon() * mag, std::numeric_limits<T>::min());
  if (std::fabs(den) < floor) return den < 0 ? T(-1) / floor : T(1) / floor;
  return T(1) / den;
}

}  // namespace

template <typename T>
KernelOperator<T>::KernelOperator(FeatureMaps<T> f, bool causal, Index chunk)
    : f_(std::move(f)), causal_(causal), chunk_(chunk) {
  require(f_.qf.cols() == f_.kf.cols(), "kernel attention: query and key features differ in number");
  require(chunk_ >= 1, "kernel attention: chunk must be positive");
  if (f_.k_logscale.size() == 0) f_.k_logscale = VectorX<T>::Zero(f_.kf.rows());
  require(f_.k_logscale.size() == f_.kf.rows(), "kernel attention: one log-scale per key");
  require(all_finite(f_.qf) && all_finite(f_.kf) && all_finite(f_.k_logscale),
          "kernel attention: non-finite features");
  offset_ = cols() - rows();
  if (causal_) require(offset_ >= 0, "kernel attention: causal needs n_k >= n_q");
  // Stabilizers M_i: the max of g over the keys query i sees.
  const auto& g = f_.k_logscale;
  qmax_.resize(rows());
  if (!causal_) {
    qmax_.setConstant(g.maxCoeff());
  } else {
    T m = offset_ > 0 ? g.head(offset_).maxCoeff() : neg_inf<T>();
    for (Index i = 0; i < rows(); ++i) {
      if (i % chunk_ == 0) before_.push_back(m);
      m = std::max(m, g(i + offset_));
      qmax_(i) = m;
    }
    before_.push_back(m);
  }
  // Without a mask every query shares the stabilizer M = max g: fold e^{g_j − M} into the key features once, so
  // that products use Ψk as it is (no n × M copy per product).
  if (!causal_) {
    const VectorX<T> w = (g.array() - qmax_(0)).exp();
    f_.kf = w.asDiagonal() * f_.kf;
    f_.k_logscale.setConstant(qmax_(0));
    kweight_ = w;
  }
  // Denominators Σ_j sim(q_i, k_j), and the magnitude Σ_j |terms| that guards them.
  const MatrixR<T> ones = MatrixR<T>::Ones(cols(), 1);
  const VectorX<T> den = unnormalized(f_.qf, f_.kf, ones).col(0);
  const VectorX<T> mag =
      f_.nonnegative ? den : VectorX<T>(unnormalized(f_.qf.cwiseAbs(), f_.kf.cwiseAbs(), ones).col(0));
  inv_den_.resize(rows());
  for (Index i = 0; i < rows(); ++i) inv_den_(i) = safe_inverse(den(i), mag(i));
}

template <typename T>
MatrixR<T> KernelOperator<T>::scaled_keys(const MatrixR<T>& kf, Index first, Index count, T m) const {
  const VectorX<T> w = (f_.k_logscale.segment(first, count).array() - m).exp();
  return w.asDiagonal() * kf.middleRows(first, count);
}

template <typename T>
MatrixR<T> KernelOperator<T>::block_weights(const MatrixR<T>& qf, const MatrixR<T>& kf, Index c) const {
  const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
  MatrixR<T> a = qf.middleRows(i0, len) * kf.middleRows(j0, len).transpose();
  // Query i0 + r sees the block's keys t ≤ r, each weighed by e^{g − M_i} ≤ 1 (per query: exact, causal).
  for (Index r = 0; r < len; ++r) {
    a.row(r).head(r + 1).array() *= (f_.k_logscale.segment(j0, r + 1).array() - qmax_(i0 + r)).exp().transpose();
    a.row(r).tail(len - r - 1).setZero();
  }
  return a;
}

template <typename T>
MatrixR<T> KernelOperator<T>::unnormalized(const MatrixR<T>& qf, const MatrixR<T>& kf, const ConstRef<T>& x) const {
  if (!causal_) {  // the keys' weights are folded into kf (constructor)
    const MatrixR<T> s = detail::tall_transpose_product<T>(kf, x);  // M × b
    return qf * s;
  }
  // Chunked prefix sums. The state S = Σ_{keys before block c} ψ(k_j) x_jᵀ is kept in units of e^{−before(c)};
  // query i reads it with the factor e^{before(c) − M_i} ≤ 1.
  const Index b = x.cols();
  MatrixR<T> y(rows(), b);
  MatrixR<T> state = MatrixR<T>::Zero(qf.cols(), b);
  if (offset_ > 0) state.noalias() = scaled_keys(kf, 0, offset_, before_block(0)).transpose() * x.topRows(offset_);
  for (Index c = 0; c < blocks(); ++c) {
    const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
    const T m0 = before_block(c), m1 = before_block(c + 1);
    y.middleRows(i0, len).noalias() = qf.middleRows(i0, len) * state;
    if (m0 != neg_inf<T>())
      y.middleRows(i0, len).array().colwise() *= (m0 - qmax_.segment(i0, len).array()).exp();
    else
      y.middleRows(i0, len).setZero();
    y.middleRows(i0, len).noalias() += block_weights(qf, kf, c) * x.middleRows(j0, len);
    if (m0 != neg_inf<T>()) state *= std::exp(m0 - m1);
    state.noalias() += scaled_keys(kf, j0, len, m1).transpose() * x.middleRows(j0, len);
  }
  return y;
}

template <typename T>
MatrixR<T> KernelOperator<T>::apply(const ConstRef<T>& x) const {
  require(x.rows() == cols(), "apply: dimension mismatch");
  // Scaled in place (the same products as the diagonal product, bit for bit): one n × b buffer, not two.
  MatrixR<T> y = unnormalized(f_.qf, f_.kf, x);
  y.array().colwise() *= inv_den_.array();
  return y;
}

template <typename T>
MatrixR<T> KernelOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == rows(), "apply_transpose: dimension mismatch");
  const MatrixR<T> w = inv_den_.asDiagonal() * x;  // rows of X weighted by 1/den_i
  const Index b = x.cols();
  if (!causal_) {
    const MatrixR<T> r = detail::tall_transpose_product<T>(f_.qf, w);  // M × b
    return f_.kf * r;  // weights folded into kf
  }
  // Suffix sums over query blocks, backwards: R = Σ_{queries i in blocks > c} φ(q_i) w_iᵀ e^{before(c+1) − M_i},
  // factors ≤ 1 since M_i ≥ before(c+1) there; block c's keys have g ≤ before(c+1).
  MatrixR<T> y(cols(), b);
  MatrixR<T> r = MatrixR<T>::Zero(f_.qf.cols(), b);
  for (Index c = blocks() - 1; c >= 0; --c) {
    const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
    const T m0 = before_block(c), m1 = before_block(c + 1);
    y.middleRows(j0, len).noalias() = scaled_keys(f_.kf, j0, len, m1) * r;
    y.middleRows(j0, len).noalias() += block_weights(f_.qf, f_.kf, c).transpose() * w.middleRows(i0, len);
    if (m0 == neg_inf<T>()) continue;  // no key before this block: nothing reads R further back
    r *= std::exp(m0 - m1);
    const VectorX<T> f = (m0 - qmax_.segment(i0, len).array()).exp();
    r.noalias() += f_.qf.middleRows(i0, len).transpose() * (f.asDiagonal() * w.middleRows(i0, len));
  }
  if (offset_ > 0) y.topRows(offset_).noalias() = scaled_keys(f_.kf, 0, offset_, before_block(0)) * r;
  return y;
}

template <typename T>
void KernelOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  const Index vis = causal_ ? first + count + offset_ : cols();  // keys the last row sees
  MatrixR<T> s = f_.qf.middleRows(first, count) * f_.kf.topRows(vis).transpose();
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r, seen = causal_ ? i + offset_ + 1 : vis;
    s.row(r).head(seen).array() *= (f_.k_logscale.head(seen).array() - qmax_(i)).exp().transpose() * inv_den_(i);
    s.row(r).tail(vis - seen).setZero();
  }
  out.setZero(count, cols());
  out.leftCols(vis) = s;
}

template <typename T>
MatrixR<T> KernelOperator<T>::recurrent_output(const ConstRef<T>& v) const {
  require(causal_, "recurrent_output is the causal form");
  require(v.rows() == cols(), "recurrent_output: V has the wrong number of rows");
  const Index feats = f_.qf.cols(), dv = v.cols();
  MatrixR<T> state = MatrixR<T>::Zero(feats, dv);
  VectorX<T> z = VectorX<T>::Zero(feats), zabs = VectorX<T>::Zero(feats);
  T m = neg_inf<T>();
  MatrixR<T> out(rows(), dv);
  Index next = 0;  // next key to fold into the state
  const auto fold = [&](Index j) {
    // S_j = S_{j−1} + ψ(k_j) v_jᵀ, z_j = z_{j−1} + ψ(k_j) (Katharopoulos et al. 2020 eqs. (9)–(10), prefix sums),
    // with the running max rescaling.
    const T g = f_.k_logscale(j);
    if (g > m) {
      if (m != neg_inf<T>()) {
        const T s = std::exp(m - g);
        state *= s;
        z *= s;
        zabs *= s;
      }
      m = g;
    }
    const VectorX<T> psi = f_.kf.row(j).transpose() * std::exp(g - m);
    state.noalias() += psi * v.row(j);
    z += psi;
    zabs += psi.cwiseAbs();
  };
  for (Index i = 0; i < rows(); ++i) {
    while (next <= i + offset_) fold(next++);
    const T den = f_.qf.row(i).dot(z);
    const T mag = f_.nonnegative ? den : f_.qf.row(i).cwiseAbs().dot(zabs);
    out.row(i) = (f_.qf.row(i) * state) * safe_inverse(den, mag);
  }
  return out;
}

template <typename T>
void KernelOperator<T>::block_mask(Index c, MatrixR<T>& w) const {
  const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
  w.resize(len, len);
  for (Index r = 0; r < len; ++r) {
    w.row(r).head(r + 1) = (f_.k_logscale.segment(j0, r + 1).array() - qmax_(i0 + r)).exp().transpose();
    w.row(r).tail(len - r - 1).setZero();
  }
}

template <typename T>
void KernelOperator<T>::scaled_keys_into(Index first, Index count, T m, MatrixR<T>& out, VectorX<T>& w) const {
  w = (f_.k_logscale.segment(first, count).array() - m).exp();
  out.resize(count, f_.kf.cols());
  out.noalias() = w.asDiagonal() * f_.kf.middleRows(first, count);
}

template <typename T>
void KernelOperator<T>::backward(const ConstRef<T>& v, const ConstRef<T>& d_out, FeatureGradients<T>& g,
                                 KernelBackwardWorkspace<T>& ws) const {
  require(v.rows() == cols() && d_out.rows() == rows() && d_out.cols() == v.cols(),
          "kernel attention backward: dimension mismatch");
  // VJP of O_i = Σ_j a_ij v_j / Σ_j a_ij (Katharopoulos et al. 2020 eq. (2)): dA_ij = (dO_iᵀv_j − dO_iᵀO_i) / D_ii
  // = W̃_iᵀṼ_j with W̃_i = [dO_i, −dO_iᵀO_i]/D_ii, Ṽ_j = [v_j, 1]. A and D are both in the units e^{−M_i} of query i
  // (a factor of row i that cancels in O_i), so W̃ is in the inverse units and W̃_iᵀṼ_j·(weights in units) is exact.
  // dV = P̃ᵀdO is Ψ·(ΦᵀD⁻¹dO), the first d_v columns of the same sums over W̃ that ∂L/∂ψ needs. Every buffer is ws's
  // or g's, kept across calls.
  const Index dv = v.cols(), feats = f_.qf.cols();
  MatrixR<T>& wt = ws.wt;
  MatrixR<T>& vt = ws.vt;
  wt.resize(rows(), dv + 1);
  vt.resize(cols(), dv + 1);
  vt.leftCols(dv) = v;
  vt.col(dv).setOnes();
  g.dqf.resize(rows(), feats);
  g.dkf.resize(cols(), feats);
  g.dv.resize(cols(), dv);
  g.dg.resize(cols());
  // W̃'s rows [i0, i0 + len) from the numerators y of those queries (O_i = y_i / D_i, y in the forward's units).
  const auto tilde = [&](Index i0, Index len, const MatrixR<T>& y) {
    const auto inv = inv_den_.segment(i0, len).array();
    const auto dob = d_out.middleRows(i0, len);
    wt.middleRows(i0, len).leftCols(dv) = dob.array().colwise() * inv;
    wt.middleRows(i0, len).col(dv) = -(inv.square() * (dob.array() * y.array()).rowwise().sum());
  };
  if (!causal_) {
    // Global sums: ∂L/∂φ_i = (ΨᵀṼ) W̃_i, ∂L/∂ψ'_j = (ΦᵀW̃) Ṽ_j for the folded ψ'_j = e^{g_j − M} kf_j.
    const MatrixR<T> s = detail::tall_transpose_product<T>(f_.kf, vt);  // M × (d_v + 1)
    ws.y.resize(rows(), dv);
    ws.y.noalias() = f_.qf * s.leftCols(dv);
    tilde(0, rows(), ws.y);
    const MatrixR<T> r = detail::tall_transpose_product<T>(f_.qf, wt);  // M × (d_v + 1)
    g.dqf.noalias() = wt * s.transpose();
    g.dkf.noalias() = vt * r.transpose();
    g.dv.noalias() = f_.kf * r.leftCols(dv);
    // ψ_j = e^{g_j}·kf_j: ∂L/∂g_j = ψ'_j·∂L/∂ψ'_j, ∂L/∂kf_j = e^{g_j − M}·∂L/∂ψ'_j.
    g.dg = (f_.kf.array() * g.dkf.array()).rowwise().sum();
    g.dkf.array().colwise() *= kweight_.array();
    return;
  }
  // Causal, chunked (the forward's blocks), two passes: forward over the blocks for the queries, backward for the
  // keys. Each is a scan, shared by the threads through kScanSegments fixed segments of blocks: the segments' totals
  // in parallel, the state entering each segment from them (in order), then each segment's own scan in parallel. The
  // segments do not depend on the thread count, and every product runs inside a parallel region (Eigen's own
  // threading, whose blocking depends on the thread count, stays off): the gradients' bits do not depend on it.
  const Index nb = blocks(), segs = std::min<Index>(kScanSegments, nb);
  const auto seg_begin = [&](Index s) { return s * nb / segs; };  // segment s: blocks [seg_begin(s), seg_begin(s + 1))
  ws.scans.resize(std::size_t(std::max(1, omp_get_max_threads())));
  ws.total.resize(std::size_t(segs));
  ws.entry.resize(std::size_t(segs));
  using Scan = typename KernelBackwardWorkspace<T>::Scan;
  const auto scan = [&]() -> Scan& { return ws.scans[std::size_t(omp_get_thread_num())]; };
  // The keys' state S = Σ_{keys before block c} ψ(k_j)Ṽ_jᵀ, in units e^{−before(c)}: one block's keys added.
  const auto add_keys = [&](MatrixR<T>& st, Index c, Scan& t) {
    const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
    const T m0 = before_block(c), m1 = before_block(c + 1);
    if (m0 != neg_inf<T>()) st *= std::exp(m0 - m1);  // else st is zero: no key before block c
    scaled_keys_into(j0, len, m1, t.keys, t.kw);
    st.noalias() += t.keys.transpose() * vt.middleRows(j0, len);
  };
  // The queries' state R = Σ_{queries i in blocks > c} φ(q_i) W̃_iᵀ e^{before(c+1) − M_i} (factors ≤ 1: M_i ≥
  // before(c+1) there), in units e^{−before(c+1)}: one block's queries added (before(c) finite: a key precedes c).
  const auto add_queries = [&](MatrixR<T>& st, Index c, Scan& t) {
    const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0;
    const T m0 = before_block(c), m1 = before_block(c + 1);
    st *= std::exp(m0 - m1);
    t.e = (m0 - qmax_.segment(i0, len).array()).exp();
    t.fw.resize(len, dv + 1);
    t.fw = wt.middleRows(i0, len).array().colwise() * t.e.array();
    st.noalias() += f_.qf.middleRows(i0, len).transpose() * t.fw;
  };

  // Queries. Per block: the numerators (the prefix state read with e^{before(c) − M_i}, plus the block's masked
  // weights times its values), so O and W̃ of the block, then ∂L/∂φ of its queries: S·W̃_i (read likewise) plus the
  // block's masked dA times its keys' features.
#pragma omp parallel for schedule(static)
  for (Index s = 0; s < segs; ++s) {
    Scan& t = scan();
    if (s == 0) {  // the keys before the first query's block (n_k > n_q)
      ws.entry[0].setZero(feats, dv + 1);
      if (offset_ > 0) {
        scaled_keys_into(0, offset_, before_block(0), t.keys, t.kw);
        ws.entry[0].noalias() = t.keys.transpose() * vt.topRows(offset_);
      }
    }
    if (s + 1 == segs) continue;  // the last segment's total is read by no later segment
    MatrixR<T>& u = ws.total[std::size_t(s)];  // its keys, in units e^{−before(seg_begin(s + 1))}
    u.setZero(feats, dv + 1);
    for (Index c = seg_begin(s); c < seg_begin(s + 1); ++c) add_keys(u, c, t);
  }
  for (Index s = 1; s < segs; ++s) {
    const T m0 = before_block(seg_begin(s - 1)), m1 = before_block(seg_begin(s));
    MatrixR<T>& in = ws.entry[std::size_t(s)];
    if (m0 != neg_inf<T>())
      in = ws.entry[std::size_t(s - 1)] * std::exp(m0 - m1) + ws.total[std::size_t(s - 1)];
    else
      in = ws.total[std::size_t(s - 1)];
  }
#pragma omp parallel for schedule(static)
  for (Index s = 0; s < segs; ++s) {
    Scan& t = scan();
    MatrixR<T>& state = t.state;
    state = ws.entry[std::size_t(s)];
    for (Index c = seg_begin(s); c < seg_begin(s + 1); ++c) {
      const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
      const T m0 = before_block(c);
      const auto qf = f_.qf.middleRows(i0, len);
      const auto kf = f_.kf.middleRows(j0, len);
      const auto vb = vt.middleRows(j0, len);
      const auto wb = wt.middleRows(i0, len);
      auto dq = g.dqf.middleRows(i0, len);
      block_mask(c, t.mask);  // the block's masked weights, for both its weights and its dA
      t.a.resize(len, len);
      t.a.noalias() = qf * kf.transpose();
      t.a.array() *= t.mask.array();
      t.y.resize(len, dv);
      if (m0 != neg_inf<T>()) {
        t.e = (m0 - qmax_.segment(i0, len).array()).exp();
        t.y.noalias() = qf * state.leftCols(dv);
        t.y.array().colwise() *= t.e.array();
        t.y.noalias() += t.a * vb.leftCols(dv);
      } else {
        t.y.noalias() = t.a * vb.leftCols(dv);
      }
      tilde(i0, len, t.y);
      if (m0 != neg_inf<T>()) {
        dq.noalias() = wb * state.transpose();
        dq.array().colwise() *= t.e.array();
      } else {
        dq.setZero();
      }
      t.da.resize(len, len);
      t.da.noalias() = wb * vb.transpose();  // dA of the block
      t.da.array() *= t.mask.array();
      dq.noalias() += t.da * kf;
      if (c + 1 < seg_begin(s + 1)) add_keys(state, c, t);
    }
  }

  // Keys. Per block, from the end: R read by the block's keys with e^{g_j − before(c+1)} (as apply_transpose), plus
  // the block's masked dAᵀ (∂L/∂ψ) and P̃ᵀ (dV) times its queries' features and W̃; ∂L/∂g_j = kf_j·∂L/∂kf_j
  // (ψ_j = e^{g_j}·kf_j).
#pragma omp parallel for schedule(static)
  for (Index s = 1; s < segs; ++s) {
    Scan& t = scan();
    MatrixR<T>& u = ws.total[std::size_t(s)];  // its queries, in units e^{−before(seg_begin(s))}
    u.setZero(feats, dv + 1);
    for (Index c = seg_begin(s + 1) - 1; c >= seg_begin(s); --c) add_queries(u, c, t);
  }
  ws.entry[std::size_t(segs - 1)].setZero(feats, dv + 1);
  for (Index s = segs - 1; s >= 1; --s) {
    const T m0 = before_block(seg_begin(s)), m1 = before_block(seg_begin(s + 1));
    ws.entry[std::size_t(s - 1)] = ws.entry[std::size_t(s)] * std::exp(m0 - m1) + ws.total[std::size_t(s)];
  }
#pragma omp parallel for schedule(static)
  for (Index s = 0; s < segs; ++s) {
    Scan& t = scan();
    MatrixR<T>& r = t.state;
    r = ws.entry[std::size_t(s)];
    for (Index c = seg_begin(s + 1) - 1; c >= seg_begin(s); --c) {
      const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
      const T m0 = before_block(c), m1 = before_block(c + 1);
      const auto qf = f_.qf.middleRows(i0, len);
      const auto kf = f_.kf.middleRows(j0, len);
      const auto vb = vt.middleRows(j0, len);
      const auto wb = wt.middleRows(i0, len);
      auto dk = g.dkf.middleRows(j0, len);
      auto dvb = g.dv.middleRows(j0, len);
      scaled_keys_into(j0, len, m1, t.keys, t.kw);  // e^{g_j − before(c+1)}·kf_j
      dk.noalias() = vb * r.transpose();
      dk.array().colwise() *= t.kw.array();
      dvb.noalias() = t.keys * r.leftCols(dv);
      block_mask(c, t.mask);
      t.a.resize(len, len);
      t.a.noalias() = qf * kf.transpose();
      t.a.array() *= t.mask.array();
      dvb.noalias() += t.a.transpose() * wb.leftCols(dv);
      t.da.resize(len, len);
      t.da.noalias() = wb * vb.transpose();
      t.da.array() *= t.mask.array();
      dk.noalias() += t.da.transpose() * qf;
      g.dg.segment(j0, len) = (kf.array() * dk.array()).rowwise().sum();
      // No key before this block: nothing reads R further back; nor past a segment's first block but the first's.
      if (m0 != neg_inf<T>() && (c > seg_begin(s) || s == 0)) add_queries(r, c, t);
    }
    if (s == 0 && offset_ > 0) {  // the keys before the first query's block read all of R
      scaled_keys_into(0, offset_, before_block(0), t.keys, t.kw);
      auto dk = g.dkf.topRows(offset_);
      dk.noalias() = vt.topRows(offset_) * r.transpose();
      dk.array().colwise() *= t.kw.array();
      g.dv.topRows(offset_).noalias() = t.keys * r.leftCols(dv);
      g.dg.head(offset_) = (f_.kf.topRows(offset_).array() * dk.array()).rowwise().sum();
    }
  }
}

namespace {

/// The features of a block, finite or false (nothing may leave an OpenMP region by an exception). Under an emulated
/// storage non-finite features are a finding, not an error (issue "Reduced precision": overflow is reported, never
/// a crash): inputs that overflowed the format make them, as on the GPU, and the output's non-finite entries and the
/// rounding log say so; only a feature map that threw is false then.
template <typename T>
bool block_features_checked(const BlockFeatures<T>& features, const ConstRef<T>& x, bool keys, MatrixR<T>& f,
                            VectorX<T>& g, const Rounding& rounding) {
  try {
    features(x, keys, f, g);
  } catch (...) {
    return false;
  }
  if (keys && g.size() == 0) g.setZero(x.rows());
  return rounding.active() || (all_finite(f) && (!keys || all_finite(g)));
}

/// The emulated causal forms' check of their features: as block_features_checked, native only.
template <typename T>
void require_finite_features(const MatrixR<T>& fq, const MatrixR<T>& fk, const VectorX<T>& gk,
                             const Rounding& rounding) {
  require(rounding.active() || (all_finite(fq) && all_finite(fk) && all_finite(gk)),
          "kernel attention: non-finite features");
}

}  // namespace

template <typename T>
MatrixR<T> streamed_kernel_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                  const BlockFeatures<T>& features, bool nonnegative, KernelWorkspace<T>* ws_in,
                                  const Rounding& rounding) {
  const Index chunk = 2048, nk = k.rows(), nq = q.rows(), dv = v.cols();
  const Index chunks = (nk + chunk - 1) / chunk;
  KernelWorkspace<T> local;
  KernelWorkspace<T>& ws = ws_in ? *ws_in : local;
  ws.threads.resize(std::size_t(std::max(1, omp_get_max_threads())));
  ws.s.resize(std::size_t(chunks));
  ws.z.resize(std::size_t(chunks));
  ws.zabs.resize(std::size_t(chunks));
  auto& s = ws.s;
  auto& z = ws.z;
  auto& zabs = ws.zabs;
  std::vector<T> m(static_cast<std::size_t>(chunks), neg_inf<T>());
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (Index c = 0; c < chunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, nk - r0);
    auto& t = ws.threads[std::size_t(omp_get_thread_num())];
    MatrixR<T>& f = t.f;
    VectorX<T>& g = t.g;
    finite = block_features_checked<T>(features, k.middleRows(r0, len), true, f, g, rounding) && finite;
    if (!finite) continue;
    rounding(f, Held::tensor, "features φ(q), φ(k)");
    const T mc = g.maxCoeff();
    // e^{g_j − m_c} ψ(k_j), ≤ 1 per weight. The scalar exp per row, as the diagonal product this replaces took it
    // (Eigen's vectorized exp differs in the last bit): the committed values stay bit for bit.
    t.w.resize(len);
    for (Index j = 0; j < len; ++j) t.w(j) = std::exp(g(j) - mc);
    f.array().colwise() *= t.w.array();
    s[std::size_t(c)].noalias() = f.transpose() * v.middleRows(r0, len);
    z[std::size_t(c)].noalias() = f.colwise().sum().transpose();
    if (!nonnegative) zabs[std::size_t(c)].noalias() = f.cwiseAbs().colwise().sum().transpose();
    m[std::size_t(c)] = mc;
  }
  require(finite, "kernel attention: non-finite features (or a feature map failed)");
  const T mx = *std::max_element(m.begin(), m.end());
  MatrixR<T> state = s[0] * std::exp(m[0] - mx);
  VectorX<T> zsum = z[0] * std::exp(m[0] - mx);
  VectorX<T> zmag = nonnegative ? VectorX<T>() : VectorX<T>(zabs[0] * std::exp(m[0] - mx));
  for (Index c = 1; c < chunks; ++c) {
    const T w = std::exp(m[std::size_t(c)] - mx);
    state += s[std::size_t(c)] * w;
    zsum += z[std::size_t(c)] * w;
    if (!nonnegative) zmag += zabs[std::size_t(c)] * w;
  }
  rounding(state, Held::accumulator, "key–value state Σφ(k)vᵀ");
  rounding(zsum, Held::accumulator, "key sum Σφ(k)");
  const bool guarded = !rounding.rounds(Held::accumulator);  // eager divides as the transcription does
  MatrixR<T> out(nq, dv);
  const Index qchunks = (nq + chunk - 1) / chunk;
  bool qfinite = true;
#pragma omp parallel for schedule(static) reduction(&& : qfinite)
  for (Index c = 0; c < qchunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, nq - r0);
    auto& t = ws.threads[std::size_t(omp_get_thread_num())];
    MatrixR<T>& f = t.f;
    qfinite = block_features_checked<T>(features, q.middleRows(r0, len), false, f, t.g, rounding) && qfinite;
    if (!qfinite) continue;
    rounding(f, Held::tensor, "features φ(q), φ(k)");
    t.den.noalias() = f * zsum;
    if (!nonnegative) t.mag.noalias() = f.cwiseAbs() * zmag;
    const VectorX<T>& mag = nonnegative ? t.den : t.mag;
    out.middleRows(r0, len).noalias() = f * state;
    if (!guarded) {
      rounding(t.den, Held::accumulator, "normalisers φ(q)ᵀΣφ(k)");
      rounding.span(out.row(r0).data(), std::size_t(len * dv), Held::accumulator, "numerators φ(q)ᵀΣφ(k)vᵀ");
      for (Index r = 0; r < len; ++r) out.row(r0 + r) /= t.den(r);
      continue;
    }
    for (Index r = 0; r < len; ++r) out.row(r0 + r) *= safe_inverse(t.den(r), mag(r));
  }
  require(qfinite, "kernel attention: non-finite features");
  return out;
}

template <typename T>
MatrixR<T> emulated_causal_kernel_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                         const BlockFeatures<T>& features, bool nonnegative, Index chunk,
                                         const Rounding& rounding) {
  require(chunk >= 1 && k.rows() >= q.rows() && k.rows() == v.rows(), "causal kernel attention: shapes");
  const Index nq = q.rows(), nk = k.rows(), dv = v.cols(), off = nk - nq;
  MatrixR<T> fq, fk;
  VectorX<T> gq, gk;
  features(q, false, fq, gq);
  features(k, true, fk, gk);
  require_finite_features<T>(fq, fk, gk, rounding);
  rounding(fq, Held::tensor, "features φ(q), φ(k)");
  rounding(fk, Held::tensor, "features φ(q), φ(k)");
  const bool logscale = gk.size() > 0;  // keys carry e^{g_j} apart (careful Performer): a running maximum
  const bool guarded = !rounding.rounds(Held::accumulator);
  const Index m = fq.cols();
  MatrixR<T> state = MatrixR<T>::Zero(m, dv);
  VectorX<T> zsum = VectorX<T>::Zero(m), zabs = VectorX<T>::Zero(m);
  T mrun = -std::numeric_limits<T>::infinity();
  // Keys [a, b) weighted by e^{g − mref} (1 without log-scales).
  const auto weights = [&](Index a, Index b, T mref) {
    VectorX<T> w = VectorX<T>::Ones(b - a);
    if (logscale)
      for (Index j = a; j < b; ++j) w(j - a) = std::exp(gk(j) - mref);
    return w;
  };
  // Adds keys [a, b) to the state (in units of e^{mref}); eager stores the state as formed.
  const auto absorb = [&](Index a, Index b, T mref) {
    if (b <= a) return;
    const VectorX<T> w = weights(a, b, mref);
    const MatrixR<T> fw = w.asDiagonal() * fk.middleRows(a, b - a);
    state.noalias() += fw.transpose() * v.middleRows(a, b - a);
    zsum.noalias() += fw.colwise().sum().transpose();
    if (!nonnegative) zabs.noalias() += fw.cwiseAbs().colwise().sum().transpose();
    rounding(state, Held::accumulator, "key–value state Σφ(k)vᵀ");
    rounding(zsum, Held::accumulator, "key sum Σφ(k)");
  };
  const auto rescale = [&](T mnew) {  // the state to units of e^{mnew} (careful Performer)
    if (!logscale || mnew == mrun) return;
    const T a = mrun == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(mrun - mnew);
    state *= a;
    zsum *= a;
    zabs *= a;
    mrun = mnew;
  };
  if (off > 0) {  // the keys before the first query's own position: seen by every query
    if (logscale) rescale(gk.head(off).maxCoeff());
    absorb(0, off, mrun);
  }
  MatrixR<T> out(nq, dv);
  for (Index i0 = 0; i0 < nq; i0 += chunk) {
    const Index len = std::min(chunk, nq - i0), j0 = i0 + off;
    if (logscale) rescale(std::max(mrun, gk.segment(j0, len).maxCoeff()));
    const VectorX<T> w = weights(j0, j0 + len, mrun);
    // Intra-chunk scores, masked to j ≤ i (+ off), each key with its weight; stored (a tensor, both policies).
    MatrixR<T> a = fq.middleRows(i0, len) * fk.middleRows(j0, len).transpose();
    for (Index r = 0; r < len; ++r)
      for (Index c = 0; c < len; ++c) a(r, c) = c <= r ? a(r, c) * w(c) : T(0);
    rounding(a, Held::tensor, "intra-chunk scores φ(q)ᵀφ(k)");
    MatrixR<T> num = a * v.middleRows(j0, len);
    num.noalias() += fq.middleRows(i0, len) * state;
    VectorX<T> den = a.rowwise().sum();
    den.noalias() += fq.middleRows(i0, len) * zsum;
    if (!guarded) {
      rounding(num, Held::accumulator, "numerators φ(q)ᵀΣφ(k)vᵀ");
      rounding(den, Held::accumulator, "normalisers φ(q)ᵀΣφ(k)");
      for (Index r = 0; r < len; ++r) out.row(i0 + r) = num.row(r) / den(r);
    } else {
      VectorX<T> mag = den;
      if (!nonnegative) {
        mag = a.cwiseAbs().rowwise().sum();
        mag.noalias() += fq.middleRows(i0, len).cwiseAbs() * zabs;
      }
      for (Index r = 0; r < len; ++r) out.row(i0 + r) = num.row(r) * safe_inverse(den(r), mag(r));
    }
    absorb(j0, j0 + len, mrun);
  }
  return out;
}

namespace {
// Rows per chunk of the backward's passes: fixed, so the chunk sums' order (and the gradients' bits) does not depend on
// the thread count; small enough that n = 1024 still splits over two threads and a chunk's features stay in cache.
constexpr Index kBackwardChunk = 512;

/// A feature map's VJP on a block, false when it threw (as block_features_checked).
template <typename T>
bool block_backward_checked(const BlockFeaturesBackward<T>& back, const ConstRef<T>& x, bool keys, const ConstRef<T>& f,
                            const ConstRef<T>& df, const ConstVecRef<T>& dg, MutRef<T> dx) {
  try {
    back(x, keys, f, df, dg, dx);
  } catch (...) {
    return false;
  }
  return true;
}

}  // namespace

template <typename T>
Gradients<T> streamed_kernel_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                      const ConstRef<T>& d_out, const BlockFeatures<T>& features,
                                      const BlockFeaturesBackward<T>& features_backward, bool nonnegative,
                                      KernelBackwardWorkspace<T>* ws_in, const Rounding& rounding) {
  require(k.rows() == v.rows() && d_out.rows() == q.rows() && d_out.cols() == v.cols() && q.cols() == k.cols() &&
              k.rows() > 0,
          "kernel attention backward: dimension mismatch");
  const Index chunk = kBackwardChunk, nk = k.rows(), nq = q.rows(), dv = v.cols();
  const Index kchunks = (nk + chunk - 1) / chunk, qchunks = (nq + chunk - 1) / chunk;
  KernelBackwardWorkspace<T> local;
  KernelBackwardWorkspace<T>& ws = ws_in ? *ws_in : local;
  ws.threads.resize(std::size_t(std::max(1, omp_get_max_threads())));
  ws.s.resize(std::size_t(kchunks));
  ws.zabs.resize(std::size_t(kchunks));
  ws.r.resize(std::size_t(qchunks));
  ws.m.assign(std::size_t(kchunks), neg_inf<T>());
  Gradients<T> grad;
  grad.dq.resize(nq, q.cols());
  grad.dk.resize(nk, k.cols());
  grad.dv.resize(nk, dv);
  const VectorX<T> none;  // a query's ∂L/∂g: its log-scale is dropped (a per-query factor)

  // Keys: S̃_c = Σ_{j in chunk c} e^{g_j − m_c} kf_j Ṽ_jᵀ, Ṽ_j = [v_j, 1] (numerators' and denominators' sums), and
  // |Ψ̃|ᵀ1 for the guard when features may be negative.
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (Index c = 0; c < kchunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, nk - r0);
    auto& t = ws.threads[std::size_t(omp_get_thread_num())];
    ok = block_features_checked<T>(features, k.middleRows(r0, len), true, t.f, t.g, rounding) && ok;
    if (!ok) continue;
    rounding(t.f, Held::tensor, "features φ(q), φ(k)");  // as the forward stored them
    const T mc = t.g.maxCoeff();
    t.w = (t.g.array() - mc).exp();
    t.f.array().colwise() *= t.w.array();
    MatrixR<T>& s = ws.s[std::size_t(c)];
    s.resize(t.f.cols(), dv + 1);
    s.leftCols(dv).noalias() = t.f.transpose() * v.middleRows(r0, len);
    s.col(dv).noalias() = t.f.colwise().sum().transpose();
    if (!nonnegative) ws.zabs[std::size_t(c)].noalias() = t.f.cwiseAbs().colwise().sum().transpose();
    ws.m[std::size_t(c)] = mc;
  }
  require(ok, "kernel attention: non-finite features (or a feature map failed)");
  // Rescaled to the common stabilizer M = max g and summed in chunk order: S̃ = Ψ'ᵀṼ, ψ'_j = e^{g_j − M} kf_j.
  const T mx = *std::max_element(ws.m.begin(), ws.m.end());
  MatrixR<T>& s = ws.state;
  VectorX<T>& zmag = ws.zmag;
  s = ws.s[0] * std::exp(ws.m[0] - mx);
  if (!nonnegative) zmag = ws.zabs[0] * std::exp(ws.m[0] - mx);
  for (Index c = 1; c < kchunks; ++c) {
    const T w = std::exp(ws.m[std::size_t(c)] - mx);
    s += ws.s[std::size_t(c)] * w;
    if (!nonnegative) zmag += ws.zabs[std::size_t(c)] * w;
  }
  rounding(s, Held::accumulator, "key–value state Σφ(k)vᵀ, key sum Σφ(k)");
  const bool guarded = !rounding.rounds(Held::accumulator);  // eager divides as the transcription does

  // Queries: y_i = S̃ᵀφ_i = [numerator, D_i] (Katharopoulos et al. 2020 eq. (2)), O_i = y_i,v / D_i (D guarded as the
  // forward guards it), W̃_i = [dO_i, −dO_iᵀO_i] / D_i; R_c = Σ_{i in chunk c} φ_i W̃_iᵀ; ∂L/∂φ_i = S̃ W̃_i and dQ.
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (Index c = 0; c < qchunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, nq - r0);
    auto& t = ws.threads[std::size_t(omp_get_thread_num())];
    ok = block_features_checked<T>(features, q.middleRows(r0, len), false, t.f, t.g, rounding) && ok;
    if (!ok) continue;
    rounding(t.f, Held::tensor, "features φ(q), φ(k)");
    t.y.noalias() = t.f * s;
    rounding(t.y, Held::accumulator, "numerators, normalisers");
    if (!nonnegative) t.mag.noalias() = t.f.cwiseAbs() * zmag;
    t.inv.resize(len);
    for (Index r = 0; r < len; ++r)
      t.inv(r) = guarded ? safe_inverse(t.y(r, dv), nonnegative ? t.y(r, dv) : t.mag(r)) : T(1) / t.y(r, dv);
    const auto dob = d_out.middleRows(r0, len);
    t.wt.resize(len, dv + 1);
    t.wt.leftCols(dv) = dob.array().colwise() * t.inv.array();
    t.wt.col(dv) = -(t.inv.array().square() * (dob.array() * t.y.leftCols(dv).array()).rowwise().sum());
    rounding(t.wt, Held::accumulator, "∂L/∂numerators, ∂L/∂normalisers");  // the division's gradients (eager)
    ws.r[std::size_t(c)].noalias() = t.f.transpose() * t.wt;
    t.df.noalias() = t.wt * s.transpose();
    rounding(t.df, Held::tensor, "∂L/∂φ");
    ok = block_backward_checked<T>(features_backward, q.middleRows(r0, len), false, t.f, t.df, none,
                                   grad.dq.middleRows(r0, len)) &&
         ok;
  }
  require(ok, "kernel attention backward: non-finite features (or a feature map's backward failed)");
  MatrixR<T>& r = ws.rstate;
  r = ws.r[0];
  for (Index c = 1; c < qchunks; ++c) r += ws.r[std::size_t(c)];
  rounding(r, Held::accumulator, "backward state Σφ(q)W̃ᵀ");

  // Keys again: ∂L/∂ψ'_j = R Ṽ_j, dV_j = R_vᵀψ'_j (P̃ᵀdO = Ψ'ΦᵀD⁻¹dO); ψ_j = e^{g_j}·kf_j, so ∂L/∂kf_j =
  // e^{g_j − M}·∂L/∂ψ'_j and ∂L/∂g_j = kf_j·∂L/∂kf_j; then dK.
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (Index c = 0; c < kchunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, nk - r0);
    auto& t = ws.threads[std::size_t(omp_get_thread_num())];
    ok = block_features_checked<T>(features, k.middleRows(r0, len), true, t.f, t.g, rounding) && ok;
    if (!ok) continue;
    rounding(t.f, Held::tensor, "features φ(q), φ(k)");
    t.w = (t.g.array() - mx).exp();
    t.df.noalias() = v.middleRows(r0, len) * r.leftCols(dv).transpose();
    t.df.rowwise() += r.col(dv).transpose();
    rounding(t.df, Held::tensor, "∂L/∂φ");
    auto dvb = grad.dv.middleRows(r0, len);
    dvb.noalias() = t.f * r.leftCols(dv);
    dvb.array().colwise() *= t.w.array();
    t.df.array().colwise() *= t.w.array();
    t.dg = (t.f.array() * t.df.array()).rowwise().sum();
    ok = block_backward_checked<T>(features_backward, k.middleRows(r0, len), true, t.f, t.df, t.dg,
                                   grad.dk.middleRows(r0, len)) &&
         ok;
  }
  require(ok, "kernel attention backward: non-finite features (or a feature map's backward failed)");
  return grad;
}

template <typename T>
Gradients<T> emulated_causal_kernel_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                             const ConstRef<T>& d_out, const BlockFeatures<T>& features,
                                             const BlockFeaturesBackward<T>& features_backward, bool nonnegative,
                                             Index chunk, const Rounding& rounding) {
  require(chunk >= 1 && k.rows() >= q.rows() && k.rows() == v.rows() && d_out.rows() == q.rows() &&
              d_out.cols() == v.cols(),
          "causal kernel attention backward: shapes");
  const Index nq = q.rows(), nk = k.rows(), dv = v.cols(), off = nk - nq;
  // The forward again (emulated_causal_kernel_output's steps and roundings, bit for bit), keeping what reverse mode
  // needs per chunk: the state and key sum it read (after its rescale), the rescale's factor, the stored scores,
  // numerators and the inverse normalisers.
  MatrixR<T> fq, fk;
  VectorX<T> gq, gk;
  features(q, false, fq, gq);
  features(k, true, fk, gk);
  require_finite_features<T>(fq, fk, gk, rounding);
  rounding(fq, Held::tensor, "features φ(q), φ(k)");
  rounding(fk, Held::tensor, "features φ(q), φ(k)");
  const bool logscale = gk.size() > 0;
  const bool guarded = !rounding.rounds(Held::accumulator);
  const Index m = fq.cols(), chunks = (nq + chunk - 1) / chunk;
  MatrixR<T> state = MatrixR<T>::Zero(m, dv);
  VectorX<T> zsum = VectorX<T>::Zero(m), zabs = VectorX<T>::Zero(m);
  VectorX<T> w = VectorX<T>::Ones(nk);  // each key's weight e^{g_j − m} where it is used (1 without log-scales)
  T mrun = -std::numeric_limits<T>::infinity();
  struct Chunk {
    MatrixR<T> state, a, num;
    VectorX<T> zsum, inv;
    T factor = 1;  // the rescale at the chunk's start: state_used = factor · state_before
  };
  std::vector<Chunk> rec(static_cast<std::size_t>(chunks));
  const auto absorb = [&](Index a0, Index b) {
    if (b <= a0) return;
    const MatrixR<T> fw = w.segment(a0, b - a0).asDiagonal() * fk.middleRows(a0, b - a0);
    state.noalias() += fw.transpose() * v.middleRows(a0, b - a0);
    zsum.noalias() += fw.colwise().sum().transpose();
    if (!nonnegative) zabs.noalias() += fw.cwiseAbs().colwise().sum().transpose();
    rounding(state, Held::accumulator, "key–value state Σφ(k)vᵀ");
    rounding(zsum, Held::accumulator, "key sum Σφ(k)");
  };
  const auto rescale = [&](T mnew) {
    if (!logscale || mnew == mrun) return T(1);
    const T a = mrun == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(mrun - mnew);
    state *= a;
    zsum *= a;
    zabs *= a;
    mrun = mnew;
    return a;
  };
  const auto weigh = [&](Index a0, Index b) {
    if (logscale)
      for (Index j = a0; j < b; ++j) w(j) = std::exp(gk(j) - mrun);
  };
  if (off > 0) {
    if (logscale) rescale(gk.head(off).maxCoeff());
    weigh(0, off);
    absorb(0, off);
  }
  for (Index c = 0; c < chunks; ++c) {
    const Index i0 = c * chunk, len = std::min(chunk, nq - i0), j0 = i0 + off;
    Chunk& r = rec[std::size_t(c)];
    r.factor = logscale ? rescale(std::max(mrun, gk.segment(j0, len).maxCoeff())) : T(1);
    weigh(j0, j0 + len);
    r.a = fq.middleRows(i0, len) * fk.middleRows(j0, len).transpose();
    for (Index i = 0; i < len; ++i)
      for (Index j = 0; j < len; ++j) r.a(i, j) = j <= i ? r.a(i, j) * w(j0 + j) : T(0);
    rounding(r.a, Held::tensor, "intra-chunk scores φ(q)ᵀφ(k)");
    r.num = r.a * v.middleRows(j0, len);
    r.num.noalias() += fq.middleRows(i0, len) * state;
    VectorX<T> den = r.a.rowwise().sum();
    den.noalias() += fq.middleRows(i0, len) * zsum;
    r.inv.resize(len);
    if (!guarded) {
      rounding(r.num, Held::accumulator, "numerators φ(q)ᵀΣφ(k)vᵀ");
      rounding(den, Held::accumulator, "normalisers φ(q)ᵀΣφ(k)");
      for (Index i = 0; i < len; ++i) r.inv(i) = T(1) / den(i);
    } else {
      VectorX<T> mag = den;
      if (!nonnegative) {
        mag = r.a.cwiseAbs().rowwise().sum();
        mag.noalias() += fq.middleRows(i0, len).cwiseAbs() * zabs;
      }
      for (Index i = 0; i < len; ++i) r.inv(i) = safe_inverse(den(i), mag(i));
    }
    r.state = state;
    r.zsum = zsum;
    absorb(j0, j0 + len);
  }

  // Reverse mode, chunk by chunk from the last: O_i = num_i / D_i gives W̃_i = [dO_i/D_i, −dO_iᵀnum_i/D_i²] (the
  // division's gradients); num = A·V_c + φ_c·S, D = A·1 + φ_c·z with A the masked weighted scores; the absorb after
  // the output, S ← S + ψ'_cᵀV_c, sends ∂L/∂S (the gradients of every later chunk) to ψ'_c and V_c. Stored as the
  // forward stores: ∂L/∂A under both policies (a tensor), the division's gradients and the backward state ∂L/∂S,
  // ∂L/∂z under eager; ∂L/∂φ under both.
  MatrixR<T> ds = MatrixR<T>::Zero(m, dv), dfq = MatrixR<T>::Zero(nq, m), dfw = MatrixR<T>::Zero(nk, m);
  VectorX<T> dz = VectorX<T>::Zero(m);
  Gradients<T> grad;
  grad.dv = MatrixR<T>::Zero(nk, dv);
  const auto absorb_backward = [&](Index a0, Index b) {
    if (b <= a0) return;
    const MatrixR<T> fw = w.segment(a0, b - a0).asDiagonal() * fk.middleRows(a0, b - a0);
    dfw.middleRows(a0, b - a0).noalias() += v.middleRows(a0, b - a0) * ds.transpose();
    dfw.middleRows(a0, b - a0).rowwise() += dz.transpose();
    grad.dv.middleRows(a0, b - a0).noalias() += fw * ds;
  };
  for (Index c = chunks - 1; c >= 0; --c) {
    const Index i0 = c * chunk, len = std::min(chunk, nq - i0), j0 = i0 + off;
    const Chunk& r = rec[std::size_t(c)];
    absorb_backward(j0, j0 + len);
    const auto dob = d_out.middleRows(i0, len);
    MatrixR<T> wn = dob.array().colwise() * r.inv.array();
    VectorX<T> wd = -(r.inv.array().square() * (dob.array() * r.num.array()).rowwise().sum()).matrix();
    rounding(wn, Held::accumulator, "∂L/∂numerators, ∂L/∂normalisers");
    rounding(wd, Held::accumulator, "∂L/∂numerators, ∂L/∂normalisers");
    MatrixR<T> da = wn * v.middleRows(j0, len).transpose();
    da.colwise() += wd;
    for (Index i = 0; i < len; ++i)
      for (Index j = i + 1; j < len; ++j) da(i, j) = T(0);
    rounding(da, Held::tensor, "∂L/∂intra-chunk scores");
    grad.dv.middleRows(j0, len).noalias() += r.a.transpose() * wn;
    const MatrixR<T> fw = w.segment(j0, len).asDiagonal() * fk.middleRows(j0, len);
    auto dq_c = dfq.middleRows(i0, len);
    dq_c.noalias() += wn * r.state.transpose();
    dq_c.noalias() += wd * r.zsum.transpose();
    dq_c.noalias() += da * fw;
    dfw.middleRows(j0, len).noalias() += da.transpose() * fq.middleRows(i0, len);
    ds.noalias() += fq.middleRows(i0, len).transpose() * wn;
    dz.noalias() += fq.middleRows(i0, len).transpose() * wd;
    rounding(ds, Held::accumulator, "backward state ∂L/∂Σφ(k)vᵀ, ∂L/∂Σφ(k)");
    rounding(dz, Held::accumulator, "backward state ∂L/∂Σφ(k)vᵀ, ∂L/∂Σφ(k)");
    ds *= r.factor;  // the rescale at the chunk's start
    dz *= r.factor;
  }
  absorb_backward(0, off);
  rounding(dfq, Held::tensor, "∂L/∂φ");
  rounding(dfw, Held::tensor, "∂L/∂φ");
  // ψ'_j = w_j·kf_j: ∂L/∂kf_j = w_j·∂L/∂ψ'_j, and with log-scales ∂L/∂g_j = kf_j·∂L/∂kf_j (streamed_kernel_backward's
  // convention); the feature maps' VJP on every row at once.
  MatrixR<T> dfk = w.asDiagonal() * dfw;
  const VectorX<T> dg = (fk.array() * dfk.array()).rowwise().sum();
  grad.dq.resize(nq, q.cols());
  grad.dk.resize(nk, k.cols());
  const VectorX<T> none;
  features_backward(q, false, fq, dfq, none, grad.dq);
  features_backward(k, true, fk, dfk, dg, grad.dk);
  return grad;
}

template <typename T>
Gradients<T> kernel_operator_backward(const KernelOperator<T>& op, const ConstRef<T>& q, const ConstRef<T>& k,
                                      const ConstRef<T>& v, const ConstRef<T>& d_out,
                                      const BlockFeaturesBackward<T>& features_backward,
                                      KernelBackwardWorkspace<T>& ws) {
  require(op.causal(), "internal: kernel_operator_backward takes the causal operator (its key features unfolded)");
  require(q.rows() == op.rows() && k.rows() == op.cols(), "kernel attention backward: dimension mismatch");
  op.backward(v, d_out, ws.fg, ws);
  const FeatureMaps<T>& f = op.features();
  const FeatureGradients<T>& fg = ws.fg;
  Gradients<T> grad;
  grad.dq.resize(q.rows(), q.cols());
  grad.dk.resize(k.rows(), k.cols());
  const VectorX<T> none;
  // The feature maps' VJP, row by row: chunks of queries and keys in parallel (each row's own; no sum across rows).
  const Index chunk = kBackwardChunk, qchunks = (q.rows() + chunk - 1) / chunk,
              kchunks = (k.rows() + chunk - 1) / chunk;
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (Index c = 0; c < qchunks + kchunks; ++c) {
    const bool keys = c >= qchunks;
    const Index r0 = (keys ? c - qchunks : c) * chunk, len = std::min(chunk, (keys ? k.rows() : q.rows()) - r0);
    if (keys)
      ok = block_backward_checked<T>(features_backward, k.middleRows(r0, len), true, f.kf.middleRows(r0, len),
                                     fg.dkf.middleRows(r0, len), fg.dg.segment(r0, len), grad.dk.middleRows(r0, len)) &&
           ok;
    else
      ok = block_backward_checked<T>(features_backward, q.middleRows(r0, len), false, f.qf.middleRows(r0, len),
                                     fg.dqf.middleRows(r0, len), none, grad.dq.middleRows(r0, len)) &&
           ok;
  }
  require(ok, "kernel attention backward: a feature map's backward failed");
  grad.dv = std::move(ws.fg.dv);  // the one n × d_v the caller keeps
  return grad;
}

template class KernelOperator<float>;
template class KernelOperator<double>;
template MatrixR<float> streamed_kernel_output<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                      const ConstRef<float>&, const BlockFeatures<float>&, bool,
                                                      KernelWorkspace<float>*, const Rounding&);
template MatrixR<double> streamed_kernel_output<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                        const ConstRef<double>&, const BlockFeatures<double>&, bool,
                                                        KernelWorkspace<double>*, const Rounding&);

template MatrixR<float> emulated_causal_kernel_output<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                             const ConstRef<float>&, const BlockFeatures<float>&, bool,
                                                             Index, const Rounding&);
template MatrixR<double> emulated_causal_kernel_output<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                               const ConstRef<double>&, const BlockFeatures<double>&,
                                                               bool, Index, const Rounding&);
template Gradients<float> streamed_kernel_backward<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                          const ConstRef<float>&, const ConstRef<float>&,
                                                          const BlockFeatures<float>&,
                                                          const BlockFeaturesBackward<float>&, bool,
                                                          KernelBackwardWorkspace<float>*, const Rounding&);
template Gradients<double> streamed_kernel_backward<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                            const ConstRef<double>&, const ConstRef<double>&,
                                                            const BlockFeatures<double>&,
                                                            const BlockFeaturesBackward<double>&, bool,
                                                            KernelBackwardWorkspace<double>*, const Rounding&);
template Gradients<float> emulated_causal_kernel_backward<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                                 const ConstRef<float>&, const ConstRef<float>&,
                                                                 const BlockFeatures<float>&,
                                                                 const BlockFeaturesBackward<float>&, bool, Index,
                                                                 const Rounding&);
template Gradients<double> emulated_causal_kernel_backward<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                                   const ConstRef<double>&, const ConstRef<double>&,
                                                                   const BlockFeatures<double>&,
                                                                   const BlockFeaturesBackward<double>&, bool, Index,
                                                                   const Rounding&);
template Gradients<float> kernel_operator_backward<float>(const KernelOperator<float>&, const ConstRef<float>&,
                                                          const ConstRef<float>&, const ConstRef<float>&,
                                                          const ConstRef<float>&, const BlockFeaturesBackward<float>&,
                                                          KernelBackwardWorkspace<float>&);
template Gradients<double> kernel_operator_backward<double>(const KernelOperator<double>&, const ConstRef<double>&,
                                                            const ConstRef<double>&, const ConstRef<double>&,
                                                            const ConstRef<double>&,
                                                            const BlockFeaturesBackward<double>&,
                                                            KernelBackwardWorkspace<double>&);

}  // namespace attnlab
