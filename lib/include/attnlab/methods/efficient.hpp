// `efficient` — efficient attention P̃ = softmax₂(Q)·softmax₁(K)ᵀ, O = softmax₂(Q)·(softmax₁(K)ᵀ·V): the softmax
// over the features of each query, over the positions of each key feature (non-causal: the softmax over positions
// mixes the future in).
// Implements: Shen et al. 2021 (Efficient Attention: Attention with Linear Complexities), the softmax normalization
// of §3. It has no parameters.
// Backward: exact, nothing held fixed: the VJPs of the two softmaxes (over the features of each query row, over the
// positions of each key column) through O = A·(Bᵀ·V), linear in n.
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

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  /// O = A·C, C = Bᵀ·V, A = softmax₂(Q), B = softmax₁(K): dA = dO·Cᵀ, dC = Aᵀ·dO, dB = V·dCᵀ, dV = B·dC, and the
  /// softmax VJPs dQ = A ∘ (dA − rowsum(A ∘ dA)), dK = B ∘ (dB − colsum(B ∘ dB)). O((n_q + n_k)·d·d_v).
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;
};

extern template class EfficientMethod<float>;
extern template class EfficientMethod<double>;

}  // namespace attnlab
