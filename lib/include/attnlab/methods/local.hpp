// `local` — sliding-window attention, |j − i| ≤ W.
// Implements: Beltagy et al. 2020 (Longformer) §3.1, sliding window.
// Typed use (the same method as make_method<double>("local:...") from a spec string):
//   attnlab::LocalOptions o;  o.window = 64;
//   attnlab::Local<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `local`, with the registry's defaults (a test checks that they agree).
struct LocalOptions {
  static constexpr const char* kName = "local";
  Index window = 64;  ///< half-width W of the band (integer in [0, 16777216])

  ATTNLAB_OPTIONS(LocalOptions, window)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Local)  // Local<T>: a Method<T> built from LocalOptions

}  // namespace attnlab
