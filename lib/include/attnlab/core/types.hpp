// Scalar and matrix types shared by every part of attnlab.
// Tokens are rows: Q (n_q×d), K (n_k×d), V (n_k×d_v) are row-major, as numpy's C order stores them,
// so an (n, d) .npy file maps onto a matrix without a copy.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <string>

namespace attnlab {

using Index = Eigen::Index;

template <typename T>
using MatrixR = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using VectorX = Eigen::Matrix<T, Eigen::Dynamic, 1>;
template <typename T>
using ConstRef = Eigen::Ref<const MatrixR<T>>;
template <typename T>
using MutRef = Eigen::Ref<MatrixR<T>>;

/// The two floating-point types attnlab computes in.
enum class DType { f32, f64 };

inline const char* dtype_name(DType t) { return t == DType::f32 ? "float32" : "float64"; }
inline std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 8; }
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<double>() { return DType::f64; }

/// The size of a problem, known before any work: n_q queries and n_k keys of dimension d, values of dimension d_v,
/// `elem` bytes per value (4: float32, 8: float64).
struct ProblemSize {
  Index n_q = 0, n_k = 0, d = 0, d_v = 0;
  std::uint64_t elem = 8;
};

/// Outcome of a compute() call, as Eigen's ComputationInfo.
enum class Status { Success, NotComputed, NoConvergence, NumericalIssue };
const char* status_name(Status s);

/// True when every entry is finite. Vectorized: 0·x sums to 0 exactly when no entry is NaN or ±∞ (Eigen's
/// allFinite() compares one scalar at a time, which cost 2 ms on a 4096 × 256 feature matrix).
template <typename Derived>
bool all_finite(const Eigen::DenseBase<Derived>& x) {
  using S = typename Derived::Scalar;
  return x.size() == 0 || (x.derived().array() * S(0)).sum() == S(0);
}

}  // namespace attnlab
