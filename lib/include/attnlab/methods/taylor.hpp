// `taylor` — first-order Taylor attention, sim(q, k) = 1 + cos(q, k) = φ(q)ᵀφ(k) with φ(x) = [1, x/‖x‖]: the
// first-order Taylor expansion of exp(cos(q, k)) (as in the linear-attention literature; no single paper), always
// ≥ 0. Normalized and causal as linear attention (Katharopoulos et al. 2020 eq. (2); prefix sums §3.3, eqs.
// (9)–(10)), chunked or recurrent (CausalFormOptions).
// Backward: exact (nothing random or discrete), through the normalization: ∂(x/‖x‖) = (I − uuᵀ)/‖x‖, u = x/‖x‖ (a
// zero row, which has no direction, gets 0).
//   attnlab::TaylorOptions o;  o.causal_form = attnlab::CausalForm::Chunked;
//   attnlab::TaylorMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "taylor:causal_form=chunked" builds the same class (make_method reads the spec into TaylorOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/kernel_method.hpp"

namespace attnlab {

struct TaylorOptions : MethodOptions<TaylorOptions>, CausalFormOptions {
  static constexpr const char* kName = "taylor";

  template <class P>
  static void parameters(P& p) {
    CausalFormOptions::parameters(p);
  }
  /// The method's entry in the registry (lib/src/methods/taylor.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class TaylorMethod final : public ConfiguredMethod<TaylorOptions, KernelMethod<T>> {
 public:
  using ConfiguredMethod<TaylorOptions, KernelMethod<T>>::ConfiguredMethod;

 private:
  void block_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, MatrixR<T>& f,
                      VectorX<T>& g) const override;
  void block_features_backward(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, const ConstRef<T>& f,
                               const ConstRef<T>& df, const ConstVecRef<T>& dg, MutRef<T> dx) const override;
  Index feature_count(Index d) const override { return d + 1; }
};

extern template class TaylorMethod<float>;
extern template class TaylorMethod<double>;

}  // namespace attnlab
