// `efficient` — efficient attention softmax₂(Q)·softmax₁(K)ᵀ·V (non-causal).
// Implements: Shen et al. 2021 (Efficient Attention: Attention with Linear Complexities).
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


  ATTNLAB_OPTIONS_NONE(EfficientOptions)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Efficient)  // Efficient<T>: a Method<T> built from EfficientOptions

}  // namespace attnlab
