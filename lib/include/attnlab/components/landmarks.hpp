// Landmark selection shared by Nyström and Linformer's pooling: segment means (adaptive average pooling, the
// segment lengths differing by at most one when m does not divide n) and uniform sampling without replacement.
#pragma once

#include "attnlab/core/random.hpp"
#include "attnlab/core/types.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

namespace attnlab {

/// Segment s of n rows into m segments: [⌊s·n/m⌋, ⌊(s+1)·n/m⌋).
inline Index segment_begin(Index s, Index n, Index m) { return Index((__int128)s * n / m); }

/// The m×n pooling matrix whose row s averages segment s.
template <typename T>
MatrixR<T> segment_mean_matrix(Index m, Index n) {
  MatrixR<T> p = MatrixR<T>::Zero(m, n);
  for (Index s = 0; s < m; ++s) {
    const Index b = segment_begin(s, n, m), e = segment_begin(s + 1, n, m);
    p.row(s).segment(b, e - b).setConstant(T(1) / T(e - b));
  }
  return p;
}

/// Means of the m segments of the rows of x.
template <typename T>
MatrixR<T> segment_means(const ConstRef<T>& x, Index m) {
  MatrixR<T> out(m, x.cols());
  // Segments are independent: parallel over them, each mean the same bits whatever the thread count.
#pragma omp parallel for schedule(static)
  for (Index s = 0; s < m; ++s) {
    const Index b = segment_begin(s, x.rows(), m), e = segment_begin(s + 1, x.rows(), m);
    out.row(s) = x.middleRows(b, e - b).colwise().mean();
  }
  return out;
}

/// m distinct indices of [0, n), uniformly, sorted.
inline std::vector<Index> sample_without_replacement(Index n, Index m, Rng& rng) {
  std::vector<Index> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), Index(0));
  for (Index i = 0; i < m; ++i)
    std::swap(idx[std::size_t(i)], idx[std::size_t(i + Index(rng.below(std::uint64_t(n - i))))]);
  idx.resize(std::size_t(m));
  std::sort(idx.begin(), idx.end());
  return idx;
}

template <typename T>
MatrixR<T> take_rows(const ConstRef<T>& x, const std::vector<Index>& idx) {
  MatrixR<T> out(Index(idx.size()), x.cols());
  for (std::size_t i = 0; i < idx.size(); ++i) out.row(Index(i)) = x.row(idx[i]);
  return out;
}

}  // namespace attnlab
