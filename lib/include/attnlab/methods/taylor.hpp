// `taylor` — first-order Taylor attention, sim = 1 + cos(q, k).
// Implements: Su 2020, blog 'Exploring Linear Attention: Must Attention Have a Softmax?' (e^{qᵀk} ≈ 1 + qᵀk on normalized q, k).
// Typed use (the same method as make_method<double>("taylor:...") from a spec string):
//   attnlab::TaylorOptions o;  o.causal_form = "chunked";
//   attnlab::Taylor<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `taylor`, with the registry's defaults (a test checks that they agree).
struct TaylorOptions {
  static constexpr const char* kName = "taylor";
  /// causal prefix sums: blocks of matrix products, or the RNN form one position at a time (one of chunked|recurrent)
  std::string causal_form = "chunked";
  Index chunk = 64;  ///< block size of the chunked causal form (integer in [1, 65536])

  ATTNLAB_OPTIONS(TaylorOptions, causal_form, chunk)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Taylor)  // Taylor<T>: a Method<T> built from TaylorOptions

}  // namespace attnlab
