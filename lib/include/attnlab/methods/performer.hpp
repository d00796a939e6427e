// `performer` — Performer / FAVOR+ random features estimating exp(s·qᵀk).
// Implements: Choromanski et al. 2021 (Performer) Lemma 1, eq. (7) (positive, trigonometric and hyperbolic feature
// maps, attnlab/components/random_features.hpp) with orthogonal random features, Lemma 2 for the variances;
// normalized, and causal by prefix sums (Katharopoulos et al. 2020 eqs. (9)–(10)), chunked or recurrent
// (CausalFormOptions).
// Backward: ω held fixed (random parameters are not differentiated); otherwise exact: the VJP through the normalized
// attention (KernelMethod) and through the feature maps with the scale s^½ folded in as the forward does
// (performer_features_backward_given, on the features already made); the stabilizing maxima cancel in the normalized
// output and are held constant.
//   attnlab::PerformerOptions o;  o.features = 256;  o.kernel = attnlab::PerformerKernel::Positive;
//   attnlab::PerformerMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "performer:features=256" builds the same class (make_method reads the spec into PerformerOptions).
#pragma once

#include "attnlab/components/random_features.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/kernel_method.hpp"

#include <cstdint>
#include <vector>

namespace attnlab {

/// Row norms of Performer's orthogonal projections: χ(d) draws (unbiased) or all √d.
enum class PerformerNorms { Chi, SqrtD };

struct PerformerOptions : MethodOptions<PerformerOptions>, CausalFormOptions {
  static constexpr const char* kName = "performer";
  Index features = 256;
  PerformerKernel kernel = PerformerKernel::Positive;
  bool orthogonal = true;
  PerformerNorms norms = PerformerNorms::Chi;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("features", &PerformerOptions::features, 1, 1 << 16,
              "number of random projections M (trig/hyperbolic use 2M features)")
        .budget(Study("performer", {16, 32, 64, 128, 256}).simplicity(1).listed(6));  // M may exceed n
    p.choice("kernel", &PerformerOptions::kernel,
             {{PerformerKernel::Positive, "positive"}, {PerformerKernel::Trig, "trig"},
              {PerformerKernel::Hyperbolic, "hyperbolic"}},
             "feature map");
    p.boolean("orthogonal", &PerformerOptions::orthogonal, "orthogonal random features (blocks of d) instead of iid");
    p.choice("norms", &PerformerOptions::norms, {{PerformerNorms::Chi, "chi"}, {PerformerNorms::SqrtD, "sqrt_d"}},
             "row norms of orthogonal features: χ(d) (unbiased) or √d");
    p.seed(&PerformerOptions::seed);
    CausalFormOptions::parameters(p);
  }
  /// The method's entry in the registry (lib/src/methods/performer.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class PerformerMethod final : public ConfiguredMethod<PerformerOptions, KernelMethod<T>> {
 public:
  using ConfiguredMethod<PerformerOptions, KernelMethod<T>>::ConfiguredMethod;
  /// The projections ω (M × d) of the last compute() (analysis/rounding_bound.hpp's Performer bound takes them).
  const MatrixR<T>& omega() const {
    require(omega_d_ >= 0, "performer: omega() before compute()");
    return omega_;
  }

 private:
  void prepare(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  void check_params_storage(Storage storage, Policy policy) const override;
  void block_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, MatrixR<T>& f,
                      VectorX<T>& g) const override;
  void block_features_backward(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, const ConstRef<T>& f,
                               const ConstRef<T>& df, const ConstVecRef<T>& dg, MutRef<T> dx) const override;
  bool nonnegative() const override { return this->o_.kernel != PerformerKernel::Trig; }
  Index feature_count(Index) const override {
    return this->o_.kernel == PerformerKernel::Positive ? this->o_.features : 2 * this->o_.features;
  }

  /// Under a reduced storage with the eager policy: the features as the reference code forms them, every step stored
  /// in the format (performer.cpp).
  void eager_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, MatrixR<T>& f) const;
  /// Its backward as autograd runs it on that transcription, every gradient tensor stored in the format.
  void eager_features_backward(const ConstRef<T>& x, const AttentionOptions& opts, const ConstRef<T>& f,
                               const ConstRef<T>& df, MutRef<T> dx) const;

  Index omega_d_ = -1;  // the dimension ω was drawn for
  MatrixR<T> omega_;
  /// Eager reduced storage: ω as stored in the format, and the keys' largest projection (the reference code's one
  /// stabiliser for every key), from prepare().
  MatrixR<T> omega_stored_;
  T key_max_ = 0;
  /// Per-thread scratch of block_features (scaled rows, projections, log-scales) and of block_features_backward
  /// (∂L/∂(x_s ωᵀ)), reused by every call.
  struct Scratch {
    RandomFeatures<T> r;
    MatrixR<T> xs, proj, dp;
  };
  mutable std::vector<Scratch> scratch_;
};

extern template class PerformerMethod<float>;
extern template class PerformerMethod<double>;

}  // namespace attnlab
