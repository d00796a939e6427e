// Spectral norm, matrix-free: the top singular value by the block Krylov solver, in float64. (Spectra's Lanczos on
// the Gram operator, used before, fails outright on clustered tops — "did not converge" on a sharp trained head's
// P − P_R, whose top values agree to 5e-7 — where the block solver still returns the value with its residual.)
#include "attnlab/analysis/norms.hpp"

#include "attnlab/components/block_krylov.hpp"
#include "attnlab/components/dense_svd.hpp"

#include <algorithm>

namespace attnlab {
template <typename T>
SpectralNormResult spectral_norm(const AttentionOperator<T>& a, double tol, Index max_iter) {
  SpectralNormResult r;
  const Index small = std::min(a.rows(), a.cols());
  if (small <= 64) {
    Eigen::MatrixXd dense = materialize(a).template cast<double>();
    const Eigen::VectorXd s = jacobi_svd(dense).values;
    r.value = s.size() ? s(0) : 0.0;
    r.converged = true;
    return r;
  }
  BlockKrylovOptions o;
  o.tol = tol;
  o.max_passes = 2 * std::max<Index>(1, max_iter);
  BlockKrylovSvd<T> solver(o);
  solver.compute(a, 1);
  r.value = solver.singularValues()(0);
  r.iterations = solver.iterations();
  r.converged = solver.info() == Status::Success;
  r.residual = solver.residuals()(0);
  return r;
}

template SpectralNormResult spectral_norm<float>(const AttentionOperator<float>&, double, Index);
template SpectralNormResult spectral_norm<double>(const AttentionOperator<double>&, double, Index);

}  // namespace attnlab
