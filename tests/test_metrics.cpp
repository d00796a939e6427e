// Error metrics against their definitions computed densely here.
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/analysis/metrics.hpp"
#include "attnlab/analysis/norms.hpp"
#include "test_util.hpp"

#include <Eigen/SVD>

namespace attnlab {
namespace {

using test::randn;

/// A random row-stochastic matrix (rows are distributions).
MatrixR<double> random_stochastic(Index n, Index m, std::uint64_t seed) {
  MatrixR<double> p = randn<double>(n, m, seed).array().exp();
  for (Index i = 0; i < n; ++i) p.row(i) /= p.row(i).sum();
  return p;
}

TEST(Metrics, MatrixErrorsMatchDenseDefinitions) {
  for (Index n : {Index(20), Index(150)}) {  // 150 > 64: the spectral norm goes through Lanczos
    const MatrixR<double> p = random_stochastic(n, n + 7, 1), a = random_stochastic(n, n + 7, 2);
    const DenseOperator<double> P(p), A(a);
    MatrixErrorOptions o;
    o.block_rows = 16;
    const MatrixErrors e = matrix_errors(P, A, o);
    EXPECT_NEAR(e.fro, (p - a).norm(), 1e-12);
    EXPECT_NEAR(e.rel_fro, (p - a).norm() / p.norm(), 1e-12);
    EXPECT_NEAR(e.max_abs, (p - a).cwiseAbs().maxCoeff(), 1e-15);
    double kl = 0, tv = 0;
    for (Index i = 0; i < n; ++i) {
      kl += (p.row(i).array() * (p.row(i).array() / a.row(i).array()).log()).sum();
      tv += 0.5 * (p.row(i) - a.row(i)).cwiseAbs().sum();
    }
    ASSERT_TRUE(e.mean_kl && e.mean_tv);
    EXPECT_NEAR(*e.mean_kl, kl / double(n), 1e-12);
    EXPECT_NEAR(*e.mean_tv, tv / double(n), 1e-12);
    const Eigen::MatrixXd pd = p, dd = p - a;
    Eigen::JacobiSVD<Eigen::MatrixXd> sd(dd), sp(pd);
    ASSERT_TRUE(e.spectral && e.rel_spectral);
    EXPECT_NEAR(*e.spectral, sd.singularValues()(0), 1e-8 * sd.singularValues()(0));
    EXPECT_NEAR(*e.rel_spectral, sd.singularValues()(0) / sp.singularValues()(0), 1e-8);
  }
}

TEST(Metrics, IdenticalMatricesHaveZeroError) {
  const MatrixR<float> q = randn<float>(90, 8, 3), k = randn<float>(90, 8, 4);
  const ExactOperator<float> P(q, k, {});
  const DenseOperator<float> D(exact_matrix<float>(q, k, {}));
  const MatrixErrors e = matrix_errors<float>(P, D);
  EXPECT_LT(e.rel_fro, 1e-6);
  EXPECT_LT(*e.mean_kl, 1e-6);
  EXPECT_LT(*e.rel_spectral, 1e-5);
}

TEST(Metrics, KlIsInfiniteWhereTheApproximationMissesMassAndAbsentForNonDistributions) {
  MatrixR<double> p(2, 3), a(2, 3);
  p << 0.5, 0.5, 0, 0.2, 0.3, 0.5;
  a << 1.0, 0.0, 0, 0.2, 0.3, 0.5;
  MatrixErrorOptions o;
  o.spectral = false;
  const MatrixErrors e = matrix_errors<double>(DenseOperator<double>(p), DenseOperator<double>(a), o);
  EXPECT_TRUE(std::isinf(*e.mean_kl));
  EXPECT_NEAR(*e.mean_tv, 0.25, 1e-15);
  MatrixR<double> neg = a;
  neg(1, 0) = -0.1;
  neg(1, 1) = 0.6;
  const MatrixErrors f = matrix_errors<double>(DenseOperator<double>(p), DenseOperator<double>(neg, false), o);
  EXPECT_FALSE(f.mean_kl.has_value());
  // A method that claims distributions but is not one is caught by the row check too.
  const MatrixErrors g = matrix_errors<double>(DenseOperator<double>(p), DenseOperator<double>(neg, true), o);
  EXPECT_FALSE(g.mean_tv.has_value());
  EXPECT_THROW(matrix_errors<double>(DenseOperator<double>(p), DenseOperator<double>(p.leftCols(2)), o), Error);
}

TEST(Metrics, OutputErrors) {
  MatrixR<double> o(3, 2), a(3, 2);
  o << 1, 0, 0, 2, 3, 4;
  a << 2, 0, 0, -1, 3, 4;
  const OutputErrors e = output_errors<double>(o, a);
  EXPECT_NEAR(e.rel_fro, std::sqrt(1.0 + 9.0) / std::sqrt(1.0 + 4 + 9 + 16), 1e-15);
  EXPECT_NEAR(e.max_abs, 3.0, 1e-15);
  EXPECT_NEAR(e.mean_cosine, (1.0 - 1.0 + 1.0) / 3.0, 1e-15);
  EXPECT_NEAR(e.min_cosine, -1.0, 1e-15);
}

TEST(Norms, SpectralNormOfExactAttentionMatchesSvd) {
  for (bool causal : {false, true}) {
    const MatrixR<double> q = randn<double>(200, 16, 5), k = randn<double>(200, 16, 6);
    AttentionOptions o;
    o.causal = causal;
    const ExactOperator<double> P(q, k, o);
    const Eigen::MatrixXd pd = exact_matrix<double>(q, k, o);
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(pd);
    const SpectralNormResult r = spectral_norm(P);
    EXPECT_TRUE(r.converged);
    EXPECT_NEAR(r.value, svd.singularValues()(0), 1e-9 * svd.singularValues()(0));
  }
}

}  // namespace
}  // namespace attnlab
