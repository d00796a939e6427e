// `efficient` — efficient attention P̃ = softmax₂(Q)·softmax₁(K)ᵀ, O = softmax₂(Q)·(softmax₁(K)ᵀ·V): the softmax
// over the features of each query, over the positions of each key feature (non-causal: the softmax over positions
// mixes the future in).
// Implements: Shen et al. 2021 (Efficient Attention: Attention with Linear Complexities), the softmax normalization
// of §3. It has no parameters.
//   attnlab::EfficientMethod<double> m;  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "efficient" builds the same class.
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/lowrank_method.hpp"

namespace attnlab {

struct EfficientOptions : MethodOptions<EfficientOptions> {
  static constexpr const char* kName = "efficient";

  template <class P>
  static void parameters(P&) {}
  /// The method's entry in the registry (lib/src/methods/efficient.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class EfficientMethod final : public ConfiguredMethod<EfficientOptions, LowRankMethod<T>> {
 public:
  using ConfiguredMethod<EfficientOptions, LowRankMethod<T>>::ConfiguredMethod;

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
};

extern template class EfficientMethod<float>;
extern template class EfficientMethod<double>;

}  // namespace attnlab
