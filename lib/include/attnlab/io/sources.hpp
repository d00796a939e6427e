// Generated attention problems, seeded: the inputs on which methods are judged besides the user's own arrays.
//   gaussian  — iid N(0, 1) Q, K, V; `temperature` divides the logits (Q is scaled by 1/T).
//   clustered — queries and keys around `centres` shared centres (N(0, I)), spread `spread`: sharp, low-entropy
//               attention of the kind trained models show.
//   lowrank   — Q and K in a random `rank`-dimensional subspace (norms matched to the Gaussian case).
// Gaussian Q, K give attention that is a rank-one mean plus nearly full-rank noise: every low-rank method looks
// bad on it. Judge methods on the other sources too.
#pragma once

#include "attnlab/core/types.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

struct SourceOptions {
  std::string kind = "gaussian";
  double temperature = 1.0;
  Index centres = 32;
  double spread = 0.3;
  Index rank = 8;
};

template <typename T>
struct Qkv {
  MatrixR<T> q, k, v;
};

/// Throws Error for an unknown kind (listing the valid ones) or out-of-range options.
template <typename T>
Qkv<T> generate_problem(const SourceOptions& source, Index n_q, Index n_k, Index d, Index d_v, std::uint64_t seed);

/// "gaussian, clustered, lowrank"
const char* source_kinds();

}  // namespace attnlab
