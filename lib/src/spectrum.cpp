// Dense and matrix-free singular values.
#include "attnlab/spectrum.hpp"

#include "attnlab/error.hpp"

#include <Eigen/SVD>
#include <Spectra/SymEigsSolver.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace attnlab {
namespace {

/// x ↦ Aᵀ(A x) in double, the Spectra operator contract.
template <typename T>
class NormalOp {
 public:
  using Scalar = double;
  explicit NormalOp(const AttentionOperator<T>& a) : a_(a) {}
  Index rows() const { return a_.cols(); }
  Index cols() const { return a_.cols(); }
  void perform_op(const double* x_in, double* y_out) const {
    const MatrixR<T> x = Eigen::Map<const VectorX<double>>(x_in, rows()).template cast<T>();
    const MatrixR<T> y = a_.apply_transpose(a_.apply(x));
    Eigen::Map<VectorX<double>>(y_out, rows()) = y.col(0).template cast<double>();
  }

 private:
  const AttentionOperator<T>& a_;
};

}  // namespace

template <typename T>
VectorX<double> singular_values(const ConstRef<T>& a) {
  const Eigen::MatrixXd ad = a.template cast<double>();
  Eigen::BDCSVD<Eigen::MatrixXd> svd(ad);
  return svd.singularValues();
}

template <typename T>
TopSingular top_singular(const AttentionOperator<T>& a, Index k, Index dense_limit, double tol) {
  const Index n = a.cols();
  require(k >= 1 && k <= std::min(a.rows(), a.cols()),
          fmt::format("top_singular: k = {} is outside [1, {}]", k, std::min(a.rows(), a.cols())));
  TopSingular out;
  if (n <= dense_limit || k > n / 2) {
    const Eigen::MatrixXd dense = materialize(a).template cast<double>();
    Eigen::BDCSVD<Eigen::MatrixXd> svd(dense, Eigen::ComputeThinV);
    out.values = svd.singularValues().head(k);
    out.right = svd.matrixV().leftCols(k);
    return out;
  }
  NormalOp<T> op(a);
  const Index ncv = std::min<Index>(n, std::max<Index>(2 * k + 1, 20));
  Spectra::SymEigsSolver<NormalOp<T>> eigs(op, k, ncv);
  eigs.init();
  eigs.compute(Spectra::SortRule::LargestAlge, 1000, std::is_same_v<T, float> ? std::max(tol, 1e-6) : tol);
  if (eigs.info() != Spectra::CompInfo::Successful)
    throw Error(fmt::format("top_singular: Lanczos did not converge for k = {} of n = {}", k, n));
  out.iterations = eigs.num_iterations();
  out.values = eigs.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  out.right = eigs.eigenvectors();
  return out;
}

template VectorX<double> singular_values<float>(const ConstRef<float>&);
template VectorX<double> singular_values<double>(const ConstRef<double>&);
template TopSingular top_singular<float>(const AttentionOperator<float>&, Index, Index, double);
template TopSingular top_singular<double>(const AttentionOperator<double>&, Index, Index, double);

}  // namespace attnlab
