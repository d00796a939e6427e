// `scatterbrain` — Scatterbrain: Performer low-rank estimate + exact entries on a band, normalized (non-causal).
// Implements: Chen et al. 2021 (Scatterbrain) §3, Algorithm 1.
// Typed use (the same method as make_method<double>("scatterbrain:...") from a spec string):
//   attnlab::ScatterbrainOptions o;  o.features = 64;
//   attnlab::Scatterbrain<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `scatterbrain`, with the registry's defaults (a test checks that they agree).
struct ScatterbrainOptions {
  static constexpr const char* kName = "scatterbrain";
  Index features = 64;  ///< Performer features M (positive, orthogonal) (integer in [1, 65536])
  Index window = 16;  ///< half-width of the band where entries are exact (integer in [0, 16777216])
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  ATTNLAB_OPTIONS(ScatterbrainOptions, features, window, seed)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Scatterbrain)  // Scatterbrain<T>: a Method<T> built from ScatterbrainOptions

}  // namespace attnlab
