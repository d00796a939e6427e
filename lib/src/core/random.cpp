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
}  // namespace

Rng::Rng(std::uint64_t seed) {
  for (auto& w : s_) w = splitmix64(seed);
}

double Rng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

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
