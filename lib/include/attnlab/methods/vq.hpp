// `vq` — Transformer-VQ: keys quantized to a k-means codebook, exp(QCᵀ)(ΔᵀV); causal with assign=hard.
// Implements: Lingle 2023 (Transformer-VQ): K ≈ ΔC, exp(QCᵀ)(ΔᵀV); soft (GMM) assignment after Su 2023, blog 'Traces of Transformer-VQ in the Performer'.
// Typed use (the same method as make_method<double>("vq:...") from a spec string):
//   attnlab::VqOptions o;  o.codes = 64;
//   attnlab::Vq<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `vq`, with the registry's defaults (a test checks that they agree).
struct VqOptions {
  static constexpr const char* kName = "vq";
  Index codes = 64;  ///< codebook size c (integer in [1, 1048576])
  Index iters = 20;  ///< Lloyd iterations after k-means++ (integer in [0, 10000])
  std::string assign = "hard";  ///< nearest code, or GMM responsibilities at temperature T (one of hard|soft)
  double temperature = 1.0;  ///< T of the soft assignment (number in [1e-12, 1000000000000])
  std::string quantize = "keys";  ///< quantize K, or K and Q (mean-field form) (one of keys|both)
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  ATTNLAB_OPTIONS(VqOptions, codes, iters, assign, temperature, quantize, seed)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Vq)  // Vq<T>: a Method<T> built from VqOptions

}  // namespace attnlab
