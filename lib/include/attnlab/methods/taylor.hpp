// `taylor` — first-order Taylor attention, sim = 1 + cos(q, k).
// Implements: seed 003 eqs. (6)-(7).
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

  /// The options held by validated parameters (what the spec parser produces).
  static TaylorOptions from(const Params& p);
  /// This struct as a spec string, every parameter written out: "taylor:key=value,...".
  std::string spec() const;
};

template <typename T>
using Taylor = TypedMethod<T, TaylorOptions>;

extern template class TypedMethod<float, TaylorOptions>;
extern template class TypedMethod<double, TaylorOptions>;

}  // namespace attnlab
