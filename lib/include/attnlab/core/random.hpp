// Seeded, reproducible randomness that gives the same numbers on every platform and compiler
// (std::normal_distribution does not): SplitMix64 to seed xoshiro256**, Box–Muller for normals.
#pragma once

#include "attnlab/core/types.hpp"

#include <array>
#include <cstdint>

namespace attnlab {

class Rng {
 public:
  explicit Rng(std::uint64_t seed);
  std::uint64_t next_u64();
  /// Uniform in [0, 1).
  double uniform();
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n);
  /// Standard normal.
  double normal();

 private:
  std::array<std::uint64_t, 4> s_{};
  bool has_spare_ = false;
  double spare_ = 0;
};

/// An n×d matrix of iid N(0, 1) entries.
template <typename T>
MatrixR<T> gaussian_matrix(Index n, Index d, Rng& rng);

}  // namespace attnlab
