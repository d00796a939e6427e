// `sparse` — fixed sparse patterns: band + strided + global tokens + random keys.
// Implements: Child et al. 2019 (strided); Zaheer et al. 2020 (BigBird: window, global, random).
// Typed use (the same method as make_method<double>("sparse:...") from a spec string):
//   attnlab::SparseOptions o;  o.window = 16;
//   attnlab::Sparse<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `sparse`, with the registry's defaults (a test checks that they agree).
struct SparseOptions {
  static constexpr const char* kName = "sparse";
  Index window = 16;  ///< half-width of the band (−1: no band) (integer in [-1, 16777216])
  Index stride = 32;  ///< strided keys (c_i − j) mod S = 0 (0: none) (integer in [0, 16777216])
  Index globals = 2;  ///< number of global tokens (integer in [0, 16777216])
  Index random = 8;  ///< random keys per query (integer in [0, 16777216])
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  ATTNLAB_OPTIONS(SparseOptions, window, stride, globals, random, seed)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Sparse)  // Sparse<T>: a Method<T> built from SparseOptions

}  // namespace attnlab
