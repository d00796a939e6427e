// The pattern methods' shared parts (attnlab/methods/base/pattern_method.hpp): the softmax over a pattern, and the
// sliding-window band (Beltagy et al. 2020, Longformer §3.1) that `local` and `sparse` both hold.
#include "attnlab/methods/base/pattern_method.hpp"

#include "attnlab/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {

template <typename T>
typename SparseOperator<T>::Sparse pattern_softmax(const ConstRef<T>& q, const ConstRef<T>& k, double scale,
                                                   Pattern pattern) {
  using Sparse = typename SparseOperator<T>::Sparse;
  const Index nq = q.rows(), nk = k.rows();
  std::vector<Index> outer(std::size_t(nq) + 1, 0);
  for (Index i = 0; i < nq; ++i) {
    auto& row = pattern[std::size_t(i)];
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    require(!row.empty() && row.front() >= 0 && row.back() < nk, "sparse pattern: empty row or key out of range");
    outer[std::size_t(i) + 1] = outer[std::size_t(i)] + Index(row.size());
  }
  const Index nnz = outer.back();
  std::vector<Index> inner(static_cast<std::size_t>(nnz));
  std::vector<T> values(static_cast<std::size_t>(nnz));
#pragma omp parallel for schedule(dynamic, 64)
  for (Index i = 0; i < nq; ++i) {
    const auto& row = pattern[std::size_t(i)];
    const std::size_t base = std::size_t(outer[std::size_t(i)]);
    T mx = -std::numeric_limits<T>::infinity();
    for (std::size_t t = 0; t < row.size(); ++t) {
      const T logit = T(scale) * q.row(i).dot(k.row(row[t]));
      values[base + t] = logit;
      inner[base + t] = row[t];
      mx = std::max(mx, logit);
    }
    T sum = 0;
    for (std::size_t t = 0; t < row.size(); ++t) sum += values[base + t] = std::exp(values[base + t] - mx);
    for (std::size_t t = 0; t < row.size(); ++t) values[base + t] /= sum;
  }
  Sparse p(nq, nk);
  p.reserve(nnz);
  for (Index i = 0; i < nq; ++i) {
    p.startVec(i);
    for (Index t = outer[std::size_t(i)]; t < outer[std::size_t(i) + 1]; ++t)
      p.insertBack(i, inner[std::size_t(t)]) = values[std::size_t(t)];
  }
  p.finalize();
  return p;
}

template SparseOperator<float>::Sparse pattern_softmax<float>(const ConstRef<float>&, const ConstRef<float>&, double,
                                                              Pattern);
template SparseOperator<double>::Sparse pattern_softmax<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                                double, Pattern);

template <typename T>
Gradients<T> pattern_backward(const typename SparseOperator<T>::Sparse& p, const ConstRef<T>& q,
                              const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& d_out, double scale) {
  using Sparse = typename SparseOperator<T>::Sparse;
  require(p.isCompressed() && p.rows() == q.rows() && p.cols() == k.rows(), "pattern_backward: P̃ does not match");
  const Index nq = p.rows();
  // dS on P̃'s own structure: per row, dP_ij = dO_i·v_j, D_i = Σ_j P̃_ij dP_ij (= dO_i·O_i), dS_ij = P̃_ij (dP_ij − D_i).
  Sparse ds = p;
  const Index* outer = p.outerIndexPtr();
  const Index* inner = p.innerIndexPtr();
  const T* pv = p.valuePtr();
  T* dsv = ds.valuePtr();
#pragma omp parallel for schedule(dynamic, 64)
  for (Index i = 0; i < nq; ++i) {
    T d = 0;
    for (Index t = outer[i]; t < outer[i + 1]; ++t) {
      dsv[t] = d_out.row(i).dot(v.row(inner[t]));
      d += pv[t] * dsv[t];
    }
    for (Index t = outer[i]; t < outer[i + 1]; ++t) dsv[t] = pv[t] * (dsv[t] - d);
  }
  const T s = T(scale);
  Gradients<T> g;
  g.dq.noalias() = ds * k;
  g.dq *= s;
  g.dk.noalias() = ds.transpose() * q;
  g.dk *= s;
  g.dv.noalias() = p.transpose() * d_out;
  return g;
}

template Gradients<float> pattern_backward<float>(const SparseOperator<float>::Sparse&, const ConstRef<float>&,
                                                  const ConstRef<float>&, const ConstRef<float>&,
                                                  const ConstRef<float>&, double);
template Gradients<double> pattern_backward<double>(const SparseOperator<double>::Sparse&, const ConstRef<double>&,
                                                    const ConstRef<double>&, const ConstRef<double>&,
                                                    const ConstRef<double>&, double);

/// The band around the aligned position c_i = i + off, cut at the future when causal.
void add_band(Pattern& p, Index nq, Index nk, Index w, bool causal) {
  const Index off = nk - nq;
  for (Index i = 0; i < nq; ++i) {
    const Index c = i + off;
    const Index lo = std::max<Index>(0, c - w), hi = causal ? std::min(c, nk - 1) : std::min(c + w, nk - 1);
    for (Index j = lo; j <= hi; ++j) p[std::size_t(i)].push_back(j);
  }
}

}  // namespace attnlab
