// The matrix-free top-k solvers against a dense SVD: the block Krylov solver's values, residuals and subspaces on
// small operators of every kind (exact, causal exact, rectangular, low-rank beyond its rank, sparse, a difference),
// float32 and float64; its stopping rule on a clustered spectrum; Lanczos and block in agreement; the
// Eckart–Young floor `svd:rank=R` through the block path equal to the dense one.
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/components/block_krylov.hpp"
#include "attnlab/analysis/norms.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/components/spectrum.hpp"
#include "test_util.hpp"

#include <Eigen/QR>
#include <Eigen/SVD>

#include <memory>
#include <string>

namespace attnlab {
namespace {

using test::randn;

struct DenseSvd {
  Eigen::VectorXd s;
  Eigen::MatrixXd u, v;
};

template <typename T>
DenseSvd dense_svd(const AttentionOperator<T>& op) {
  const Eigen::MatrixXd a = materialize(op).template cast<double>();
  Eigen::BDCSVD<Eigen::MatrixXd> svd(a, Eigen::ComputeThinU | Eigen::ComputeThinV);
  return {svd.singularValues(), svd.matrixU(), svd.matrixV()};
}

/// Checks what the solver certifies against the dense SVD of the same operator:
///  - the reported residual r_j is the true ‖Aᵀu_j − σ_j v_j‖ with u_j = A v_j/σ_j (recomputed densely);
///  - every value is within r_j of the dense one (a triplet with residual r is exact for some A + E, ‖E‖ ≤ r);
///  - the subspace obeys Wedin's sin Θ theorem: ‖(I − V_kV_kᵀ)V̂‖_F ≤ ‖r‖₂ / (σ̂_k − σ_{k+1}) when that gap is real.
/// `slack` is the rounding of the operator's precision (the dense reference is read from the same products).
template <typename T>
void check_against_dense(const AttentionOperator<T>& op, const BlockKrylovSvd<T>& solver, Index k) {
  ASSERT_EQ(solver.info(), Status::Success);
  const DenseSvd ref = dense_svd(op);
  const Eigen::MatrixXd a = materialize(op).template cast<double>();
  const double s1 = ref.s(0);
  const double slack = (sizeof(T) == 4 ? 2e-6 : 1e-13) * a.norm();
  const VectorX<double>& s = solver.singularValues();
  const Eigen::MatrixXd v = solver.rightVectors();
  ASSERT_EQ(s.size(), k);
  ASSERT_EQ(v.cols(), k);
  EXPECT_LT((v.transpose() * v - Eigen::MatrixXd::Identity(k, k)).norm(), 1e-12) << "right vectors orthonormal";
  for (Index j = 0; j < k; ++j) {
    SCOPED_TRACE(::testing::Message() << "j = " << j << ", σ = " << ref.s(j));
    const double r = solver.residuals()(j);
    EXPECT_LE(r, solver.tolerance() * s(0) * (1 + 1e-12)) << "the stopping rule";
    EXPECT_NEAR(s(j), ref.s(j), r + slack);
    if (s(j) > solver.tolerance() * s1) {
      const Eigen::VectorXd u = a * v.col(j) / s(j);
      const double true_r = (a.transpose() * u - s(j) * v.col(j)).norm();
      EXPECT_LE(true_r, r + slack / std::max(s(j) / s1, 1e-3)) << "reported residual is the true one";
      EXPECT_NEAR((solver.leftVectors().col(j) - u).norm(), 0.0, sizeof(T) == 4 ? 1e-5 : 1e-9)
          << "left vector = A v / σ";
    }
  }
  if (k < ref.s.size()) {
    const double gap = s(k - 1) - ref.s(k);
    if (gap > 1e-3 * s1) {
      const Eigen::MatrixXd vk = ref.v.leftCols(k);
      const double sin_theta = (v - vk * (vk.transpose() * v)).norm();
      EXPECT_LE(sin_theta, (solver.residuals().norm() + slack) / gap) << "Wedin's bound, gap " << gap;
    }
  }
}

template <typename T>
class BlockKrylovTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(BlockKrylovTest, Scalars);

/// Default options, and a small block with a small basis so that the thick restart runs.
std::vector<BlockKrylovOptions> option_sets() {
  BlockKrylovOptions def;
  BlockKrylovOptions small;
  small.block = 4;
  small.max_basis = 8 + 2 * 4;
  small.max_passes = 2000;
  return {def, small};
}

TYPED_TEST(BlockKrylovTest, ExactOperators) {
  using T = TypeParam;
  for (const bool causal : {false, true})
    for (const Index nq : {300, 250}) {
      SCOPED_TRACE(::testing::Message() << "causal " << causal << " nq " << nq);
      const MatrixR<T> q = randn<T>(nq, 16, 1, 0.7), k = randn<T>(300, 16, 2, 0.7);
      AttentionOptions o;
      o.causal = causal;
      const ExactOperator<T> op(q, k, o);
      for (const BlockKrylovOptions& bo : option_sets()) {
        BlockKrylovSvd<T> solver(bo);
        solver.compute(op, 8);
        check_against_dense(op, solver, 8);
        if (bo.block == 4) {
          EXPECT_GT(solver.restarts(), 0) << "the restart path ran";
        }
      }
    }
}

TYPED_TEST(BlockKrylovTest, LowRankBeyondItsRank) {
  using T = TypeParam;
  // Rank 12: the top 8 are genuine, and asking for 20 reaches the zero singular values (the noise floor).
  const LowRankOperator<T> op(randn<T>(260, 12, 3), randn<T>(280, 12, 4), false);
  for (const Index k : {8, 20}) {
    SCOPED_TRACE(::testing::Message() << "k = " << k);
    BlockKrylovSvd<T> solver;
    solver.compute(op, k);
    check_against_dense(op, solver, k);
    if (k == 20) {
      EXPECT_LE(solver.singularValues()(19), solver.tolerance() * solver.singularValues()(0));
    }
  }
}

TYPED_TEST(BlockKrylovTest, SparseAndDifferenceOperators) {
  using T = TypeParam;
  const MatrixR<T> q = randn<T>(320, 16, 5, 0.6), k = randn<T>(320, 16, 6, 0.6);
  auto local = make_method<T>("local:window=8", 0);
  local->compute(q, k);
  auto nystrom = make_method<T>("nystrom:landmarks=16", 0);
  nystrom->compute(q, k);
  const ExactOperator<T> exact(q, k, {});
  const DifferenceOperator<T> diff(exact, nystrom->op());
  for (const AttentionOperator<T>* op : {&local->op(), static_cast<const AttentionOperator<T>*>(&diff)}) {
    BlockKrylovSvd<T> solver;
    solver.compute(*op, 10);
    check_against_dense(*op, solver, 10);
  }
}

/// A spectrum with a tight cluster: 1, 0.8, 0.6, then ten values 0.5·(1 + 10⁻⁴·i), then a tail. k = 6 cuts
/// the cluster, so no subspace of dimension 6 is well defined, but every value is, and the residual rule stops
/// there. A loose tolerance stops earlier with values still within their residuals; a pass budget too small to
/// meet the tolerance ends as NoConvergence with residuals that say so, and top_singular refuses it.
TEST(BlockKrylovStopping, ClusteredSpectrum) {
  const Index n = 400;
  Rng rng(7);
  const Eigen::MatrixXd gu = gaussian_matrix<double>(n, n, rng), gv = gaussian_matrix<double>(n, n, rng);
  const Eigen::MatrixXd u = Eigen::HouseholderQR<Eigen::MatrixXd>(gu).householderQ();
  const Eigen::MatrixXd v = Eigen::HouseholderQR<Eigen::MatrixXd>(gv).householderQ();
  Eigen::VectorXd sigma(n);
  sigma.head(3) << 1.0, 0.8, 0.6;
  for (Index i = 0; i < 10; ++i) sigma(3 + i) = 0.5 * (1 + 1e-4 * double(9 - i));
  for (Index i = 13; i < n; ++i) sigma(i) = 0.3 * std::pow(0.97, double(i - 13));
  const DenseOperator<double> op(MatrixR<double>(u * sigma.asDiagonal() * v.transpose()), false);

  Index strict_passes = 0;
  for (const double tol : {1e-10, 1e-3}) {
    SCOPED_TRACE(::testing::Message() << "tol " << tol);
    BlockKrylovOptions bo;
    bo.tol = tol;
    BlockKrylovSvd<double> solver(bo);
    solver.compute(op, 6);
    ASSERT_EQ(solver.info(), Status::Success);
    for (Index j = 0; j < 6; ++j) {
      EXPECT_LE(solver.residuals()(j), tol);
      EXPECT_NEAR(solver.singularValues()(j), sigma(j), solver.residuals()(j) + 1e-14);
    }
    if (tol == 1e-10) {
      strict_passes = solver.passes();
      EXPECT_NEAR(solver.singularValues()(5), sigma(5), 1e-12);
    } else {
      EXPECT_LT(solver.passes(), strict_passes) << "a looser tolerance stops earlier";
    }
  }

  BlockKrylovOptions starved;
  starved.block = 2;
  starved.max_passes = 2;
  starved.tol = 1e-12;
  BlockKrylovSvd<double> solver(starved);
  solver.compute(op, 6);
  EXPECT_EQ(solver.info(), Status::NoConvergence);
  EXPECT_GT(solver.residuals().maxCoeff(), 1e-12) << "the residuals show it";
  TopSingularOptions o;
  o.solver = SpectrumSolver::Block;
  o.block = 2;
  o.max_passes = 2;
  o.tol = 1e-12;
  EXPECT_THROW(top_singular(op, 6, o), Error);
}

TEST(TopSingular, BlockAndLanczosAgreeWithDense) {
  const MatrixR<double> q = randn<double>(700, 32, 8, 0.5), k = randn<double>(700, 32, 9, 0.5);
  const ExactOperator<double> op(q, k, {});
  const DenseSvd ref = dense_svd(op);
  for (const SpectrumSolver s : {SpectrumSolver::Auto, SpectrumSolver::Block, SpectrumSolver::Lanczos}) {
    SCOPED_TRACE(spectrum_solver_name(s));
    TopSingularOptions o;
    o.solver = s;
    const TopSingular top = top_singular(op, 12, o);
    EXPECT_EQ(top.solver, s == SpectrumSolver::Lanczos ? SpectrumSolver::Lanczos : SpectrumSolver::Block);
    for (Index j = 0; j < 12; ++j) EXPECT_NEAR(top.values(j), ref.s(j), 1e-10 * ref.s(0));
    EXPECT_GT(top.products, 0);
    EXPECT_LE(top.residuals.maxCoeff(), 1e-8 * ref.s(0));
  }
  EXPECT_THROW(top_singular(op, 0), Error);
  EXPECT_THROW(top_singular(op, 701), Error);
  EXPECT_THROW(parse_spectrum_solver("arnoldi"), Error);
}

/// The Eckart–Young floor through the block path: ‖P − P_R‖_F equals √(Σ_{j>R} σ_j²) of the dense SVD, and the
/// dense-path method gives the same P̃.
TEST(TopSingular, SvdFloorThroughBlockPath) {
  const MatrixR<double> q = randn<double>(600, 16, 10, 0.6), k = randn<double>(600, 16, 11, 0.6);
  const MatrixR<double> p = exact_matrix<double>(q, k, {});
  const Eigen::VectorXd s = Eigen::BDCSVD<Eigen::MatrixXd>(Eigen::MatrixXd(p)).singularValues();
  const Index r = 16;
  const double floor = s.tail(s.size() - r).norm();
  for (const std::string spec : {"svd:rank=16,dense_limit=64", "svd:rank=16,solver=block",
                                 "svd:rank=16,solver=lanczos", "svd:rank=16,solver=dense"}) {
    SCOPED_TRACE(spec);
    auto m = make_method<double>(spec, 0);
    m->compute(q, k);
    ASSERT_EQ(m->info(), Status::Success);
    EXPECT_NEAR((p - m->matrix()).norm(), floor, 1e-9 * floor);
  }
}

/// The spectral norm of an operator whose top singular values form a tight cluster (40 values within 4e-6, as a
/// sharp trained head's P − P_R has; Spectra's Lanczos stopped with "did not converge" on such a head): the value
/// is right even when the top vector cannot be resolved, and the residual reported bounds its error.
TEST(SpectralNorm, ClusteredTop) {
  const Index n = 300;
  Rng rng(12);
  const Eigen::MatrixXd u = Eigen::HouseholderQR<Eigen::MatrixXd>(gaussian_matrix<double>(n, n, rng)).householderQ();
  const Eigen::MatrixXd v = Eigen::HouseholderQR<Eigen::MatrixXd>(gaussian_matrix<double>(n, n, rng)).householderQ();
  Eigen::VectorXd sigma(n);
  for (Index i = 0; i < n; ++i) sigma(i) = i < 40 ? std::sqrt(2.0) * (1 - 1e-7 * double(i)) : 0.9 * std::pow(0.99, i);
  const DenseOperator<double> op(MatrixR<double>(u * sigma.asDiagonal() * v.transpose()), false);
  const SpectralNormResult r = spectral_norm(op);
  EXPECT_LE(r.value, sigma(0) * (1 + 1e-14)) << "a Ritz value never exceeds σ₁";
  EXPECT_NEAR(r.value, sigma(0), std::max(r.residual, 1e-13));
  EXPECT_NEAR(r.value, sigma(0), 1e-6 * sigma(0));
  if (!r.converged) {
    EXPECT_GT(r.residual, 1e-10 * r.value) << "not converged means the residual says so";
  }
}

}  // namespace
}  // namespace attnlab
