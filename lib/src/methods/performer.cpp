// `performer` — FAVOR+ random-feature attention (Choromanski et al. 2021, Lemma 1 and eq. (7)), normalized, causal
// by prefix sums (Katharopoulos et al. 2020 eqs. (9)–(10)). q and k are each multiplied by s^½ so that the features
// estimate exp(s·qᵀk). Stabilized: each query's features are divided by their largest (a per-query factor
// cancels in the normalization), each key's exponent is carried as a log-scale and stabilized by a common
// (running, when causal) maximum in the kernel engine; denominators are guarded there.
#include "attnlab/methods/performer.hpp"

#include "attnlab/components/random_features.hpp"
#include "attnlab/core/random.hpp"

#include <algorithm>
#include <cmath>

#include <omp.h>

namespace attnlab {

MethodDescriptor PerformerOptions::registry_entry() {
  return describe<PerformerMethod, PerformerOptions>(
             "Performer / FAVOR+ random features estimating exp(s·qᵀk)",
             "Choromanski et al. 2021 (Performer) Lemma 1, eq. (7); Lemma 2 for the variances",
             PerformerOptions::causal_support())
      .with_backward(
          Backward::yes("ω held fixed (stabilizers cancel: exact otherwise); causal by reverse prefix sums"))
      .with_storage(StorageEmulation::both(
          "positive kernel under eager; causal: linear's chunked transcription (careful: the keys' log-scales "
          "against a running maximum); careful: Q, K, V, the features (each query's divided by its "
          "largest, each key's with its log-scale apart: attnlab's own stabilisation) and O in the format, the "
          "log-scales, stabilisers, key–value state, key sum, numerators and normalisers in float32, guarded; eager: "
          "the reference code's features, every step stored — ω, s^½x, ωᵀx, x∘x, ‖x‖²/2, the exponent less the "
          "query's row maximum (keys: the largest projection of all keys), its exp (e^{−‖x‖²/2} inside the feature: "
          "it underflows for long queries, and 0/0 is NaN) — then the key–value state, key sum, numerators and "
          "normalisers, divided unguarded")
          .with_backward("V, dO, dQ, dK, dV, ∂L/∂φ in the format, the "
                         "features as the forward stored them; careful: the rest as linear's (float32 state, "
                         "normalisers and the division's gradients) and the feature map's backward in float32 with ω "
                         "unrounded; eager: linear's eager backward, then autograd's backward of the reference "
                         "features (maxima detached), every gradient tensor stored — ∂L/∂exponent = ∂L/∂φ∘φ, "
                         "∂L/∂(‖x‖²/2), its half, the square's and the projection's ∂L/∂x, their sum. Causal: "
                         "linear's causal backward (the chunked transcription's reverse mode), then the same "
                         "feature maps' backward"));
}

template <typename T>
void PerformerMethod<T>::check_params_storage(Storage storage, Policy policy) const {
  require(policy != Policy::eager || this->o_.kernel == PerformerKernel::Positive,
          "performer: the eager {} emulation follows the reference code's positive features; kernel=positive, or "
          "policy careful", storage_name(storage));
}

template <typename T>
void PerformerMethod<T>::prepare(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  scratch_.resize(std::size_t(std::max(1, omp_get_max_threads())));
  // ω is the method's parameter: drawn once per d (QR of Gaussian blocks) and reused by later calls.
  if (q.cols() != omega_d_) {
    const PerformerOptions& o = this->o_;
    Rng rng(o.seed);
    omega_ = performer_projection<T>(o.features, q.cols(), o.orthogonal, o.norms == PerformerNorms::Chi, rng);
    omega_d_ = q.cols();
  }
  if (opts.storage != Storage::native && opts.policy == Policy::eager) {  // kernel=positive: compute() checked
    omega_stored_ = omega_;
    this->rounding_hook()(omega_stored_, Held::tensor, "ω");
    // The reference code's key stabiliser: the largest projection over every key and feature, stored as computed.
    MatrixR<T> xs = k * T(std::sqrt(opts.scale));
    const Rounding r{opts.storage, opts.policy, nullptr};
    r(xs, Held::tensor, "");
    MatrixR<T> proj = xs * omega_stored_.transpose();
    r(proj, Held::tensor, "");
    key_max_ = proj.maxCoeff();
  }
}

template <typename T>
void PerformerMethod<T>::eager_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts,
                                        MatrixR<T>& f) const {
  // Transcribed from the reference code (and tools/eager_attention.py's performer), each operation's result stored in
  // the format: x·s^½; proj = (x·s^½)ωᵀ; ‖x·s^½‖²/2 as (x∘x).sum / 2; exp(proj − ‖x‖²/2 − max), the max per query
  // row, and over all keys and features for keys (prepare()). No 1/√M: a constant, it cancels, as the code omits it.
  const Rounding r = this->rounding_hook();
  MatrixR<T> xs = x * T(std::sqrt(opts.scale));
  r(xs, Held::tensor, "features: s^½x");
  MatrixR<T> proj = xs * omega_stored_.transpose();
  r(proj, Held::tensor, "features: ωᵀx");
  MatrixR<T> sq = xs.array().square().matrix();
  r(sq, Held::tensor, "features: x∘x");
  VectorX<T> half = sq.rowwise().sum();
  r(half, Held::tensor, "features: ‖x‖²");
  half /= T(2);
  r(half, Held::tensor, "features: ‖x‖²/2");
  f = proj.colwise() - half;
  r(f, Held::tensor, "features: ωᵀx − ‖x‖²/2");
  if (keys) {
    f.array() -= key_max_;
  } else {
    const VectorX<T> mx = proj.rowwise().maxCoeff();
    f.colwise() -= mx;
  }
  r(f, Held::tensor, "features: exponent less the maximum");
  f = f.array().exp().matrix();
}

template <typename T>
void PerformerMethod<T>::block_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, MatrixR<T>& f,
                                        VectorX<T>& g) const {
  // q and k are each multiplied by s^½ so that the features estimate exp(s·qᵀk). The query's log-scale is a
  // per-query factor: it cancels.
  // The buffers of this thread, kept across calls (f and g are the caller's: swapped in and out, not copied).
  if (opts.storage != Storage::native && opts.policy == Policy::eager) {
    eager_features(x, keys, opts, f);  // stored in the format by the kernel engine, as every feature is
    g.resize(0);
    return;
  }
  const std::size_t t = std::size_t(omp_get_thread_num());
  Scratch local;
  Scratch& sc = t < scratch_.size() ? scratch_[t] : local;
  sc.r.f.swap(f);
  performer_features_into<T>(x, T(std::sqrt(opts.scale)), omega_, this->o_.kernel, sc.r, sc.xs, sc.proj);
  f.swap(sc.r.f);
  if (keys) g = sc.r.logscale;
  else g.resize(0);
}

template <typename T>
void PerformerMethod<T>::block_features_backward(const ConstRef<T>& x, bool keys, const AttentionOptions& opts,
                                                 const ConstRef<T>& f, const ConstRef<T>& df, const ConstVecRef<T>& dg,
                                                 MutRef<T> dx) const {
  // The features of s^½·x as block_features made them (f), differentiated with ω fixed (Choromanski et al. 2021
  // Lemma 1, eq. (7)). A query's log-scale is dropped by the forward (it cancels), so only a key's ∂L/∂g enters.
  if (opts.storage != Storage::native && opts.policy == Policy::eager) {
    eager_features_backward(x, opts, f, df, dx);  // the kernel engine gives the eager keys no log-scale: dg is 0
    return;
  }
  const std::size_t t = std::size_t(omp_get_thread_num());
  MatrixR<T> local;
  MatrixR<T>& dp = t < scratch_.size() ? scratch_[t].dp : local;
  const VectorX<T> none;
  performer_features_backward_given<T>(x, T(std::sqrt(opts.scale)), omega_, this->o_.kernel, f, df,
                                       keys ? dg : ConstVecRef<T>(none), dx, dp);
}

template <typename T>
void PerformerMethod<T>::eager_features_backward(const ConstRef<T>& x, const AttentionOptions& opts,
                                                 const ConstRef<T>& f, const ConstRef<T>& df, MutRef<T> dx) const {
  // Autograd's backward of eager_features (f = exp(e), e = (ωᵀx_s − ‖x_s‖²/2) − max, x_s = s^½x), each gradient
  // tensor stored in the format as autograd stores it: exp's backward uses its stored output, de = df∘f; the maxima
  // are constants (the reference code detaches them: performer-pytorch's softmax_kernel), so ∂L/∂(ωᵀx_s) = de and
  // ∂L/∂(‖x_s‖²/2) = −Σ_m de; then ÷2, the square's 2x_s∘(·), the projection's de·ω, their sum (autograd
  // accumulates x_s's two gradients) and ·s^½. In exact arithmetic this is block_features_backward's result (the
  // positive features' log-scale term is the same −x_s·Σ_m de); stored, it rounds where a user's half-precision
  // training rounds.
  const Rounding r = this->rounding_hook();
  const T sh = T(std::sqrt(opts.scale));
  MatrixR<T> xs = x * sh;
  r.untallied()(xs, Held::tensor, "");  // as the forward stored it (tallied there)
  MatrixR<T> de = df.cwiseProduct(f);
  r(de, Held::tensor, "features' backward: ∂L/∂exponent");
  VectorX<T> dhalf = -de.rowwise().sum();
  r(dhalf, Held::tensor, "features' backward: ∂L/∂(‖x‖²/2)");
  dhalf /= T(2);
  r(dhalf, Held::tensor, "features' backward: ∂L/∂‖x‖²");
  MatrixR<T> dsq = (T(2) * xs.array()).colwise() * dhalf.array();
  r(dsq, Held::tensor, "features' backward: ∂L/∂x through x∘x");
  MatrixR<T> dxs;
  dxs.noalias() = de * omega_stored_;
  r(dxs, Held::tensor, "features' backward: ∂L/∂x through ωᵀx");
  dxs += dsq;
  r(dxs, Held::tensor, "features' backward: ∂L/∂(s^½x)");
  dx = dxs * sh;
}

template class PerformerMethod<float>;
template class PerformerMethod<double>;

}  // namespace attnlab
