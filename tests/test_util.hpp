// Helpers shared by the tests: seeded random problems and relative errors.
#pragma once

#include "attnlab/random.hpp"
#include "attnlab/types.hpp"

#include <gtest/gtest.h>

#include <cmath>

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

using Scalars = ::testing::Types<float, double>;

}  // namespace attnlab::test
