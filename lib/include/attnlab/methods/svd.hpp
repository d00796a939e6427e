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

  /// The options held by validated parameters (what the spec parser produces).
  static SvdOptions from(const Params& p);
  /// This struct as a spec string, every parameter written out: "svd:key=value,...".
  std::string spec() const;
};

template <typename T>
using Svd = TypedMethod<T, SvdOptions>;

extern template class TypedMethod<float, SvdOptions>;
extern template class TypedMethod<double, SvdOptions>;

}  // namespace attnlab
