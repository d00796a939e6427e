// Pseudo-inverses: the SVD reference, and the order-3 and Newton–Schulz iterations on the badly conditioned
// softmax landmark matrices of Nyströmformer (Gaussian inputs, d = 64, m = 64, scale 1/√d): they converge, with
// the convergence orders their error recurrences predict (E' = ¾E³ + ¼E⁴ and E' = E²).
#include "attnlab/operators/exact.hpp"
#include "attnlab/components/landmarks.hpp"
#include "attnlab/components/pinv.hpp"
#include "attnlab/analysis/spectrum.hpp"
#include "test_util.hpp"

#include <Eigen/QR>

namespace attnlab {
namespace {

using test::randn;

TEST(Pinv, SvdMatchesCompleteOrthogonalDecomposition) {
  for (auto shape : {std::pair<Index, Index>{9, 9}, std::pair<Index, Index>{7, 12}}) {
    MatrixR<double> a = randn<double>(shape.first, shape.second, 3);
    a.row(2) = a.row(0) + a.row(1);  // rank-deficient
    const MatrixR<double> ref = Eigen::MatrixXd(a).completeOrthogonalDecomposition().pseudoInverse();
    EXPECT_LT(test::rel_err(svd_pinv<double>(a), ref), 1e-10);
  }
}

MatrixR<double> landmark_matrix(Index n, std::uint64_t seed) {
  const Index d = 64, m = 64;
  const MatrixR<double> q = randn<double>(n, d, seed), k = randn<double>(n, d, seed + 1);
  return exact_matrix<double>(segment_means<double>(q, m), segment_means<double>(k, m), {});
}

Index iterations_to(const std::vector<double>& r, double tol) {
  for (std::size_t i = 0; i < r.size(); ++i)
    if (r[i] < tol) return Index(i);
  return -1;
}

TEST(Pinv, IterationsConvergeOnLandmarkMatrices) {
  for (Index n : {Index(512), Index(4096)}) {
    const MatrixR<double> a = landmark_matrix(n, 11);
    const VectorX<double> sv = singular_values<double>(a);
    const MatrixR<double> ref = svd_pinv<double>(a);
    Pseudoinverse<double> o3, ns;
    o3.setMethod(PinvMethod::Order3).setIterations(40).setReference(ref).compute(a);
    ns.setMethod(PinvMethod::NewtonSchulz).setIterations(80).setReference(ref).compute(a);
    const Index k3 = iterations_to(o3.residuals(), 1e-6), k2 = iterations_to(ns.residuals(), 1e-6);
    const double p3 = convergence_order(o3.residuals(), 1e-11, 1.0);
    const double p2 = convergence_order(ns.residuals(), 1e-11, 1.0);
    std::printf("landmark matrix n=%ld m=64: cond %.3g; ‖I−AZ_k‖_F < 1e-6 after %ld (order 3) and %ld (Newton) "
                "iterations; after 6: %.3g and %.3g; orders %.2f and %.2f; ‖Z−A⁺‖_F at the end %.2g, %.2g\n",
                long(n), sv(0) / sv(sv.size() - 1), long(k3), long(k2), o3.residuals()[6], ns.residuals()[6], p3, p2,
                o3.errors().back(), ns.errors().back());
    EXPECT_GE(k3, 0) << "order 3 did not reach 1e-6 in 40 iterations";
    EXPECT_LE(k3, 40);
    EXPECT_GE(k2, 0) << "Newton–Schulz did not reach 1e-6 in 80 iterations";
    EXPECT_NEAR(p3, 3.0, 0.5);
    EXPECT_NEAR(p2, 2.0, 0.3);
    // The paper's 6 iterations are far from converged on these matrices.
    EXPECT_GT(o3.residuals()[6], 1e-2);
    EXPECT_EQ(o3.info(), Status::Success);
    // ‖Z_k − A⁺‖ goes down with ‖I − AZ_k‖.
    EXPECT_LT(o3.errors().back(), 1e-6 * ref.norm() * sv(0) / sv(sv.size() - 1));
  }
}

TEST(Pinv, ToleranceStopsEarly) {
  const MatrixR<double> a = landmark_matrix(512, 12);
  Pseudoinverse<double> p;
  p.setIterations(100).setTolerance(1e-8).compute(a);
  EXPECT_LT(p.residuals().back(), 1e-8);
  EXPECT_LT(p.iterations(), 100);
}

}  // namespace
}  // namespace attnlab
