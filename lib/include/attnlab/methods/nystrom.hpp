// `nystrom` — Nyströmformer: softmax(QK̃ᵀ)·pinv(softmax(Q̃K̃ᵀ))·softmax(Q̃Kᵀ) with m landmarks (non-causal).
// Implements: Xiong et al. 2021 (Nyströmformer) eq. (14), landmarks by segment means; the order-3 pseudo-inverse iteration of Razavi et al. 2014.
// Typed use (the same method as make_method<double>("nystrom:...") from a spec string):
//   attnlab::NystromOptions o;  o.landmarks = 64;
//   attnlab::Nystrom<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `nystrom`, with the registry's defaults (a test checks that they agree).
struct NystromOptions {
  static constexpr const char* kName = "nystrom";
  Index landmarks = 64;  ///< number of landmarks m (≤ n) (integer in [1, 1048576])
  /// pseudo-inverse: order-3 iteration (Razavi et al. 2014), Newton–Schulz, or SVD (one of iterative|newton|svd)
  std::string pinv = "iterative";
  Index iters = 6;  ///< iterations of the iterative pseudo-inverses (the paper uses 6) (integer in [0, 10000])
  std::string select = "segments";  ///< landmarks: segment means, or uniformly sampled rows (one of segments|random)
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  ATTNLAB_OPTIONS(NystromOptions, landmarks, pinv, iters, select, seed)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Nystrom)  // Nystrom<T>: a Method<T> built from NystromOptions

}  // namespace attnlab
