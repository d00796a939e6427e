// `efficient` — efficient attention softmax₂(Q)·softmax₁(K)ᵀ·V (non-causal).
// Implements: seed 003 eq. (5); Shen et al. 2021.
// Typed use (the same method as make_method<double>("efficient:...") from a spec string):
//   attnlab::Efficient<double> m;  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `efficient`, with the registry's defaults (a test checks that they agree).
struct EfficientOptions {
  static constexpr const char* kName = "efficient";


  /// The options held by validated parameters (what the spec parser produces).
  static EfficientOptions from(const Params& p);
  /// This struct as a spec string, every parameter written out: "efficient:key=value,...".
  std::string spec() const;
};

template <typename T>
using Efficient = TypedMethod<T, EfficientOptions>;

extern template class TypedMethod<float, EfficientOptions>;
extern template class TypedMethod<double, EfficientOptions>;

}  // namespace attnlab
