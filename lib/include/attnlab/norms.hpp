// Matrix-free norms of attention operators: the spectral norm by Lanczos on the Gram operator AᵀA
// (Spectra's SymEigsSolver), computed in float64 whatever the operator's type.
#pragma once

#include "attnlab/operator.hpp"

namespace attnlab {

struct SpectralNormResult {
  double value = 0;
  Index iterations = 0;
  bool converged = false;
};

/// ‖A‖₂ = sqrt(λ_max(AᵀA)). Dense SVD for small operators (min dimension ≤ 64), Lanczos otherwise.
template <typename T>
SpectralNormResult spectral_norm(const AttentionOperator<T>& a, double tol = 1e-10, Index max_iter = 1000);

}  // namespace attnlab
