// Pseudo-inverses: the SVD reference, and the order-3 and Newton–Schulz iterations on the badly conditioned
// softmax landmark matrices of Nyströmformer (Gaussian inputs, d = 64, m = 64, scale 1/√d): they converge, with
// the convergence orders their error recurrences predict (E' = ¾E³ + ¼E⁴ and E' = E²).
#include "attnlab/operators/exact.hpp"
#include "attnlab/components/landmarks.hpp"
#include "attnlab/components/pinv.hpp"
#include "attnlab/components/spectrum.hpp"
#include "test_util.hpp"

#include <Eigen/LU>
#include <Eigen/QR>

#include <algorithm>
#include <cmath>

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

// ---- pinv_backward: the VJP of what compute() returns, against central differences of compute() alone.

MatrixR<double> pinv_of(const MatrixR<double>& a, PinvMethod method, Index iters, double rcond = -1) {
  Pseudoinverse<double> p;
  p.setMethod(method).setIterations(iters).setRcond(rcond).compute(a);
  return p.pseudoinverse();
}

/// The worst relative disagreement of ⟨dA, δ⟩ with (⟨G, Z(A + hδ)⟩ − ⟨G, Z(A − hδ)⟩)/2h over random directions δ.
/// `stochastic`: directions with zero row sums, which keep a softmax matrix's rows summing to 1 (as perturbing its
/// logits does): every row then ties for ‖A‖∞, a maximum that is not differentiable in other directions.
double pinv_fd_error(const MatrixR<double>& a, PinvMethod method, Index iters, double rcond = -1, double h = 1e-6,
                     bool stochastic = false) {
  const MatrixR<double> g = randn<double>(a.cols(), a.rows(), 71);
  const MatrixR<double> da = pinv_backward<double>(a, g, method, iters, rcond);
  double worst = 0;
  for (int t = 0; t < 5; ++t) {
    MatrixR<double> delta = randn<double>(a.rows(), a.cols(), 80 + t);
    if (stochastic) delta.colwise() -= delta.rowwise().mean();
    delta /= delta.norm();
    const double lp = (g.array() * pinv_of(a + h * delta, method, iters, rcond).array()).sum();
    const double lm = (g.array() * pinv_of(a - h * delta, method, iters, rcond).array()).sum();
    const double numeric = (lp - lm) / (2 * h), analytic = (da.array() * delta.array()).sum();
    worst = std::max(worst, std::fabs(analytic - numeric) / std::max(std::fabs(numeric), 1e-3 * da.norm()));
  }
  return worst;
}

TEST(PinvBackward, IterationsAgreeWithFiniteDifferences) {
  // A softmax landmark matrix (positive entries, rows summing to 1; perturbed along directions that keep them so)
  // and a general one (signs: the derivatives of
  // ‖A‖₁ and ‖A‖∞ in Z₀ = Aᵀ/(‖A‖₁‖A‖∞) matter), square and wide; step counts that exercise the √K checkpoints
  // (K = 7: segments 3, 3, 1; K = 30: 6 × 5) and K = 0 (Z₀ alone).
  const MatrixR<double> q = randn<double>(96, 16, 5), k = randn<double>(96, 16, 6);
  AttentionOptions o;
  o.scale = 0.25;
  const MatrixR<double> soft = exact_matrix<double>(segment_means<double>(q, 12), segment_means<double>(k, 12), o);
  const MatrixR<double> general = randn<double>(10, 10, 7) + 3.0 * MatrixR<double>::Identity(10, 10);
  const MatrixR<double> wide = randn<double>(6, 9, 8);
  for (const MatrixR<double>* a : {&soft, &general, &wide})
    for (PinvMethod method : {PinvMethod::Order3, PinvMethod::NewtonSchulz})
      for (Index iters : {Index(0), Index(1), Index(6), Index(7), Index(30)}) {
        const double e = pinv_fd_error(*a, method, iters, -1, 1e-6, a == &soft);
        EXPECT_LT(e, 1e-6) << a->rows() << "×" << a->cols() << " method " << int(method) << " iters " << iters;
      }
}

TEST(PinvBackward, SvdIsTheInversesDerivativeAndHandlesTruncation) {
  // Full rank: dA = −Zᵀ·G·Zᵀ exactly.
  const MatrixR<double> a = randn<double>(9, 9, 9) + 2.0 * MatrixR<double>::Identity(9, 9);
  const MatrixR<double> g = randn<double>(9, 9, 10);
  const MatrixR<double> z = a.inverse();
  EXPECT_LT(
      test::rel_err(pinv_backward<double>(a, g, PinvMethod::Svd, 0), (-(z.transpose() * g * z.transpose())).eval()),
      1e-12);
  EXPECT_LT(pinv_fd_error(a, PinvMethod::Svd, 0), 1e-7);
  // Singular values 1 … 1e-2 kept and three at 1e-9 dropped by rcond = 1e-6: the derivative of the truncation's
  // pseudo-inverse, with its kept set fixed (far from the cutoff, central differences do not cross it).
  const Index m = 10;
  const Eigen::MatrixXd u = Eigen::MatrixXd(randn<double>(m, m, 11)).householderQr().householderQ();
  const Eigen::MatrixXd v = Eigen::MatrixXd(randn<double>(m, m, 12)).householderQr().householderQ();
  Eigen::VectorXd sv(m);
  sv << 1, 0.7, 0.5, 0.3, 0.2, 0.1, 0.01, 3e-9, 2e-9, 1e-9;
  const MatrixR<double> t = u * sv.asDiagonal() * v.transpose();
  EXPECT_LT(test::rel_err(pinv_of(t, PinvMethod::Svd, 0, 1e-6),
                          (v.leftCols(7) * sv.head(7).cwiseInverse().asDiagonal() * u.leftCols(7).transpose()).eval()),
            1e-9);
  EXPECT_LT(pinv_fd_error(t, PinvMethod::Svd, 0, 1e-6, 1e-9), 1e-5);
}

}  // namespace
}  // namespace attnlab
