// The pattern methods' shared parts (attnlab/methods/base/pattern_method.hpp): the softmax over a pattern, and the
// sliding-window band (Beltagy et al. 2020, Longformer §3.1) that `local` and `sparse` both hold.
#include "attnlab/methods/base/pattern_method.hpp"

#include "attnlab/core/error.hpp"
#include "band.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attnlab {

template <typename T>
typename SparseOperator<T>::Sparse pattern_softmax(const ConstRef<T>& q, const ConstRef<T>& k, double scale,
                                                   Pattern pattern, const Rounding& rounding) {
  using Sparse = typename SparseOperator<T>::Sparse;
  const Index nq = q.rows(), nk = k.rows();
  bool valid = true;
#pragma omp parallel for schedule(dynamic, 64) reduction(&& : valid)
  for (Index i = 0; i < nq; ++i) {  // rows apart: sorted, duplicates merged (rounds, globals and bands overlap)
    auto& row = pattern[std::size_t(i)];
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    valid = valid && !row.empty() && row.front() >= 0 && row.back() < nk;
  }
  require(valid, "sparse pattern: empty row or key out of range");
  // The compressed matrix written in place (no insertion, no intermediate copies): outer offsets first, then each
  // row's keys and softmax in parallel.
  Sparse p(nq, nk);
  Index nnz = 0;
  for (Index i = 0; i < nq; ++i) nnz += Index(pattern[std::size_t(i)].size());
  p.resizeNonZeros(nnz);
  Index* outer = p.outerIndexPtr();
  outer[0] = 0;
  for (Index i = 0; i < nq; ++i) outer[i + 1] = outer[i] + Index(pattern[std::size_t(i)].size());
  Index* inner = p.innerIndexPtr();
  T* values = p.valuePtr();
#pragma omp parallel for schedule(dynamic, 64)
  for (Index i = 0; i < nq; ++i) {
    const auto& row = pattern[std::size_t(i)];
    const Index base = outer[i];
    T mx = -std::numeric_limits<T>::infinity();
    // Emulated storage: the logits stored as formed (eager), the probabilities stored (both), tallied once per row;
    // natively scalar() returns its argument, so these are the plain softmax's operations.
    RoundingTally lt, pt;
    for (std::size_t t = 0; t < row.size(); ++t) {
      const T raw = rounding.scalar(T(q.row(i).dot(k.row(row[t]))), Held::accumulator, lt);
      const T logit = rounding.scalar(T(scale) * raw, Held::accumulator, lt);
      values[base + Index(t)] = logit;
      inner[base + Index(t)] = row[t];
      mx = std::max(mx, logit);
    }
    T sum = 0;
    for (std::size_t t = 0; t < row.size(); ++t)
      sum += values[base + Index(t)] = std::exp(values[base + Index(t)] - mx);
    for (std::size_t t = 0; t < row.size(); ++t)
      values[base + Index(t)] = rounding.scalar(values[base + Index(t)] / sum, Held::tensor, pt);
    if (rounding.active() && rounding.log) {
      if (rounding.rounds(Held::accumulator)) rounding.log->add("logits s·QKᵀ", Held::accumulator, lt);
      rounding.log->add("probabilities P", Held::tensor, pt);
    }
  }
  return p;
}

template SparseOperator<float>::Sparse pattern_softmax<float>(const ConstRef<float>&, const ConstRef<float>&, double,
                                                              Pattern, const Rounding&);
template SparseOperator<double>::Sparse pattern_softmax<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                                double, Pattern, const Rounding&);

template <typename T>
Gradients<T> pattern_backward(const typename SparseOperator<T>::Sparse& p, const ConstRef<T>& q,
                              const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& d_out, double scale,
                              const Rounding& rounding) {
  using Sparse = typename SparseOperator<T>::Sparse;
  require(p.isCompressed() && p.rows() == q.rows() && p.cols() == k.rows(), "pattern_backward: P̃ does not match");
  const Index nq = p.rows();
  // dS on P̃'s own structure: per row, dP_ij = dO_i·v_j, D_i = Σ_j P̃_ij dP_ij (= dO_i·O_i),
  // dS_ij = P̃_ij (dP_ij − D_i), and dQ_i = s·Σ_j dS_ij k_j in the same pass (rows apart: parallel).
  const Index* outer = p.outerIndexPtr();
  const Index* inner = p.innerIndexPtr();
  const T* pv = p.valuePtr();
  std::vector<T> dsv(static_cast<std::size_t>(p.nonZeros()));
  const T s = T(scale);
  Gradients<T> g;
  g.dq.setZero(nq, q.cols());
#pragma omp parallel for schedule(dynamic, 64)
  for (Index i = 0; i < nq; ++i) {
    T d = 0;
    if (rounding.active()) {
      // Emulated (autograd's masked softmax): dP stored, D in float32 (inside the softmax's backward), dS stored,
      // s·dS stored again under eager; tallied once per row.
      RoundingTally pt, st;
      for (Index t = outer[i]; t < outer[i + 1]; ++t) {
        dsv[std::size_t(t)] = rounding.scalar(T(d_out.row(i).dot(v.row(inner[t]))), Held::tensor, pt);
        d += pv[t] * dsv[std::size_t(t)];
      }
      for (Index t = outer[i]; t < outer[i + 1]; ++t) {  // dsv holds s·dS here, as stored (dK is not scaled again)
        const T ds = rounding.scalar(pv[t] * (dsv[std::size_t(t)] - d), Held::tensor, st);
        dsv[std::size_t(t)] = rounding.scalar(s * ds, Held::accumulator, st);
        g.dq.row(i) += dsv[std::size_t(t)] * k.row(inner[t]);
      }
      if (rounding.log) {
        rounding.log->add("dP = dO·Vᵀ", Held::tensor, pt);
        rounding.log->add("dS = P ∘ (dP − D)", Held::tensor, st);
      }
      continue;
    }
    for (Index t = outer[i]; t < outer[i + 1]; ++t) {
      dsv[std::size_t(t)] = d_out.row(i).dot(v.row(inner[t]));
      d += pv[t] * dsv[std::size_t(t)];
    }
    for (Index t = outer[i]; t < outer[i + 1]; ++t) {
      dsv[std::size_t(t)] = pv[t] * (dsv[std::size_t(t)] - d);
      g.dq.row(i) += (s * dsv[std::size_t(t)]) * k.row(inner[t]);
    }
  }
  // dK = s·dSᵀ Q and dV = P̃ᵀ dO scatter into key rows: the structure viewed with dS's values, no copy.
  const Eigen::Map<const Sparse> ds(p.rows(), p.cols(), p.nonZeros(), outer, inner, dsv.data());
  g.dk.noalias() = ds.transpose() * q;
  if (!rounding.active()) g.dk *= s;  // emulated, dsv already holds s·dS
  g.dv.noalias() = p.transpose() * d_out;
  return g;
}

template Gradients<float> pattern_backward<float>(const SparseOperator<float>::Sparse&, const ConstRef<float>&,
                                                  const ConstRef<float>&, const ConstRef<float>&,
                                                  const ConstRef<float>&, double, const Rounding&);
template Gradients<double> pattern_backward<double>(const SparseOperator<double>::Sparse&, const ConstRef<double>&,
                                                    const ConstRef<double>&, const ConstRef<double>&,
                                                    const ConstRef<double>&, double, const Rounding&);

void require_band_reaches_keys(const char* method, Index nq, Index nk, Index w, bool causal) {
  // the first queries, whose band ends before key 0: c_i + W < 0 (causal: c_i < 0)
  const Index empty = std::max<Index>(0, causal ? nq - nk : nq - nk - w);
  require(empty == 0,
          "{}: {} queries against {} keys leave {} query bands without a key (window W = {}: query i sees keys "
          "|j − c_i| ≤ W{}, c_i = i + n_k − n_q, the queries aligned to the last keys); give n_q ≤ n_k{}",
          method, nq, nk, empty, w, causal ? ", j ≤ c_i" : "", causal ? "" : " + W, or a wider window");
}

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
