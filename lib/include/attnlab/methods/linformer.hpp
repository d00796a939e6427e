// `linformer` — Linformer: softmax(Q(EK)ᵀ)·(FV) with k×n projections E, F (non-causal).
// Implements: Wang et al. 2020 (Linformer) eq. (7), Theorem 2.
// Typed use (the same method as make_method<double>("linformer:...") from a spec string):
//   attnlab::LinformerOptions o;  o.k = 256;
//   attnlab::Linformer<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `linformer`, with the registry's defaults (a test checks that they agree).
struct LinformerOptions {
  static constexpr const char* kName = "linformer";
  Index k = 64;  ///< projected length k (≤ n_k) (integer in [1, 1048576])
  /// E, F: N(0, 1/k) entries, ±1/√k, mean pooling over k segments, or I (k = n) (one of gaussian|uniform|pool|identity)
  std::string projection = "gaussian";
  bool share_kv = false;  ///< E = F (key-value sharing) (true|false)
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  ATTNLAB_OPTIONS(LinformerOptions, k, projection, share_kv, seed)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Linformer)  // Linformer<T>: a Method<T> built from LinformerOptions

}  // namespace attnlab
