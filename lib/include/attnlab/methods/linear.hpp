// `linear` — linear attention with a feature map: O_i = φ(q_i)ᵀΣ_j φ(k_j)v_jᵀ / φ(q_i)ᵀΣ_j φ(k_j).
// Implements: Katharopoulos et al. 2020 (Transformers are RNNs) §3.2, φ(x) = elu(x) + 1 (or relu) on raw q and k;
// causal masking by prefix sums, §3.3 (eqs. (9)–(10)), chunked or recurrent (CausalFormOptions).
// Backward: exact (nothing random or discrete; relu'(0) taken as 0), the VJP through the normalized attention
// (KernelMethod) then through φ: (elu + 1)'(x) = 1 for x > 0, e^x for x ≤ 0; relu'(x) = [x > 0].
//   attnlab::LinearOptions o;  o.feature = attnlab::LinearFeature::Elu;
//   attnlab::LinearMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "linear:feature=elu" builds the same class (make_method reads the spec into LinearOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/kernel_method.hpp"

namespace attnlab {

/// Linear attention's feature map φ: elu(x) + 1 or relu(x).
enum class LinearFeature { Elu, Relu };

struct LinearOptions : MethodOptions<LinearOptions>, CausalFormOptions {
  static constexpr const char* kName = "linear";
  LinearFeature feature = LinearFeature::Elu;

  template <class P>
  static void parameters(P& p) {
    p.choice("feature", &LinearOptions::feature, {{LinearFeature::Elu, "elu"}, {LinearFeature::Relu, "relu"}},
             "feature map φ on raw q and k: elu(x)+1 or relu(x)");
    CausalFormOptions::parameters(p);
  }
  /// The method's entry in the registry (lib/src/methods/linear.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class LinearMethod final : public ConfiguredMethod<LinearOptions, KernelMethod<T>> {
 public:
  using ConfiguredMethod<LinearOptions, KernelMethod<T>>::ConfiguredMethod;

 private:
  void block_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, MatrixR<T>& f,
                      VectorX<T>& g) const override;
  void block_features_backward(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, const ConstRef<T>& f,
                               const ConstRef<T>& df, const ConstVecRef<T>& dg, MutRef<T> dx) const override;
  /// relu rows can vanish: then P̃'s row is zero.
  bool nonnegative() const override { return this->o_.feature != LinearFeature::Relu; }
  Index feature_count(Index d) const override { return d; }
};

extern template class LinearMethod<float>;
extern template class LinearMethod<double>;

}  // namespace attnlab
