// `svd` — best rank-R approximation of the exact P (Eckart–Young floor; non-causal).
// Implements: Eckart & Young 1936; P_R = U_RΣ_RV_Rᵀ.
// Typed use (the same method as make_method<double>("svd:...") from a spec string):
//   attnlab::SvdOptions o;  o.rank = 64;
//   attnlab::Svd<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
#pragma once

#include "attnlab/methods/typed.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// The options of `svd`, with the registry's defaults (a test checks that they agree).
struct SvdOptions {
  static constexpr const char* kName = "svd";
  Index rank = 64;  ///< rank R (integer in [1, 1048576])
  /// n_k up to which a dense SVD is used; above, the matrix-free solver (integer in [1, 1048576])
  Index dense_limit = 512;
  /// top-R solver: auto (dense up to dense_limit, else block Krylov), block, lanczos (Spectra on PᵀP), dense (one of
  /// auto|block|lanczos|dense)
  std::string solver = "auto";

  ATTNLAB_OPTIONS(SvdOptions, rank, dense_limit, solver)  // from(params), spec(), descriptor()
};

ATTNLAB_TYPED_METHOD(Svd)  // Svd<T>: a Method<T> built from SvdOptions

}  // namespace attnlab
