// `cur` — classical Nyström / CUR of the exact P: P[:,J]·pinv(P[I,J])·P[I,:] (non-causal).
// Implements: Drineas, Mahoney & Muthukrishnan 2008 (CUR, leverage-score sampling); the Nyström form of Xiong et al. 2021.
// Typed use (the same method as make_method<double>("cur:...") from a spec string):
//   attnlab::CurOptions o;  o.columns = 64;
//   attnlab::Cur<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `cur`, with the registry's defaults (a test checks that they agree).
struct CurOptions {
  static constexpr const char* kName = "cur";
  Index columns = 64;  ///< number of sampled columns (and rows) C (integer in [1, 1048576])
  std::string select = "uniform";  ///< sampling of J (and I) (one of uniform|leverage)
  double rcond = 1e-10;  ///< relative singular-value cutoff of pinv(P[I,J]) (0: eps·C) (number in [0, 1])
  std::uint64_t seed = 0;  ///< random seed (integer in [0, 9223372036854775807])

  ATTNLAB_OPTIONS(CurOptions, columns, select, rcond, seed)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Cur)  // Cur<T>: a Method<T> built from CurOptions

}  // namespace attnlab
