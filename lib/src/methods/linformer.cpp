// `linformer` — Linformer (Wang et al. 2020, eq. (7)):
//   P̃ = softmax(s·Q(EK)ᵀ)·F,  output softmax(s·Q(EK)ᵀ)·(FV),  E, F ∈ ℝ^{k×n}
// with E, F Gaussian N(0, 1/k) (the JL projection of Wang et al. 2020, Theorem 2), uniform ±1/√k, mean pooling over
// k segments (pooling, one of the "general projections" of Wang et al. 2020 §4), or the identity (k = n: exact
// attention, for the exact limit). share_kv uses E = F (the key-value sharing of Wang et al. 2020 §4). The
// projections mix every position: a causal mask is refused.
#include "attnlab/methods/linformer.hpp"

#include "attnlab/components/landmarks.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/shared_draws.hpp"
#include "attnlab/operators/exact.hpp"
#include "detail/tall_products.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace attnlab {

MethodDescriptor LinformerOptions::registry_entry() {
  return describe<LinformerMethod, LinformerOptions>(
      "Linformer: softmax(Q(EK)ᵀ)·(FV) with k×n projections E, F (non-causal)",
      "Wang et al. 2020 (Linformer) eq. (7), Theorem 2", Causal::refused("E and F mix every position"))
      .with_backward(Backward::yes("E, F held fixed"))
      .with_storage(StorageEmulation::both(
          "as the eager transcription softmax(q @ (E @ k).T · s) @ (F @ v): Q, K, V, E, F, EK, FV, P (n × k, "
          "materialised) and O in the format under both policies; eager also the logits (the product and the scaled "
          "product), careful keeps those in float32; the softmax's internals in float32")
                        .with_backward("autograd's backward of that form: V, dO, dP, dS, d(EK), d(FV) and dQ, dK, "
                                       "dV in the format (s·dS again under eager); E, F held fixed as stored"));
}

template <typename T>
Status LinformerMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const Index kk = this->o_.k, n = k.rows();  // kk ≤ n: its declared limit (linformer.hpp), checked by compute()
  const LinformerProjection proj = this->o_.projection;
  Rng rng(this->o_.seed);
  const auto draw = [&]() -> MatrixR<T> {
    if (proj == LinformerProjection::Gaussian) return gaussian_matrix<T>(kk, n, rng) / T(std::sqrt(double(kk)));
    if (proj == LinformerProjection::Uniform) {
      MatrixR<T> r(kk, n);
      const T v = T(1) / T(std::sqrt(double(kk)));
      for (Index i = 0; i < kk; ++i)
        for (Index j = 0; j < n; ++j) r(i, j) = (rng.next_u64() >> 63) ? v : -v;
      return r;
    }
    if (proj == LinformerProjection::Pool) return segment_mean_matrix<T>(kk, n);
    require(kk == n, "linformer: projection=identity needs k = n_k = {}, got k = {}", n, kk);
    return MatrixR<T>::Identity(n, n);
  };
  // E and F are the method's parameters: drawn once per (n, k) and reused by later calls, and shared with every
  // other method object drawing the same ones (core/shared_draws.hpp: the draw, 2·k·n Gaussians, cost more than the
  // attention itself at n = 4096; a Python Method builds a new object at every fit).
  if (n != drawn_n_) {
    const std::string key = fmt::format("linformer<{}>|seed={}|projection={}|k={}|n={}|share_kv={}",
                                        sizeof(T), this->o_.seed, int(proj), kk, n, this->o_.share_kv);
    ef_ = shared_draw<std::pair<MatrixR<T>, MatrixR<T>>>(key, [&] {
      MatrixR<T> e = draw();
      MatrixR<T> f = this->o_.share_kv ? e : draw();
      return std::make_pair(std::move(e), std::move(f));
    });
    drawn_n_ = n;
  }
  const MatrixR<T>& e_ = ef_->first;
  if (opts.storage != Storage::native) {
    // The parameters as stored in the format, then E·K stored as formed (eager and careful alike: a tensor).
    const Rounding r = this->rounding_hook();
    MatrixR<T> e = e_;
    r(e, Held::tensor, "projections E, F");
    f_stored_ = ef_->second;
    r(f_stored_, Held::tensor, "projections E, F");
    ek_ = detail::tall_transpose_product<T>(e.transpose(), k);
    r(ek_, Held::tensor, "projected keys EK, values FV");
  } else {
    ek_ = detail::tall_transpose_product<T>(e_.transpose(), k);  // E·K, k × d, summed over n
  }
  q_ = q;
  plain_ = opts;
  plain_.causal = false;
  // Rows of P̃ are distributions exactly when F's rows are (pooling; the identity).
  this->defer_factors(kk, proj == LinformerProjection::Pool || proj == LinformerProjection::Identity);
  return Status::Success;
}

/// Eq. (7) is exact attention over k projected keys EK and values FV: O = softmax(s·Q(EK)ᵀ)·(FV), by the streaming
/// kernel, never forming the n×k matrix.
template <typename T>
MatrixR<T> LinformerMethod<T>::do_output(const ConstRef<T>& v) const {
  const MatrixR<T>& f_ = ef_->second;
  if (plain_.storage != Storage::native) {
    // Emulated half storage: the eager transcription's form, P (n × k) materialised and stored, then P·(FV).
    const Rounding r = this->rounding_hook();
    MatrixR<T> fv = detail::tall_transpose_product<T>(f_stored_.transpose(), v);
    r(fv, Held::tensor, "projected keys EK, values FV");
    return exact_matrix<T>(q_, ek_, plain_, r) * fv;
  }
  const MatrixR<T> fv = detail::tall_transpose_product<T>(f_.transpose(), v);  // k × d
  return exact_output<T>(q_, ek_, fv, plain_);
}

template <typename T>
std::pair<MatrixR<T>, MatrixR<T>> LinformerMethod<T>::make_factors() const {
  const MatrixR<T>& f_ = ef_->second;
  return {exact_matrix<T>(q_, ek_, plain_), f_.transpose()};
}

/// Eq. (7) as exact attention over (EK, FV) (Wang et al. 2020): its backward gives dQ, d(EK), d(FV); E and F are
/// fixed linear maps, so dK = Eᵀ·d(EK) and dV = Fᵀ·d(FV).
template <typename T>
Gradients<T> LinformerMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  if (plain_.storage != Storage::native) return emulated_backward(v, d_out);
  BackwardWorkspace& ws = ws_;
  const MatrixR<T>& e_ = ef_->first;
  const MatrixR<T>& f_ = ef_->second;
  ws.fv = detail::tall_transpose_product<T>(f_.transpose(), v);  // k × d_v, as do_output
  const Index kk = ek_.rows(), n = e_.cols(), d = q_.cols(), dv = v.cols();
  Gradients<T> g;
  g.dq.resize(q_.rows(), d);
  g.dk.resize(n, d);
  g.dv.resize(n, dv);
  ws.dek.resize(kk, d);
  ws.dfv.resize(kk, dv);
  exact_backward_set<T>(q_, ek_, ws.fv, d_out, plain_, g.dq, ws.dek, ws.dfv, ws.exact);
  // dK = Eᵀ·d(EK), dV = Fᵀ·d(FV) (n × k by k × d): fixed blocks of rows in parallel (the BLAS is pinned to one
  // thread per caller), each row's sums the same whatever the thread count.
  const Index rows = 512, blocks = (n + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic)
  for (Index b = 0; b < blocks; ++b) {
    const Index r0 = b * rows, len = std::min(rows, n - r0);
    g.dk.middleRows(r0, len).noalias() = e_.middleCols(r0, len).transpose() * ws.dek;
    g.dv.middleRows(r0, len).noalias() = f_.middleCols(r0, len).transpose() * ws.dfv;
  }
  return g;
}

/// Under an emulated reduced storage: autograd's backward of the eager transcription do_output emulates,
/// O = P·(FV) with P = softmax(s·Q(EK)ᵀ) materialised — dP = dO·(FV)ᵀ and dS = P ∘ (dP − D) stored (s·dS again
/// under eager), d(FV) = Pᵀ·dO and d(EK) = s·dSᵀ·Q stored, then dK = Eᵀ·d(EK), dV = Fᵀ·d(FV) with the stored E, F.
template <typename T>
Gradients<T> LinformerMethod<T>::emulated_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  const Rounding r = this->rounding_hook();
  const Rounding quiet = r.untallied();  // the forward's roundings again
  MatrixR<T> e = ef_->first;
  quiet(e, Held::tensor, "");
  MatrixR<T> fv = detail::tall_transpose_product<T>(f_stored_.transpose(), v);  // as do_output forms it
  quiet(fv, Held::tensor, "");
  const MatrixR<T> p = exact_matrix<T>(q_, ek_, plain_, quiet);  // n × k, as the forward stored it
  const T s = T(plain_.scale);
  MatrixR<T> dp = d_out * fv.transpose();
  r(dp, Held::tensor, "dP = dO·(FV)ᵀ");
  const VectorX<T> dsum = (p.array() * dp.array()).rowwise().sum();
  MatrixR<T> ds = (p.array() * (dp.array().colwise() - dsum.array())).matrix();
  r(ds, Held::tensor, "dS = P ∘ (dP − D)");
  ds *= s;
  r(ds, Held::accumulator, "dS = P ∘ (dP − D)");
  MatrixR<T> dfv = p.transpose() * d_out;
  r(dfv, Held::tensor, "d(EK), d(FV)");
  MatrixR<T> dek = ds.transpose() * q_;
  r(dek, Held::tensor, "d(EK), d(FV)");
  Gradients<T> g;
  g.dq = ds * ek_;
  g.dk = e.transpose() * dek;
  g.dv = f_stored_.transpose() * dfv;
  return g;
}

template class LinformerMethod<float>;
template class LinformerMethod<double>;

}  // namespace attnlab
