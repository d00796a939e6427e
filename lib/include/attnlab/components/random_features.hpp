// Performer / FAVOR+ random features (Choromanski et al. 2021, Lemma 1), exposed for the
// kernel-estimate experiments: exp(xᵀy) ≈ φ(x)ᵀφ(y) with x = s^½·q, y = s^½·k.
//   positive:   φ(x) = exp(ωᵀx − ‖x‖²/2) / √M                         (unbiased, positive)
//   trig:       φ(x) = exp(‖x‖²/2) [sin(ωᵀx), cos(ωᵀx)] / √M           (unbiased, can be negative)
//   hyperbolic: φ(x) = exp(−‖x‖²/2) [exp(ωᵀx), exp(−ωᵀx)] / √(2M)      (unbiased, positive, lower variance)
// ω_1…ω_M iid N(0, I_d), or orthogonal within blocks of d (QR of a Gaussian block) with row norms drawn from
// χ(d) (keeps the marginals Gaussian: unbiased) or all √d.
#pragma once

#include "attnlab/core/random.hpp"
#include "attnlab/core/types.hpp"

#include <string>

namespace attnlab {

enum class PerformerKernel { Positive, Trig, Hyperbolic };

/// M×d projection matrix, rows ω_m.
template <typename T>
MatrixR<T> performer_projection(Index m, Index d, bool orthogonal, bool chi_norms, Rng& rng);

/// Features of the rows of x, as exp(logscale_i)·f_i (f bounded): logscale carries the large exponent.
template <typename T>
struct RandomFeatures {
  MatrixR<T> f;
  VectorX<T> logscale;
};

template <typename T>
RandomFeatures<T> performer_features(const ConstRef<T>& x, const ConstRef<T>& omega, PerformerKernel kernel);

/// The same features of (scale·x) written into `out`, with `xs` (scale·x) and `proj` (scale·x·ωᵀ) as scratch; all
/// keep their storage when their sizes do not change: the allocation-free form for a method called again and
/// again. Bit for bit performer_features(x·scale, ω, kernel).
template <typename T>
void performer_features_into(const ConstRef<T>& x, T scale, const ConstRef<T>& omega, PerformerKernel kernel,
                             RandomFeatures<T>& out, MatrixR<T>& xs, MatrixR<T>& proj);

/// The vector–Jacobian product of performer_features_into(x, scale, ω, kernel), given the features f it made (nothing
/// recomputed): given df = ∂L/∂f (n × M') and
/// dg = ∂L/∂logscale (n, or empty when the log-scale is not used, as for queries), dx = ∂L/∂x (n × d), ω held fixed.
/// The maxima each row's features are stabilized by (max ωᵀx, max |ωᵀx|) are held constant: they enter f as e^{−m}
/// and the log-scale as +m, so they cancel in e^{logscale}·f (and a query's drop out in the normalization).
///   positive:   f = e^{p − m}, logscale = m − ‖x_s‖²/2 − …  ⇒ ∂p = df∘f,               ∂x_s += −dg·x_s
///   hyperbolic: f = [e^{p − m}, e^{−p − m}], same log-scale ⇒ ∂p = df₁∘f₁ − df₂∘f₂, ∂x_s += −dg·x_s
///   trig:       f = [sin p, cos p], logscale = ‖x_s‖²/2 − … ⇒ ∂p = df₁∘cos p − df₂∘sin p, ∂x_s += dg·x_s
/// with p = x_s ωᵀ, x_s = scale·x: ∂x_s += ∂p·ω and dx = scale·∂x_s (Choromanski et al. 2021 Lemma 1, eq. (7)).
/// dx is written in place (x's shape) and dp (n × M, ∂L/∂(x_s ωᵀ)) is scratch that keeps its storage across calls.
template <typename T>
void performer_features_backward_given(const ConstRef<T>& x, T scale, const ConstRef<T>& omega, PerformerKernel kernel,
                                       const ConstRef<T>& f, const ConstRef<T>& df,
                                       const Eigen::Ref<const VectorX<T>>& dg, MutRef<T> dx, MatrixR<T>& dp);

extern template struct RandomFeatures<float>;
extern template struct RandomFeatures<double>;

}  // namespace attnlab
