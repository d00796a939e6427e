// Dense singular-value decompositions in float64 behind plain functions: Eigen's divide-and-conquer BDCSVD and its
// one-sided JacobiSVD. Their templates are compiled once, in lib/src/components/dense_svd.cpp, rather than in every
// file that needs an SVD (pseudo-inverses, spectra, block Krylov, spectral norms): each instantiation costs ~20 s
// of build time in every translation unit that makes it.
#pragma once

#include <Eigen/Core>

namespace attnlab {

/// A = U·diag(values)·Vᵀ, values in decreasing order; U and V hold what the options asked for (empty otherwise).
struct DenseSvd {
  Eigen::VectorXd values;
  Eigen::MatrixXd u, v;
};

/// Eigen::BDCSVD of `a`; `options`: Eigen::ComputeThinU / ComputeFullU | ComputeThinV / ComputeFullV, or 0 (values
/// only). Eigen 3.4's BDCSVD can return zero columns of V for exactly zero singular values (block_krylov.cpp checks).
DenseSvd bdc_svd(const Eigen::MatrixXd& a, unsigned options = 0);

/// Eigen::JacobiSVD of `a` (column-pivoting QR preconditioner): slower, always orthogonal factors.
DenseSvd jacobi_svd(const Eigen::MatrixXd& a, unsigned options = 0);

}  // namespace attnlab
