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
  return inv_den_.asDiagonal() * unnormalized(f_.qf, f_.kf, x);
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
MatrixR<T> KernelOperator<T>::row_block(Index first, Index count) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  const Index vis = causal_ ? first + count + offset_ : cols();  // keys the last row sees
  MatrixR<T> s = f_.qf.middleRows(first, count) * f_.kf.topRows(vis).transpose();
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r, seen = causal_ ? i + offset_ + 1 : vis;
    s.row(r).head(seen).array() *= (f_.k_logscale.head(seen).array() - qmax_(i)).exp().transpose() * inv_den_(i);
    s.row(r).tail(vis - seen).setZero();
  }
  MatrixR<T> out = MatrixR<T>::Zero(count, cols());
  out.leftCols(vis) = s;
  return out;
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
void KernelOperator<T>::mask_block(MatrixR<T>& a, Index c) const {
  const Index i0 = c * chunk_, len = a.rows(), j0 = i0 + offset_;
  for (Index r = 0; r < len; ++r) {
    a.row(r).head(r + 1).array() *= (f_.k_logscale.segment(j0, r + 1).array() - qmax_(i0 + r)).exp().transpose();
    a.row(r).tail(len - r - 1).setZero();
  }
}

template <typename T>
FeatureGradients<T> KernelOperator<T>::backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  require(v.rows() == cols() && d_out.rows() == rows() && d_out.cols() == v.cols(),
          "kernel attention backward: dimension mismatch");
  // VJP of O_i = Σ_j a_ij v_j / Σ_j a_ij (Katharopoulos et al. 2020 eq. (2)): dA_ij = (dO_iᵀv_j − dO_iᵀO_i) / D_ii
  // = W̃_iᵀṼ_j with W̃_i = [dO_i, −dO_iᵀO_i]/D_ii, Ṽ_j = [v_j, 1]. A and D are both in the units e^{−M_i} of query i
  // (a factor of row i that cancels in O_i), so W̃ is in the inverse units and W̃_iᵀṼ_j·(weights in units) is exact.
  const Index dv = v.cols(), feats = f_.qf.cols();
  const MatrixR<T> out = apply(v);
  MatrixR<T> wt(rows(), dv + 1), vt(cols(), dv + 1);
  wt.leftCols(dv) = inv_den_.asDiagonal() * d_out;
  wt.col(dv) = -(inv_den_.array() * (d_out.array() * out.array()).rowwise().sum());
  vt.leftCols(dv) = v;
  vt.col(dv).setOnes();
  FeatureGradients<T> g;
  g.dv = apply_transpose(d_out);  // dV = P̃ᵀ dO
  if (!causal_) {
    // Global sums: ∂L/∂φ_i = (ΨᵀṼ) W̃_i, ∂L/∂ψ'_j = (ΦᵀW̃) Ṽ_j for the folded ψ'_j = e^{g_j − M} kf_j.
    const MatrixR<T> s = detail::tall_transpose_product<T>(f_.kf, vt);  // M × (d_v + 1)
    const MatrixR<T> r = detail::tall_transpose_product<T>(f_.qf, wt);  // M × (d_v + 1)
    g.dqf.noalias() = wt * s.transpose();
    g.dkf.noalias() = vt * r.transpose();
    // ψ_j = e^{g_j}·kf_j: ∂L/∂g_j = ψ'_j·∂L/∂ψ'_j, ∂L/∂kf_j = e^{g_j − M}·∂L/∂ψ'_j.
    g.dg = (f_.kf.array() * g.dkf.array()).rowwise().sum();
    g.dkf = kweight_.asDiagonal() * g.dkf;
    return g;
  }
  // Causal, chunked (the forward's blocks). Queries: the prefix state S = Σ_{keys before block c} ψ(k_j)Ṽ_jᵀ in units
  // e^{−before(c)}, read with e^{before(c) − M_i}, plus the block's masked dA times its keys' features.
  g.dqf.resize(rows(), feats);
  g.dkf.resize(cols(), feats);
  MatrixR<T> state = MatrixR<T>::Zero(feats, dv + 1);
  if (offset_ > 0) state.noalias() = scaled_keys(f_.kf, 0, offset_, before_block(0)).transpose() * vt.topRows(offset_);
  for (Index c = 0; c < blocks(); ++c) {
    const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
    const T m0 = before_block(c), m1 = before_block(c + 1);
    auto dq = g.dqf.middleRows(i0, len);
    if (m0 != neg_inf<T>()) {
      dq.noalias() = wt.middleRows(i0, len) * state.transpose();
      dq.array().colwise() *= (m0 - qmax_.segment(i0, len).array()).exp();
    } else {
      dq.setZero();
    }
    MatrixR<T> a = wt.middleRows(i0, len) * vt.middleRows(j0, len).transpose();  // dA of the block, unmasked
    mask_block(a, c);
    dq.noalias() += a * f_.kf.middleRows(j0, len);
    if (m0 != neg_inf<T>()) state *= std::exp(m0 - m1);
    state.noalias() += scaled_keys(f_.kf, j0, len, m1).transpose() * vt.middleRows(j0, len);
  }
  // Keys: reverse prefix sums over query blocks, R = Σ_{queries i in blocks > c} φ(q_i) W̃_iᵀ e^{before(c+1) − M_i},
  // read by block c's keys with e^{g_j − before(c+1)} (as apply_transpose), plus the block's masked dAᵀ times its
  // queries' features.
  MatrixR<T> r = MatrixR<T>::Zero(feats, dv + 1);
  for (Index c = blocks() - 1; c >= 0; --c) {
    const Index i0 = c * chunk_, len = std::min(rows(), i0 + chunk_) - i0, j0 = i0 + offset_;
    const T m0 = before_block(c), m1 = before_block(c + 1);
    auto dk = g.dkf.middleRows(j0, len);
    dk.noalias() = vt.middleRows(j0, len) * r.transpose();
    dk.array().colwise() *= (f_.k_logscale.segment(j0, len).array() - m1).exp();
    MatrixR<T> a = wt.middleRows(i0, len) * vt.middleRows(j0, len).transpose();
    mask_block(a, c);
    dk.noalias() += a.transpose() * f_.qf.middleRows(i0, len);
    if (m0 == neg_inf<T>()) continue;  // no key before this block: nothing reads R further back
    r *= std::exp(m0 - m1);
    const VectorX<T> f = (m0 - qmax_.segment(i0, len).array()).exp();
    r.noalias() += f_.qf.middleRows(i0, len).transpose() * (f.asDiagonal() * wt.middleRows(i0, len));
  }
  if (offset_ > 0) {
    auto dk = g.dkf.topRows(offset_);
    dk.noalias() = vt.topRows(offset_) * r.transpose();
    dk.array().colwise() *= (f_.k_logscale.head(offset_).array() - before_block(0)).exp();
  }
  // ψ_j = e^{g_j}·kf_j: ∂L/∂g_j = kf_j·∂L/∂kf_j.
  g.dg = (f_.kf.array() * g.dkf.array()).rowwise().sum();
  return g;
}

template <typename T>
MatrixR<T> streamed_kernel_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                  const BlockFeatures<T>& features, bool nonnegative, KernelWorkspace<T>* ws_in) {
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
  // The features of a block, finite or false (nothing may leave an OpenMP region by an exception).
  const auto block = [&](const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g) {
    try {
      features(x, keys, f, g);
    } catch (...) {
      return false;
    }
    if (keys && g.size() == 0) g.setZero(x.rows());
    return all_finite(f) && (!keys || all_finite(g));
  };
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (Index c = 0; c < chunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, nk - r0);
    auto& t = ws.threads[std::size_t(omp_get_thread_num())];
    MatrixR<T>& f = t.f;
    VectorX<T>& g = t.g;
    finite = block(k.middleRows(r0, len), true, f, g) && finite;
    if (!finite) continue;
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
  MatrixR<T> out(nq, dv);
  const Index qchunks = (nq + chunk - 1) / chunk;
  bool qfinite = true;
#pragma omp parallel for schedule(static) reduction(&& : qfinite)
  for (Index c = 0; c < qchunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, nq - r0);
    auto& t = ws.threads[std::size_t(omp_get_thread_num())];
    MatrixR<T>& f = t.f;
    qfinite = block(q.middleRows(r0, len), false, f, t.g) && qfinite;
    if (!qfinite) continue;
    t.den.noalias() = f * zsum;
    if (!nonnegative) t.mag.noalias() = f.cwiseAbs() * zmag;
    const VectorX<T>& mag = nonnegative ? t.den : t.mag;
    out.middleRows(r0, len).noalias() = f * state;
    for (Index r = 0; r < len; ++r) out.row(r0 + r) *= safe_inverse(t.den(r), mag(r));
  }
  require(qfinite, "kernel attention: non-finite features");
  return out;
}

template class KernelOperator<float>;
template class KernelOperator<double>;
template MatrixR<float> streamed_kernel_output<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                      const ConstRef<float>&, const BlockFeatures<float>&, bool,
                                                      KernelWorkspace<float>*);
template MatrixR<double> streamed_kernel_output<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                        const ConstRef<double>&, const BlockFeatures<double>&, bool,
                                                        KernelWorkspace<double>*);

}  // namespace attnlab
