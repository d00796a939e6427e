// k-means++ and Lloyd's iterations; distances as ‖x‖² − 2x·c + ‖c‖² through one product per iteration.
#include "attnlab/components/kmeans.hpp"

#include "attnlab/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace attnlab {
namespace {

/// Squared distances of every point to every centroid (n × c), clamped at 0 against rounding.
template <typename T>
MatrixR<T> sq_distances(const ConstRef<T>& x, const ConstRef<T>& c) {
  MatrixR<T> d = x * c.transpose() * T(-2);
  d.colwise() += x.rowwise().squaredNorm();
  d.rowwise() += c.rowwise().squaredNorm().transpose();
  return d.cwiseMax(T(0));
}

}  // namespace

template <typename T>
std::vector<Index> nearest(const ConstRef<T>& x, const ConstRef<T>& centroids) {
  // argmin_c ‖x − c‖² = argmin_c (‖c‖² − 2x·c): one product, then a row-wise argmin, in blocks of rows (the
  // n × c distance matrix is never formed whole).
  const Index n = x.rows(), block = 256;
  const VectorX<T> cn = centroids.rowwise().squaredNorm();
  std::vector<Index> a(static_cast<std::size_t>(n));
#pragma omp parallel for schedule(static)
  for (Index b0 = 0; b0 < n; b0 += block) {
    const Index bi = std::min(block, n - b0);
    MatrixR<T> g = x.middleRows(b0, bi) * centroids.transpose() * T(-2);
    g.rowwise() += cn.transpose();
    for (Index r = 0; r < bi; ++r) g.row(r).minCoeff(&a[std::size_t(b0 + r)]);
  }
  return a;
}

template <typename T>
KMeansResult<T> kmeans(const ConstRef<T>& x, Index clusters, Index iterations, Rng& rng) {
  const Index n = x.rows(), dim = x.cols();
  require(clusters >= 1 && clusters <= n, "k-means: {} clusters for {} points", clusters, n);
  KMeansResult<T> r;
  r.centroids.resize(clusters, dim);
  // k-means++: the first centre uniformly, each next one with probability ∝ D(x)², the squared distance to the
  // nearest centre so far (a point already chosen has D = 0 and is never chosen again while others remain).
  r.copy_of.assign(std::size_t(clusters), -1);
  r.formed_from.assign(std::size_t(n), -1);
  r.copy_of[0] = Index(rng.below(std::uint64_t(n)));
  r.centroids.row(0) = x.row(r.copy_of[0]);
  // Sums in double, from one conversion of the points (not one per iteration).
  const MatrixR<double> xd = x.template cast<double>();
  // D(x)² to the newest centre, min-ed into dist: in parallel over blocks of rows, each row's squared norm computed
  // exactly as a whole-matrix expression would (the same per-row reduction), so the picks do not depend on threads.
  VectorX<double> dist(n);
  const auto update = [&](Index c, bool first) {
    const Index block = 512;
#pragma omp parallel for schedule(static)
    for (Index b0 = 0; b0 < n; b0 += block) {
      const Index bi = std::min(block, n - b0);
      const VectorX<double> d =
          (x.middleRows(b0, bi).rowwise() - r.centroids.row(c)).rowwise().squaredNorm().template cast<double>();
      if (first) {
        dist.segment(b0, bi) = d;
      } else {
        dist.segment(b0, bi) = dist.segment(b0, bi).cwiseMin(d);
      }
    }
  };
  update(0, true);
  for (Index c = 1; c < clusters; ++c) {
    const double total = dist.sum();
    Index pick = 0;
    if (total > 0) {
      double u = rng.uniform() * total;
      for (pick = 0; pick < n - 1; ++pick) {
        u -= dist(pick);
        if (u < 0 && dist(pick) > 0) break;
      }
      while (dist(pick) == 0 && pick > 0) --pick;  // never a point that is already a centre
    } else {
      pick = Index(rng.below(std::uint64_t(n)));  // all points coincide with centres
    }
    r.centroids.row(c) = x.row(pick);
    r.copy_of[std::size_t(c)] = pick;
    update(c, false);
  }
  r.assignment = nearest<T>(x, r.centroids);
  for (Index it = 0; it < iterations; ++it) {
    MatrixR<double> sum = MatrixR<double>::Zero(clusters, dim);
    std::vector<Index> count(static_cast<std::size_t>(clusters), 0);
    for (Index i = 0; i < n; ++i) ++count[std::size_t(r.assignment[std::size_t(i)])];
    // Cluster sums in parallel over column ranges: every (cluster, column) still adds its points in index order,
    // so the sums are the same bits whatever the number of threads.
    const Index cols_per = 16;
#pragma omp parallel for schedule(static)
    for (Index c0 = 0; c0 < dim; c0 += cols_per) {
      const Index cw = std::min(cols_per, dim - c0);
      for (Index i = 0; i < n; ++i) sum.row(r.assignment[std::size_t(i)]).segment(c0, cw) += xd.row(i).segment(c0, cw);
    }
    // Distances to the old centroids are needed only to refill an empty cluster.
    const bool empty = std::find(count.begin(), count.end(), Index(0)) != count.end();
    const MatrixR<T> d = empty ? sq_distances<T>(x, r.centroids) : MatrixR<T>();
    r.formed_from = r.assignment;  // the sums' assignment, before a re-seed moves a point
    for (Index c = 0; c < clusters; ++c) {
      if (count[std::size_t(c)] > 0) {
        r.centroids.row(c) = (sum.row(c) / double(count[std::size_t(c)])).template cast<T>();
        r.copy_of[std::size_t(c)] = -1;
      } else {
        // An empty cluster takes the point farthest from its own centroid.
        Index far = 0;
        T best = -1;
        for (Index i = 0; i < n; ++i)
          if (d(i, r.assignment[std::size_t(i)]) > best) best = d(i, r.assignment[std::size_t(i)]), far = i;
        r.centroids.row(c) = x.row(far);
        r.copy_of[std::size_t(c)] = far;
        r.assignment[std::size_t(far)] = c;
      }
    }
    std::vector<Index> next = nearest<T>(x, r.centroids);
    r.iterations = it + 1;
    const bool stable = next == r.assignment;
    r.assignment.swap(next);
    if (stable) break;
  }
  r.inertia = 0;
  for (Index i = 0; i < n; ++i)
    r.inertia += double((x.row(i) - r.centroids.row(r.assignment[std::size_t(i)])).squaredNorm());
  return r;
}

template KMeansResult<float> kmeans<float>(const ConstRef<float>&, Index, Index, Rng&);
template KMeansResult<double> kmeans<double>(const ConstRef<double>&, Index, Index, Rng&);
template std::vector<Index> nearest<float>(const ConstRef<float>&, const ConstRef<float>&);
template std::vector<Index> nearest<double>(const ConstRef<double>&, const ConstRef<double>&);

}  // namespace attnlab
