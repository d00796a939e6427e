// AᵀB for tall A (n × p) and B (n × q), p, q ≪ n: the reductions over the sequence that every linear-time method
// makes (Σ_j φ(k_j)v_jᵀ, Fᵀ·V, ...). Eigen parallelizes a product over its output blocks, not over its depth, so a
// 64 × 64 result summed over n = 16384 rows ran on one core. Here fixed chunks of rows are multiplied in parallel
// and summed in chunk order: the chunking does not depend on the thread count, so neither do the result's bits;
// below one chunk (n ≤ 4096) it is the plain product.
#pragma once

#include "attnlab/core/types.hpp"

#include <algorithm>
#include <vector>

namespace attnlab::detail {

template <typename T, typename A, typename B>
MatrixR<T> tall_transpose_product(const A& a, const B& b) {
  const Index n = a.rows(), chunk = 4096, chunks = (n + chunk - 1) / chunk;
  if (chunks <= 1) return a.transpose() * b;
  std::vector<MatrixR<T>> parts(static_cast<std::size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (Index c = 0; c < chunks; ++c) {
    const Index r0 = c * chunk, len = std::min(chunk, n - r0);
    parts[std::size_t(c)].noalias() = a.middleRows(r0, len).transpose() * b.middleRows(r0, len);
  }
  MatrixR<T> out = std::move(parts[0]);
  for (Index c = 1; c < chunks; ++c) out += parts[std::size_t(c)];
  return out;
}

}  // namespace attnlab::detail
