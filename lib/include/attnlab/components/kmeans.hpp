// k-means (Lloyd's iterations from a k-means++ start, Arthur & Vassilvitskii 2007), seeded; an empty cluster is
// re-seeded with the point farthest from its centroid. The codebook of Transformer-VQ (Lingle 2023).
#pragma once

#include "attnlab/core/random.hpp"
#include "attnlab/core/types.hpp"

#include <vector>

namespace attnlab {

template <typename T>
struct KMeansResult {
  MatrixR<T> centroids;             ///< c × d
  std::vector<Index> assignment;    ///< nearest centroid of each point
  double inertia = 0;               ///< Σ‖x − c_a(x)‖²
  Index iterations = 0;
};

template <typename T>
KMeansResult<T> kmeans(const ConstRef<T>& x, Index clusters, Index iterations, Rng& rng);

/// Index of the nearest centroid of each row of x.
template <typename T>
std::vector<Index> nearest(const ConstRef<T>& x, const ConstRef<T>& centroids);

}  // namespace attnlab
