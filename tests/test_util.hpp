// Helpers shared by the tests: seeded random problems and relative errors.
#pragma once

#include "attnlab/core/error.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/types.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <cmath>
#include <limits>

namespace attnlab::test {

template <typename T>
MatrixR<T> randn(Index n, Index d, std::uint64_t seed, double sigma = 1.0) {
  Rng rng(seed);
  MatrixR<T> m = gaussian_matrix<T>(n, d, rng);
  return m * T(sigma);
}

/// ‖a − b‖_F / ‖b‖_F in double.
template <typename A, typename B>
double rel_err(const A& a, const B& b) {
  const auto ad = a.template cast<double>().eval();
  const auto bd = b.template cast<double>().eval();
  return (ad - bd).norm() / bd.norm();
}

/// Relative tolerance for comparisons between two computations of the same quantity.
template <typename T>
constexpr double tol() {
  return sizeof(T) == 4 ? 1e-5 : 1e-12;
}

/// An entrywise bound B_ij ≥ |P₁ − P₂|_ij between two computations in precision T of softmax rows
/// P_ij = exp(ℓ_ij − L_i) with logits ℓ_ij = s·a_iᵀb_j (causal: j ≤ i + n_b − n_a), from a first-order worst-case
/// rounding analysis that holds on every CPU whatever its summation order (AVX2, AVX-512, scalar):
///   - each logit: |δℓ_ij| ≤ e_ij = γ_{D+1}·|s|·Σ_c |a_ic||b_jc| (Higham, Accuracy and Stability, Thm 3.1 for a
///     dot product of length D, one more rounding for the scale), γ_k = k·u/(1 − k·u), u the unit roundoff;
///   - the log-sum-exp: L is 1-Lipschitz in the max-norm of the logits, so |δL_i| ≤ max_j e_ij, plus γ_n for the
///     sum of n positive terms and u·|L_i| for the log;
///   - the exponent ℓ − L is rounded (u·|ℓ_ij − L_i|) and exp has a relative error of a few ulp (4u, glibc and
///     Eigen's vectorized exp alike);
/// so |δP_ij| ≤ P_ij·(e_ij + max_k e_ik + γ_n + u(|L_i| + |ℓ_ij − L_i| + 4)) for one computation, twice that for
/// the difference of two. It grows with the logits' magnitude |s|·Σ|a||b| and the length, as the observed errors
/// do (float32, logits ×100, d = 16: 1.5e-5 observed on AVX-512, a relative bound of ~3e-4).
template <typename T>
MatrixR<double> softmax_rounding_bound(const MatrixR<double>& a, const MatrixR<double>& b, double s, bool causal) {
  const double u = std::numeric_limits<T>::epsilon() / 2;
  const auto gamma = [u](double k) { return k * u / (1 - k * u); };
  const Index na = a.rows(), nb = b.rows(), off = nb - na;
  const MatrixR<double> l = s * a * b.transpose();
  const MatrixR<double> e = gamma(double(a.cols()) + 1) * std::fabs(s) * a.cwiseAbs() * b.cwiseAbs().transpose();
  MatrixR<double> bound = MatrixR<double>::Zero(na, nb);
  for (Index i = 0; i < na; ++i) {
    const Index last = causal ? i + off : nb - 1;
    const double mx = l.row(i).head(last + 1).maxCoeff();
    const double lse = mx + std::log((l.row(i).head(last + 1).array() - mx).exp().sum());
    const double emax = e.row(i).head(last + 1).maxCoeff();
    for (Index j = 0; j <= last; ++j) {
      const double rel = e(i, j) + emax + gamma(double(last + 1)) + u * (std::fabs(lse) + std::fabs(l(i, j) - lse) + 4);
      bound(i, j) = 2 * std::exp(l(i, j) - lse) * rel;
    }
  }
  return bound;
}

/// max(tol<T>(), ‖bound‖_F / ‖reference‖_F): the relative tolerance that an entrywise error bound implies.
template <typename T, typename B, typename R>
double tol_from_bound(const B& bound, const R& reference) {
  return std::max(tol<T>(), bound.norm() / reference.template cast<double>().norm());
}

using Scalars = ::testing::Types<float, double>;

/// The message of the attnlab::Error that f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace attnlab::test
