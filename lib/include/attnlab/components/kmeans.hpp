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
  /// How the centroids were last formed, for differentiating them given the assignments (a cluster's mean is linear
  /// in its points): centroid c is the point copy_of[c] itself when copy_of[c] ≥ 0 (a k-means++ pick when no Lloyd
  /// step ran, or an empty cluster's re-seed), else the mean of the points i with formed_from[i] == c — the
  /// assignment of the last Lloyd step, which differs from `assignment` when the iterations stopped unconverged.
  std::vector<Index> formed_from;   ///< n entries (−1 when no Lloyd step ran)
  std::vector<Index> copy_of;       ///< c entries (−1: a mean)
};

template <typename T>
KMeansResult<T> kmeans(const ConstRef<T>& x, Index clusters, Index iterations, Rng& rng);

/// Index of the nearest centroid of each row of x.
template <typename T>
std::vector<Index> nearest(const ConstRef<T>& x, const ConstRef<T>& centroids);

}  // namespace attnlab
