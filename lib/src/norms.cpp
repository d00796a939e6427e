// Spectral norm, matrix-free: the largest eigenvalue of the Gram operator AᵀA (or AAᵀ, the smaller side) by
// Spectra's Lanczos solver (SymEigsSolver), in float64.
#include "attnlab/norms.hpp"

#include "attnlab/error.hpp"

#include <Eigen/SVD>
#include <Spectra/SymEigsSolver.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace attnlab {
namespace {

/// x ↦ Aᵀ(A x) (or A(Aᵀ x) when A is wide), in double; the Spectra operator contract.
template <typename T>
class GramOp {
 public:
  using Scalar = double;
  explicit GramOp(const AttentionOperator<T>& a) : a_(a), wide_(a.cols() > a.rows()) {}
  Index rows() const { return wide_ ? a_.rows() : a_.cols(); }
  Index cols() const { return rows(); }
  void perform_op(const double* x_in, double* y_out) const {
    MatrixR<T> x = Eigen::Map<const VectorX<double>>(x_in, rows()).template cast<T>();
    MatrixR<T> y = wide_ ? a_.apply(a_.apply_transpose(x)) : a_.apply_transpose(a_.apply(x));
    Eigen::Map<VectorX<double>>(y_out, rows()) = y.col(0).template cast<double>();
  }

 private:
  const AttentionOperator<T>& a_;
  bool wide_;
};

}  // namespace

template <typename T>
SpectralNormResult spectral_norm(const AttentionOperator<T>& a, double tol, Index max_iter) {
  SpectralNormResult r;
  const Index small = std::min(a.rows(), a.cols());
  if (small <= 64) {
    Eigen::MatrixXd dense = materialize(a).template cast<double>();
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(dense);
    r.value = svd.singularValues().size() ? svd.singularValues()(0) : 0.0;
    r.converged = true;
    return r;
  }
  // A float32 operator's Gram products carry ~1e-7 relative noise: ask no more of the Ritz values than that.
  if (std::is_same_v<T, float>) tol = std::max(tol, 1e-6);
  GramOp<T> op(a);
  const Index ncv = std::min<Index>(op.rows(), 20);
  Spectra::SymEigsSolver<GramOp<T>> eigs(op, 1, ncv);
  eigs.init();  // Spectra's fixed-seed start vector: the result is reproducible
  eigs.compute(Spectra::SortRule::LargestAlge, max_iter, tol);
  r.iterations = eigs.num_iterations();
  r.converged = eigs.info() == Spectra::CompInfo::Successful;
  if (!r.converged) throw Error("spectral norm: the Lanczos iteration did not converge");
  r.value = std::sqrt(std::max(0.0, eigs.eigenvalues()(0)));
  return r;
}

template SpectralNormResult spectral_norm<float>(const AttentionOperator<float>&, double, Index);
template SpectralNormResult spectral_norm<double>(const AttentionOperator<double>&, double, Index);

}  // namespace attnlab
