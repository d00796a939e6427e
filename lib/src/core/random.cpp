// xoshiro256** seeded by SplitMix64 (Blackman & Vigna), Box–Muller normals: same stream everywhere.
#include "attnlab/core/random.hpp"

#include <cmath>

namespace attnlab {
namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(std::uint64_t seed) {
  for (auto& w : s_) w = splitmix64(seed);
}

std::uint64_t Rng::next_u64() {
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

double Rng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

std::uint64_t Rng::below(std::uint64_t n) {
  // Lemire's multiply-shift with rejection: unbiased.
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

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double t = 2.0 * M_PI * u2;
  spare_ = r * std::sin(t);
  has_spare_ = true;
  return r * std::cos(t);
}

template <typename T>
MatrixR<T> gaussian_matrix(Index n, Index d, Rng& rng) {
  MatrixR<T> m(n, d);
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < d; ++j) m(i, j) = T(rng.normal());
  return m;
}

template MatrixR<float> gaussian_matrix<float>(Index, Index, Rng&);
template MatrixR<double> gaussian_matrix<double>(Index, Index, Rng&);

}  // namespace attnlab
