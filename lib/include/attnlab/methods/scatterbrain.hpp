// `scatterbrain` — sparse + low-rank attention (Chen et al. 2021, "Scatterbrain: Unifying Sparse and Low-rank
// Attention Approximation", §3 and Algorithm 1): the unnormalized attention exp(s·QKᵀ) is estimated by the Performer
// term φ(Q)φ(K)ᵀ (positive orthogonal random features, Choromanski et al. 2021) plus a sparse correction S that, on
// the band |j − c_i| ≤ W, replaces the estimate by the exact value:
//   Ã = φ(Q)φ(K)ᵀ + S,  S_ij = exp(s·q_iᵀk_j) − φ(q_i)ᵀφ(k_j) on the band, 0 elsewhere;  P̃ = diag(Ã·1)⁻¹·Ã.
// Non-causal: the Performer part mixes every position.
// Backward: ω held fixed (random parameters are not differentiated); otherwise exact: the VJP of the normalized
// P̃·V through Ã, the Performer features off the band (φ(x) = e^{ωᵀx − ‖x‖²/2}/√M of x = s^½q, y = s^½k) and the
// exact entries e^{xᵀy} on it; the per-row reference R_i and the features' maxima cancel and are held constant.
//   attnlab::ScatterbrainOptions o;  o.features = 64;  o.window = 16;
//   attnlab::ScatterbrainMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "scatterbrain:features=64,window=16" builds the same class (make_method reads the spec into
// ScatterbrainOptions).
#pragma once

#include "attnlab/components/random_features.hpp"
#include "attnlab/core/method.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/operators/sparse_low_rank.hpp"

#include <cmath>
#include <cstdint>
#include <optional>

namespace attnlab {

struct ScatterbrainOptions : MethodOptions<ScatterbrainOptions> {
  static constexpr const char* kName = "scatterbrain";
  Index features = 64;
  Index window = 16;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("features", &ScatterbrainOptions::features, 1, 1 << 16, "Performer features M (positive, orthogonal)");
    p.integer("window", &ScatterbrainOptions::window, 0, 1 << 24, "half-width of the band where entries are exact")
        .budget(Study("scatterbrain", {4, 8, 16, 32, 64}).with("features=64").simplicity(9).listed(11));
    p.seed(&ScatterbrainOptions::seed);
  }
  /// The method's entry in the registry (lib/src/methods/scatterbrain.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class ScatterbrainMethod final : public ConfiguredMethod<ScatterbrainOptions, Method<T>> {
 public:
  using ConfiguredMethod<ScatterbrainOptions, Method<T>>::ConfiguredMethod;
  Index rank_bound() const override { return -1; }  // rank-M plus a sparse part: not rank-limited
  /// The Performer projections ω (M × d) of the last compute() (the rounding bound takes both runs').
  const MatrixR<T>& omega() const { return omega_; }

 private:
  /// The O(n·M) parts: features, each row's reference log-scale R_i and row sum of Ã in units of e^{R_i}. The
  /// band's correction is formed by output() in dense blocks, and as a sparse matrix only when P̃ is asked for.
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  /// O = D⁻¹(A·(Btᵀ·V) + S·V), the band part S·V by blocks: never the sparse matrix.
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  const AttentionOperator<T>& do_op() const override;
  /// dA = W̃Ṽᵀ (W̃_i = [dO_i, −dO_iᵀO_i]/den_i, Ṽ_j = [v_j, 1]): the Performer part by its global sums less the band,
  /// the band's exact entries by blocks (queries, then keys): O(n·(M + W)·d), no n × n matrix.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;

  /// e^{lq_i + gk − R_i}: the Performer estimates of row i in units of e^{R_i}.
  T est_scale(Index i) const { return std::exp(fq_.logscale(i) + gk_ - ref_(i)); }
  /// For each block of 64 queries, the band's correction block (lib/src/methods/scatterbrain.cpp).
  template <typename F>
  void band_blocks(F&& f, VectorX<T>* set_ref, bool serial = false, const Rounding* with = nullptr) const;
  /// do_output's O under the rounding `rd` (the hook's, or untallied when the backward forms O again).
  MatrixR<T> output_with(const ConstRef<T>& v, const Rounding& rd) const;
  /// The band's geometry, shared by the forward and the backward: block b's queries [i0, i0 + bi) (kBandBlock of
  /// them) and the keys [lo, lo + bj) their bands span (bj ≤ 0: none); row i's own band [first, last] in those
  /// columns, relative to lo (empty when last < first).
  static constexpr Index kBandBlock = 64;
  struct BandBlock {
    Index i0, bi, lo, bj;
  };
  BandBlock band_block(Index b) const;
  std::pair<Index, Index> band_of(Index i, Index lo) const;

  MatrixR<T> omega_;  // M × d: the Performer projections (held fixed by the backward)
  MatrixR<T> xq_, xk_, kscaled_;
  RandomFeatures<T> fq_;
  VectorX<T> ref_, den_;
  T gk_ = 0;
  Index w_ = 0, off_ = 0;
  mutable std::optional<SparseLowRankOperator<T>> op_;
};

extern template class ScatterbrainMethod<float>;
extern template class ScatterbrainMethod<double>;

}  // namespace attnlab
