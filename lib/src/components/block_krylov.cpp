// Randomized block Krylov SVD of an attention operator (see the header for the method and its stopping rule).
// Everything but the operator's products is in double: the basis, the Ritz problem and the residuals.
#include "attnlab/components/block_krylov.hpp"

#include "attnlab/components/dense_svd.hpp"
#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/random.hpp"

#include <Eigen/QR>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {
namespace {

using Mat = Eigen::MatrixXd;  // column-major: the basis grows by columns

/// Orthonormal columns spanning the part of X orthogonal to basis (block classical Gram–Schmidt, twice — "twice is
/// enough", Giraud et al. 2005 — then Householder QR of the block). Directions X does not supply (X rank-deficient
/// after the projection, e.g. an operator of low rank) are filled with random vectors, so the basis keeps growing
/// by whole blocks. Returns fewer columns only when the basis and the block would exceed the space.
Mat orthonormal_block(const Eigen::Ref<const Mat>& basis, Mat x, Rng& rng) {
  const Index n = x.rows();
  const Index b = std::min<Index>(x.cols(), n - basis.cols());
  x.conservativeResize(n, b);
  if (b <= 0) return Mat(n, 0);
  for (int attempt = 0; attempt < 4; ++attempt) {
    const Eigen::VectorXd scale = x.colwise().norm();
    for (int pass = 0; pass < 2; ++pass)
      if (basis.cols() > 0) x.noalias() -= basis * (basis.transpose() * x);
    Eigen::HouseholderQR<Mat> qr(x);
    const Mat r = qr.matrixQR().topRows(b).template triangularView<Eigen::Upper>();
    // A column whose part beyond the basis and the block's earlier columns is below 1e-10 of its length brings
    // no new direction: replace it by a random vector and try again.
    bool full = true;
    for (Index j = 0; j < b; ++j)
      if (!(std::abs(r(j, j)) > 1e-10 * std::max(scale(j), 1e-300))) {
        full = false;
        for (Index i = 0; i < n; ++i) x(i, j) = rng.normal();
      }
    if (full) {
      Mat q = qr.householderQ() * Mat::Identity(n, b);
      // One more projection: Householder's Q is orthonormal within the block, and x was already ⟂ basis to
      // working precision; this keeps the basis orthonormal across many blocks.
      if (basis.cols() > 0) q.noalias() -= basis * (basis.transpose() * q);
      Eigen::HouseholderQR<Mat> qr2(q);
      return qr2.householderQ() * Mat::Identity(n, b);
    }
  }
  throw Error("block Krylov: could not extend the basis (the operator's space is exhausted)");
}

}  // namespace

template <typename T>
BlockKrylovSvd<T>& BlockKrylovSvd<T>::compute(const AttentionOperator<T>& a, Index k) {
  const Index m = a.rows(), n = a.cols();
  require(k >= 1 && k <= std::min(m, n),
          "block Krylov SVD: k = {} is outside [1, {}]", k, std::min(m, n));
  require(opts_.block >= 0 && opts_.max_basis >= 0 && opts_.max_passes >= 2 && opts_.tol >= 0,
          "block Krylov SVD: block, max_basis ≥ 0, max_passes ≥ 2 and tol ≥ 0 required");
  const Index b = std::min(n, opts_.block > 0 ? opts_.block : k + std::max<Index>(8, k / 4));
  Index max_basis = opts_.max_basis > 0 ? opts_.max_basis : std::max(k + 3 * b, 6 * b);
  require(max_basis >= std::min(n, k + 2 * b),
          "block Krylov SVD: max_basis = {} is below k + 2·block = {}", max_basis, k + 2 * b);
  max_basis = std::min(max_basis, n);
  // A float operator's products carry float rounding: residuals below ~1e-6·σ_1 are not reachable.
  tol_ = std::is_same_v<T, float> ? std::max(opts_.tol, 1e-5) : opts_.tol;
  block_ = b;
  passes_ = iterations_ = restarts_ = 0;
  status_ = Status::NoConvergence;

  Rng rng(opts_.seed);
  // V, W, Z hold the basis and its products in their leading nb columns, allocated once (capacity: a full basis
  // plus the block about to be added) — no copies as the basis grows.
  const Index cap = std::min(n, max_basis) + b;
  Mat v(n, cap), w(m, cap), z(n, cap);
  Index nb = 0;
  Mat omega(n, b);
  for (Index j = 0; j < b; ++j)
    for (Index i = 0; i < n; ++i) omega(i, j) = rng.normal();
  Mat vnew = orthonormal_block(v.leftCols(0), std::move(omega), rng);

  Mat y;              // nb×nb: right singular vectors of W, the Ritz coordinates
  Eigen::VectorXd s;  // Ritz values, descending
  while (true) {
    throw_if_cancelled();
    // Two block products: W_new = A·V_new, Z_new = Aᵀ·W_new.
    const Index bn = vnew.cols();
    {
      const MatrixR<T> wn = a.apply(MatrixR<T>(vnew.template cast<T>()));
      w.middleCols(nb, bn) = wn.template cast<double>();
      z.middleCols(nb, bn) = a.apply_transpose(wn).template cast<double>();
    }
    passes_ += 2;
    v.middleCols(nb, bn) = vnew;
    nb += bn;
    const auto V = v.leftCols(nb), W = w.leftCols(nb), Z = z.leftCols(nb);

    // Rayleigh–Ritz: the SVD of W = A·V, through the R of W's QR (the singular values keep their accuracy down
    // to rounding of σ_1, which the Gram matrix WᵀW would square).
    {
      Mat small;
      if (m >= nb) {
        Eigen::HouseholderQR<Mat> qr(W);
        small = qr.matrixQR().topRows(nb).template triangularView<Eigen::Upper>();
      } else {
        small = W;
      }
      const DenseSvd svd = bdc_svd(small, Eigen::ComputeFullV);
      s = Eigen::VectorXd::Zero(nb);
      s.head(svd.values.size()) = svd.values;
      y = svd.v;
      // Eigen 3.4's BDCSVD can return zero columns of V for exactly zero singular values (an operator of rank
      // below the basis size): fall back to the one-sided Jacobi SVD, slower but always orthogonal.
      if ((y.transpose() * y - Mat::Identity(nb, nb)).cwiseAbs().maxCoeff() > 1e-10) {
        const DenseSvd jacobi = jacobi_svd(small, Eigen::ComputeFullV);
        s.setZero();
        s.head(jacobi.values.size()) = jacobi.values;
        y = jacobi.v;
      }
    }
    ++iterations_;

    // Residuals of the leading k: r_j = ‖Z y_j − σ_j² V y_j‖ / σ_j (zero-cost: Z = AᵀW is kept).
    const Index kk = std::min(k, nb);
    Mat res = Z * y.leftCols(kk);
    res.noalias() -= V * (y.leftCols(kk) * s.head(kk).array().square().matrix().asDiagonal());
    residuals_.resize(kk);
    const double floor = tol_ * s(0);
    bool converged = s(0) > 0;
    for (Index j = 0; j < kk; ++j) {
      residuals_(j) = s(j) > floor ? res.col(j).norm() / s(j) : s(j);
      if (!(residuals_(j) <= floor)) converged = false;
    }
    if (nb == n) converged = true;  // the whole space spanned: the Ritz triplets are exact
    if (converged) status_ = Status::Success;
    if (converged || passes_ + 2 > opts_.max_passes) break;

    // Next block: the newest Z block beyond the basis. Then, if the basis is full, cut it to the leading
    // k + b Ritz directions (a thick restart: V, W and Z are rotated together, no product repeated).
    vnew = orthonormal_block(V, Z.rightCols(bn), rng);
    if (vnew.cols() == 0) {  // nothing left to add (cannot happen before nb == n, which stopped above)
      status_ = Status::Success;
      break;
    }
    if (nb + vnew.cols() > max_basis) {
      const Index keep = std::min(nb, k + b);
      const Mat yr = y.leftCols(keep);
      v.leftCols(keep) = V * yr;
      w.leftCols(keep) = W * yr;
      z.leftCols(keep) = Z * yr;
      nb = keep;
      ++restarts_;
    }
  }

  const Index kk = std::min(k, nb);
  values_ = s.head(kk);
  right_ = v.leftCols(nb) * y.leftCols(kk);  // y belongs to the current V (a restart happens only if the loop goes on)
  // Left vectors u_j = W y_j / σ_j (A v_j = σ_j u_j); for a value at the noise floor, the direction is noise.
  left_ = w.leftCols(nb) * y.leftCols(kk);
  for (Index j = 0; j < kk; ++j)
    if (values_(j) > 0) left_.col(j) /= values_(j);
  return *this;
}

template class BlockKrylovSvd<float>;
template class BlockKrylovSvd<double>;

}  // namespace attnlab
