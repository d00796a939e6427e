// Dense and matrix-free singular values.
#include "attnlab/components/spectrum.hpp"

#include "attnlab/components/dense_svd.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/components/block_krylov.hpp"

#include <Spectra/SymEigsSolver.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace attnlab {
namespace {

/// x ↦ Aᵀ(A x) in double, the Spectra operator contract; counts its products.
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
    calls_ += 1;
  }
  Index calls() const { return calls_; }

 private:
  const AttentionOperator<T>& a_;
  mutable Index calls_ = 0;
};

template <typename T>
TopSingular dense_top(const AttentionOperator<T>& a, Index k) {
  TopSingular out;
  const Eigen::MatrixXd dense = materialize(a).template cast<double>();
  const DenseSvd svd = bdc_svd(dense, Eigen::ComputeThinV);
  out.values = svd.values.head(k);
  out.right = svd.v.leftCols(k);
  out.residuals = VectorX<double>::Zero(k);
  out.solver = SpectrumSolver::Dense;
  return out;
}

template <typename T>
TopSingular lanczos_top(const AttentionOperator<T>& a, Index k, const TopSingularOptions& o) {
  const Index n = a.cols();
  NormalOp<T> op(a);
  const Index ncv = std::min<Index>(n, std::max<Index>(2 * k + 1, 20));
  Spectra::SymEigsSolver<NormalOp<T>> eigs(op, k, ncv);
  eigs.init();
  eigs.compute(Spectra::SortRule::LargestAlge, 1000, std::is_same_v<T, float> ? std::max(o.tol, 1e-6) : o.tol);
  if (eigs.info() != Spectra::CompInfo::Successful)
    throw Error(fmt::format("top_singular: Lanczos did not converge for k = {} of n = {}", k, n));
  TopSingular out;
  out.iterations = eigs.num_iterations();
  out.values = eigs.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  out.right = eigs.eigenvectors();
  // Residual of the normal equations, in the units of the block solver's: ‖AᵀAv − σ²v‖ / σ (one more product).
  const MatrixR<T> vt = out.right.template cast<T>();
  const MatrixR<double> g = a.apply_transpose(a.apply(vt)).template cast<double>();
  out.residuals.resize(k);
  for (Index j = 0; j < k; ++j) {
    const double s = out.values(j);
    out.residuals(j) = s > 0 ? (g.col(j) - s * s * out.right.col(j)).norm() / s : 0.0;
  }
  out.products = 2 * (op.calls() + 1);
  out.vectors = 2 * (op.calls() + k);
  out.solver = SpectrumSolver::Lanczos;
  return out;
}

template <typename T>
TopSingular block_top(const AttentionOperator<T>& a, Index k, const TopSingularOptions& o) {
  BlockKrylovOptions bo;
  bo.block = o.block;
  bo.tol = o.tol;
  bo.max_passes = o.max_passes;
  bo.seed = o.seed;
  BlockKrylovSvd<T> solver(bo);
  solver.compute(a, k);
  if (solver.info() != Status::Success)
    throw Error(fmt::format(
        "top_singular: block Krylov did not reach residual {:.1e}·σ_1 in {} products (k = {}, n = {}); the "
        "largest residual reached is {:.2e}·σ_1 — raise max_passes or the tolerance",
        solver.tolerance(), solver.passes(), k, a.cols(),
        solver.residuals().maxCoeff() / std::max(solver.singularValues()(0), 1e-300)));
  TopSingular out;
  out.values = solver.singularValues();
  out.right = solver.rightVectors();
  out.residuals = solver.residuals();
  out.iterations = solver.iterations();
  out.products = solver.passes();
  out.vectors = solver.passes() * solver.block();
  out.solver = SpectrumSolver::Block;
  return out;
}

}  // namespace

SpectrumSolver parse_spectrum_solver(const std::string& name) {
  if (name == "auto") return SpectrumSolver::Auto;
  if (name == "dense") return SpectrumSolver::Dense;
  if (name == "block") return SpectrumSolver::Block;
  if (name == "lanczos") return SpectrumSolver::Lanczos;
  throw Error(fmt::format("unknown spectrum solver '{}' (auto, dense, block, lanczos)", name));
}

const char* spectrum_solver_name(SpectrumSolver s) {
  switch (s) {
    case SpectrumSolver::Auto: return "auto";
    case SpectrumSolver::Dense: return "dense";
    case SpectrumSolver::Block: return "block";
    case SpectrumSolver::Lanczos: return "lanczos";
  }
  return "?";
}

template <typename T>
VectorX<double> singular_values(const ConstRef<T>& a) {
  const Eigen::MatrixXd ad = a.template cast<double>();
  return bdc_svd(ad).values;
}

template <typename T>
TopSingular top_singular(const AttentionOperator<T>& a, Index k, const TopSingularOptions& o) {
  const Index n = a.cols();
  require(k >= 1 && k <= std::min(a.rows(), a.cols()),
          "top_singular: k = {} is outside [1, {}]", k, std::min(a.rows(), a.cols()));
  SpectrumSolver s = o.solver;
  if (s == SpectrumSolver::Auto) s = (n <= o.dense_limit || k > n / 2) ? SpectrumSolver::Dense : SpectrumSolver::Block;
  switch (s) {
    case SpectrumSolver::Dense: return dense_top(a, k);
    case SpectrumSolver::Lanczos: return lanczos_top(a, k, o);
    default: return block_top(a, k, o);
  }
}

template VectorX<double> singular_values<float>(const ConstRef<float>&);
template VectorX<double> singular_values<double>(const ConstRef<double>&);
template TopSingular top_singular<float>(const AttentionOperator<float>&, Index, const TopSingularOptions&);
template TopSingular top_singular<double>(const AttentionOperator<double>&, Index, const TopSingularOptions&);

}  // namespace attnlab
