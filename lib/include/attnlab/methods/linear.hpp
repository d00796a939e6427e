// `linear` — linear attention with a feature map, φ(q)ᵀΣφ(k)vᵀ / φ(q)ᵀΣφ(k).
// Implements: Katharopoulos et al. 2020 (Transformers are RNNs) §3.2, φ(x) = elu(x) + 1; causal masking §3.3 (prefix sums).
// Typed use (the same method as make_method<double>("linear:...") from a spec string):
//   attnlab::LinearOptions o;  o.feature = "elu";
//   attnlab::Linear<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `linear`, with the registry's defaults (a test checks that they agree).
struct LinearOptions {
  static constexpr const char* kName = "linear";
  std::string feature = "elu";  ///< feature map φ on raw q and k: elu(x)+1 or relu(x) (one of elu|relu)
  /// causal prefix sums: blocks of matrix products, or the RNN form one position at a time (one of chunked|recurrent)
  std::string causal_form = "chunked";
  Index chunk = 64;  ///< block size of the chunked causal form (integer in [1, 65536])

  ATTNLAB_OPTIONS(LinearOptions, feature, causal_form, chunk)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Linear)  // Linear<T>: a Method<T> built from LinearOptions

}  // namespace attnlab
