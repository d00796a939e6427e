// `reformer` — Reformer LSH attention: angular hashing, sorted chunks, multi-round union.
// Implements: Kitaev et al. 2020 (Reformer) §2: angular LSH, sorted chunks, multi-round.
// Typed use (the same method as make_method<double>("reformer:...") from a spec string):
//   attnlab::ReformerOptions o;  o.buckets = 8;
//   attnlab::Reformer<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `reformer`, with the registry's defaults (a test checks that they agree).
struct ReformerOptions {
  static constexpr const char* kName = "reformer";
  Index buckets = 8;  ///< number of hash buckets (1 or even) (integer in [1, 65536])
  Index rounds = 2;  ///< hashing rounds (integer in [1, 64])
  Index chunk = 64;  ///< keys per chunk (each query sees its chunk and the previous) (integer in [1, 16777216])
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  ATTNLAB_OPTIONS(ReformerOptions, buckets, rounds, chunk, seed)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Reformer)  // Reformer<T>: a Method<T> built from ReformerOptions

}  // namespace attnlab
