// AᵀB for tall A (n × p) and B (n × q), p, q ≪ n: the reductions over the sequence that every linear-time method
// makes (Σ_j φ(k_j)v_jᵀ, Fᵀ·V, ...). Eigen parallelizes a product over its output blocks, not over its depth, so a
// 64 × 64 result summed over n = 16384 rows ran on one core. Here fixed chunks of rows are multiplied in parallel
// and summed in chunk order: the chunking does not depend on the thread count, so neither do the result's bits;
// below one chunk (n ≤ 4096) it is one product, its output's rows split among the threads (row_split_product).
#pragma once

#include "attnlab/core/types.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

namespace attnlab::detail {

/// AᵀB with the output's rows split among the OpenMP threads, in blocks that start at multiples of 8 rows. Eigen's
/// products run on one thread (core/reproducible.cpp: its own split changed the depth blocking with the thread count);
/// a block of rows of AᵀB is a product over the same depth n, whose depth blocking Eigen takes from n and the L1 size
/// alone, and whose register panels (nr = 4 rows of this row-major output, the columns of the column-major product
/// Eigen makes) start where the whole product's do. So every entry is summed in the same order as in the whole
/// product, on any thread count (tested bit for bit: test_random.cpp). Serial where a split does not pay (small
/// products, one thread, inside a parallel region) or where Eigen would take another kernel for a piece (a single
/// output column: a matrix–vector product).
template <typename T, typename A, typename B>
MatrixR<T> row_split_product(const A& a, const B& b) {
  constexpr Index kRows = 8;
  const Index p = a.cols(), q = b.cols(), n = a.rows();
  const Index threads = std::min<Index>(omp_in_parallel() ? 1 : omp_get_max_threads(), p / kRows);
  if (threads < 2 || q < 2 || double(p) * double(q) * double(n) < 2e5) return a.transpose() * b;
  const Index per = (p / kRows + threads - 1) / threads * kRows;  // a multiple of 8; the last block takes the rest
  const Index blocks = std::min(threads, (p + per - 1) / per);
  MatrixR<T> out(p, q);
#pragma omp parallel for schedule(static) num_threads(int(blocks))
  for (Index c = 0; c < blocks; ++c) {
    const Index r0 = c * per, h = c + 1 == blocks ? p - r0 : per;
    out.middleRows(r0, h).noalias() = a.middleCols(r0, h).transpose() * b;
  }
  return out;
}

template <typename T, typename A, typename B>
MatrixR<T> tall_transpose_product(const A& a, const B& b) {
  const Index n = a.rows(), chunk = 4096, chunks = (n + chunk - 1) / chunk;
  if (chunks <= 1) return row_split_product<T>(a, b);
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
