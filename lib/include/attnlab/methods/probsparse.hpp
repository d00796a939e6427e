// `probsparse` — Informer ProbSparse: exact rows for the top-u queries by sparsity measure, mean(V) for the rest.
// Implements: Zhou et al. 2021 (Informer) eqs. (2)-(4), Lemma 1.
// Typed use (the same method as make_method<double>("probsparse:...") from a spec string):
//   attnlab::ProbsparseOptions o;  o.factor = 5;
//   attnlab::Probsparse<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `probsparse`, with the registry's defaults (a test checks that they agree).
struct ProbsparseOptions {
  static constexpr const char* kName = "probsparse";
  /// sampling factor c: u = c·⌈ln n_q⌉ queries, U = c·⌈ln n_k⌉ keys (number in [0.001, 1000000000])
  double factor = 5.0;
  Index samples = 0;  ///< keys sampled per query for M̄ (0: c·⌈ln n_k⌉) (integer in [0, 1073741824])
  std::string sample = "random";  ///< M̄ on sampled keys (with replacement) or on all keys (one of random|full)
  std::string measure = "maxmean";  ///< M̄ = max − mean (the paper's estimate) or M = LSE − mean (one of maxmean|lse)
  /// causal lazy rows: mean of visible V, or the reference's unnormalized cumulative sum (one of mean|cumsum)
  std::string lazy = "mean";
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  // from(params), spec(), descriptor()
  ATTNLAB_OPTIONS(ProbsparseOptions, factor, samples, sample, measure, lazy, seed)
};

ATTNLAB_TYPED_METHOD(Probsparse)  // Probsparse<T>: a Method<T> built from ProbsparseOptions

}  // namespace attnlab
