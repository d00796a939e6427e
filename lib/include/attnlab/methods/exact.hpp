// `exact` — softmax attention, streaming (online softmax) or materialized.
// Implements: P = softmax(s·QKᵀ + M), O = P·V (Vaswani et al. 2017, eq. 1); online softmax (Milakov & Gimelshein 2018).
// Typed use (the same method as make_method<double>("exact:...") from a spec string):
//   attnlab::ExactOptions o;  o.impl = "streaming";
//   attnlab::Exact<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `exact`, with the registry's defaults (a test checks that they agree).
struct ExactOptions {
  static constexpr const char* kName = "exact";
  /// output path: tiled online softmax (O(n·d) memory) or the full matrix P (one of streaming|materialized)
  std::string impl = "streaming";
  Index tile = 256;  ///< tile edge of the streaming kernels (integer in [8, 8192])

  ATTNLAB_OPTIONS(ExactOptions, impl, tile)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Exact)  // Exact<T>: a Method<T> built from ExactOptions

}  // namespace attnlab
