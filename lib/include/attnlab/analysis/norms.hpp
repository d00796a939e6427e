// Matrix-free norms of attention operators: the spectral norm as the top singular value by the block Krylov solver
// (components/block_krylov.hpp), computed in float64 whatever the operator's type.
#pragma once

#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/core/operator.hpp"

namespace attnlab {

struct SpectralNormResult {
  double value = 0;
  Index iterations = 0;
  bool converged = false;
  /// ‖Aᵀu − σv‖ of the top triplet: a singular value of A lies within it of `value` (0 for the dense path).
  double residual = 0;
};

/// ‖A‖₂, the top singular value. Dense SVD for small operators (min dimension ≤ 64), block Krylov otherwise, to a
/// residual ≤ tol·‖A‖₂ within max_iter Rayleigh–Ritz steps. A top singular value inside a tight cluster (a sharp
/// trained head's P − P_R has dozens of values within 1e-6 of each other) can keep the residual of its vector above
/// tol long after the value has settled: then the result has converged = false and its residual says how far the
/// value can be from a singular value; it never throws for that.
template <typename T>
SpectralNormResult spectral_norm(const AttentionOperator<T>& a, double tol = 1e-10, Index max_iter = 100);

}  // namespace attnlab
