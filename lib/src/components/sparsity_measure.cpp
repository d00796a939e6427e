// Informer's query sparsity measurement and the selection of the active queries (Zhou et al. 2021, eqs. (2) and (4),
// Lemma 1): components/sparsity_measure.hpp.
// M̄ averages over the sampled keys; the reference code (Informer2020's _prob_QK) divides the sampled sum by n_k
// instead, which shifts every M̄ by a query-dependent amount: attnlab follows the paper's definition (eq. (4)).
#include "attnlab/components/sparsity_measure.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

namespace attnlab {

Index probsparse_u(Index n_q, double factor) {
  return std::min<Index>(n_q, std::max<Index>(1, Index(factor * std::ceil(std::log(double(n_q))))));
}

Index probsparse_default_samples(Index n_k, double factor) {
  return std::max<Index>(1, Index(factor * std::ceil(std::log(double(n_k)))));
}

template <typename T>
VectorX<double> sparsity_measure(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                                 SparsityMeasure kind, Index samples, Rng& rng, const Rounding& rounding) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  const double s = opts.resolved_scale(q.cols());
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  VectorX<double> m(nq);
  // The sampled keys of every query drawn first, in query order (the same draws as one query at a time), so that the
  // measure can then be computed in parallel over queries: each thread's gathered rows of K are cache misses at
  // large n, and two threads keep twice as many in flight.
  const bool sampled = samples > 0 && kind == SparsityMeasure::MaxMean;
  std::vector<Index> idx(sampled ? std::size_t(nq) * std::size_t(samples) : 0);
  if (sampled)
    for (Index i = 0; i < nq; ++i) {
      const Index visible = opts.causal ? i + off + 1 : nk;
      for (Index t = 0; t < samples; ++t) idx[std::size_t(i * samples + t)] = Index(rng.below(std::uint64_t(visible)));
    }
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < nq; ++i) {
    const Index visible = opts.causal ? i + off + 1 : nk;
    VectorX<double> logits;
    if (sampled) {
      logits.resize(samples);
      for (Index t = 0; t < samples; ++t)
        logits(t) = s * double(q.row(i).dot(k.row(idx[std::size_t(i * samples + t)])));
    } else {
      logits = (k.topRows(visible) * q.row(i).transpose()).template cast<double>() * s;
    }
    if (rounding.rounds(Held::accumulator)) {
      // Emulated: qᵀk and s·qᵀk stored in the format (float32 products), the measure from the stored values in
      // float32 and stored too; tallied once per query.
      RoundingTally t;
      Eigen::Matrix<T, Eigen::Dynamic, 1> f(logits.size());
      for (Index j = 0; j < f.size(); ++j) {
        const T raw = rounding.scalar(T(logits(j) / s), Held::accumulator, t);
        f(j) = rounding.scalar(T(s) * raw, Held::accumulator, t);
      }
      const T mx = f.maxCoeff(), mean = f.mean();
      const T mi = kind == SparsityMeasure::MaxMean ? mx - mean : mx + std::log((f.array() - mx).exp().sum()) - mean;
      m(i) = double(rounding.scalar(mi, Held::accumulator, t));
      // A measure that became NaN in the format (inf − inf) ranks last: the selection's ordering stays strict.
      if (std::isnan(m(i))) m(i) = -std::numeric_limits<double>::infinity();
      if (rounding.log) rounding.log->add("logits and measure M", Held::accumulator, t);
      continue;
    }
    const double mx = logits.maxCoeff(), mean = logits.mean();
    m(i) = kind == SparsityMeasure::MaxMean ? mx - mean : mx + std::log((logits.array() - mx).exp().sum()) - mean;
  }
  return m;
}

std::vector<Index> select_queries(const VectorX<double>& measure, Index u, bool causal) {
  const Index n = measure.size();
  std::vector<Index> sel;
  if (!causal) {
    // The u largest, ties to the earlier query (a stable sort's first u, as a set): a selection, not a sort, O(n).
    // A NaN measure (logits that overflowed: inf − inf) ranks last, so that the comparison is a strict total order.
    std::vector<double> key(static_cast<std::size_t>(n));
    for (Index i = 0; i < n; ++i)
      key[std::size_t(i)] = std::isnan(measure(i)) ? -std::numeric_limits<double>::infinity() : measure(i);
    std::vector<Index> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), Index(0));
    const Index take = std::min(u, n);
    std::nth_element(order.begin(), order.begin() + take - (take > 0 ? 1 : 0), order.end(), [&](Index a, Index b) {
      const double ka = key[std::size_t(a)], kb = key[std::size_t(b)];
      return ka > kb || (ka == kb && a < b);
    });
    sel.assign(order.begin(), order.begin() + take);
  } else {
    std::priority_queue<double, std::vector<double>, std::greater<>> best;  // the u largest so far
    for (Index i = 0; i < n; ++i) {
      if (Index(best.size()) < u || measure(i) > best.top()) {
        sel.push_back(i);
        best.push(measure(i));
        if (Index(best.size()) > u) best.pop();
      }
    }
  }
  std::sort(sel.begin(), sel.end());
  return sel;
}

template VectorX<double> sparsity_measure<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                 const AttentionOptions&, SparsityMeasure, Index, Rng&,
                                                 const Rounding&);
template VectorX<double> sparsity_measure<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                  const AttentionOptions&, SparsityMeasure, Index, Rng&,
                                                  const Rounding&);

}  // namespace attnlab
