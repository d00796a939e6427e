// `performer` — Performer / FAVOR+ random features estimating exp(s·qᵀk).
// Implements: Choromanski et al. 2021 (Performer) Lemma 1, eq. (7); Lemma 2 for the variances.
// Typed use (the same method as make_method<double>("performer:...") from a spec string):
//   attnlab::PerformerOptions o;  o.features = 256;
//   attnlab::Performer<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `performer`, with the registry's defaults (a test checks that they agree).
struct PerformerOptions {
  static constexpr const char* kName = "performer";
  Index features = 256;  ///< number of random projections M (trig/hyperbolic use 2M features) (integer in [1, 65536])
  std::string kernel = "positive";  ///< feature map (one of positive|trig|hyperbolic)
  bool orthogonal = true;  ///< orthogonal random features (blocks of d) instead of iid (true|false)
  std::string norms = "chi";  ///< row norms of orthogonal features: χ(d) (unbiased) or √d (one of chi|sqrt_d)
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])
  /// causal prefix sums: blocks of matrix products, or the RNN form one position at a time (one of chunked|recurrent)
  std::string causal_form = "chunked";
  Index chunk = 64;  ///< block size of the chunked causal form (integer in [1, 65536])

  // from(params), spec(), descriptor()
  ATTNLAB_OPTIONS(PerformerOptions, features, kernel, orthogonal, norms, seed, causal_form, chunk)
};

ATTNLAB_TYPED_METHOD(Performer)  // Performer<T>: a Method<T> built from PerformerOptions

}  // namespace attnlab
