// Generated sources; every draw comes from one seeded Rng in a fixed order (Q, K, V, then the source's own).
#include "attnlab/io/sources.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/random.hpp"

#include <Eigen/QR>
#include <fmt/format.h>

#include <cmath>

namespace attnlab {

const char* source_kinds() { return "gaussian, clustered, lowrank"; }

template <typename T>
Qkv<T> generate_problem(const SourceOptions& s, Index n_q, Index n_k, Index d, Index d_v, std::uint64_t seed) {
  require(n_q > 0 && n_k > 0 && d > 0 && d_v > 0, "generated problem: sizes must be positive");
  require(std::isfinite(s.temperature) && s.temperature > 0, "source temperature must be finite and positive");
  Rng rng(seed);
  Qkv<T> p{gaussian_matrix<T>(n_q, d, rng), gaussian_matrix<T>(n_k, d, rng), gaussian_matrix<T>(n_k, d_v, rng)};
  if (s.kind == "gaussian") {
  } else if (s.kind == "clustered") {
    require(s.centres >= 1 && s.spread >= 0, "clustered source: centres ≥ 1 and spread ≥ 0");
    const MatrixR<T> centres = gaussian_matrix<T>(s.centres, d, rng);
    p.q *= T(s.spread);
    p.k *= T(s.spread);
    for (Index i = 0; i < n_q; ++i) p.q.row(i) += centres.row(Index(rng.below(std::uint64_t(s.centres))));
    for (Index j = 0; j < n_k; ++j) p.k.row(j) += centres.row(Index(rng.below(std::uint64_t(s.centres))));
  } else if (s.kind == "lowrank") {
    require(s.rank >= 1 && s.rank <= d, "lowrank source: rank must lie in [1, d = {}]", d);
    const Eigen::MatrixXd g = gaussian_matrix<double>(d, s.rank, rng);
    const Eigen::MatrixXd basis = Eigen::HouseholderQR<Eigen::MatrixXd>(g).householderQ() *
                                  Eigen::MatrixXd::Identity(d, s.rank);  // d × r orthonormal
    const MatrixR<T> proj = (basis * basis.transpose() * std::sqrt(double(d) / double(s.rank))).cast<T>();
    p.q = p.q * proj;
    p.k = p.k * proj;
  } else {
    throw Error(fmt::format("unknown source '{}'; valid: {}", s.kind, source_kinds()));
  }
  p.q /= T(s.temperature);
  return p;
}

template Qkv<float> generate_problem<float>(const SourceOptions&, Index, Index, Index, Index, std::uint64_t);
template Qkv<double> generate_problem<double>(const SourceOptions&, Index, Index, Index, Index, std::uint64_t);

}  // namespace attnlab
