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
  /// xoshiro256** (Blackman & Vigna). Inline with below(): integer arithmetic only, the same bits wherever it is
  /// compiled, and a draw per sampled key is hot (ProbSparse draws n·c·ln n of them).
  std::uint64_t next_u64() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, 1).
  double uniform();
  /// Uniform integer in [0, n): Lemire's multiply-shift with rejection, unbiased.
  std::uint64_t below(std::uint64_t n) {
    __uint128_t m = __uint128_t(next_u64()) * n;
    std::uint64_t low = std::uint64_t(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = __uint128_t(next_u64()) * n;
        low = std::uint64_t(m);
      }
    }
    return std::uint64_t(m >> 64);
  }
  /// Standard normal.
  double normal();

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<std::uint64_t, 4> s_{};
  bool has_spare_ = false;
  double spare_ = 0;
};

/// An n×d matrix of iid N(0, 1) entries.
template <typename T>
MatrixR<T> gaussian_matrix(Index n, Index d, Rng& rng);

}  // namespace attnlab
