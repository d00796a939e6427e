// `reformer` — Reformer's LSH attention (Kitaev et al. 2020, "Reformer: The Efficient Transformer", §2–3): angular
// LSH h(x) = argmax[xW; −xW] with a random rotation W (d×B/2), the same hash for queries and keys; queries and keys
// sorted by (bucket, position), cut into chunks of L keys (queries into as many chunks), each query attending to its
// chunk and the previous one. Rounds are combined by their log-sum-exp weights with the duplicate correction
// (Reformer §3 "multi-round"), which is exactly the softmax over the union of the rounds' key sets: that union is the
// pattern here.
// Causal: sorting all positions and cutting chunks would let future tokens' hashes decide which past keys a query
// sees (the sorted order of the past shifts when a future hash changes) — a leak. With a mask, query i instead
// attends to the 2·chunk most recent keys j ≤ c_i of its own bucket (what its sorted chunk and the previous one hold,
// restricted to the past), and to c_i.
#include "attnlab/methods/reformer.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/random.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace attnlab {

MethodDescriptor ReformerOptions::registry_entry() {
  return describe<ReformerMethod, ReformerOptions>(
      "Reformer LSH attention: angular hashing, sorted chunks, multi-round union",
      "Kitaev et al. 2020 (Reformer) §2: angular LSH, sorted chunks, multi-round",
      Causal::yes("the most recent same-bucket keys"))
      .with_backward(Backward::yes("rotations, buckets, sort and chunks held fixed: softmax over each query's union "
                                   "of key sets (duplicates counted once), O(nnz·d)"))
      .with_storage(StorageEmulation::both(
          "non-causal (causal: the pattern softmax's emulation, as sparse); both policies: Q, K, V, each chunk's "
          "probabilities before their product with V and O; eager "
          "also each chunk's logits s·QKᵀ and the running softmax sums and accumulators merged across chunks and "
          "rounds (the reference's per-round outputs and log-sum-exps); careful keeps those in float32; the hashes "
          "from float32 rotations of the stored Q, K")
                        .with_backward("V, dO and dQ, dK, dV in the format; the pattern softmax's backward in "
                                       "autograd's form: the forward's stored P, dP = dO·Vᵀ and dS under both "
                                       "policies, s·dS under eager; D and the products' sums in float32"));
}

namespace {

/// One hashing round of non-causal Reformer: positions sorted by (bucket, position), and for each query the range
/// of sorted key positions it sees (its chunk and the previous one).
struct ReformerRound {
  std::vector<Index> key_order;  // sorted position → key
  std::vector<Index> key_pos;    // key → sorted position
  std::vector<Index> query_order;
  std::vector<Index> lo, hi;     // per query: sorted key positions [lo, hi)
};

/// Angular LSH (Andoni et al. 2015): h(x) = argmax [xW; −xW], one rotation W per round, shared by q and k.
template <typename T>
std::vector<Index> lsh(const ConstRef<T>& x, const MatrixR<T>& w, Index buckets) {
  std::vector<Index> h(static_cast<std::size_t>(x.rows()), 0);
  if (buckets == 1) return h;
  const MatrixR<T> r = x * w;
  for (Index i = 0; i < x.rows(); ++i) {
    Index best = 0;
    T bv = -std::numeric_limits<T>::infinity();
    for (Index b = 0; b < buckets / 2; ++b) {
      if (r(i, b) > bv) bv = r(i, b), best = b;
      if (-r(i, b) > bv) bv = -r(i, b), best = b + buckets / 2;
    }
    h[std::size_t(i)] = best;
  }
  return h;
}

/// Positions sorted by (bucket, position).
inline std::vector<Index> bucket_order(const std::vector<Index>& h) {
  std::vector<Index> o(h.size());
  std::iota(o.begin(), o.end(), Index(0));
  std::stable_sort(o.begin(), o.end(), [&](Index a, Index b) { return h[std::size_t(a)] < h[std::size_t(b)]; });
  return o;
}

/// Per round, the buckets of the keys and of the queries: one rotation per round, drawn from the seed in round
/// order (the causal and the non-causal forms hash alike).
template <typename T>
std::vector<std::pair<std::vector<Index>, std::vector<Index>>> hashes(const ConstRef<T>& q, const ConstRef<T>& k,
                                                                      const ReformerOptions& o) {
  const Index buckets = o.buckets, rounds = o.rounds;
  require(buckets == 1 || buckets % 2 == 0, "reformer: buckets must be 1 or even, got {}", buckets);
  Rng rng(o.seed);
  std::vector<std::pair<std::vector<Index>, std::vector<Index>>> out;
  for (Index round = 0; round < rounds; ++round) {
    const MatrixR<T> w = gaussian_matrix<T>(q.cols(), std::max<Index>(1, buckets / 2), rng);
    out.emplace_back(lsh<T>(k, w, buckets), lsh<T>(q, w, buckets));
  }
  return out;
}

template <typename T>
std::vector<ReformerRound> rounds(const ConstRef<T>& q, const ConstRef<T>& k, const ReformerOptions& o) {
  const Index nq = q.rows(), nk = k.rows(), chunk = o.chunk;
  const Index chunks = (nk + chunk - 1) / chunk;
  std::vector<ReformerRound> out;
  for (const auto& [hk, hq] : hashes<T>(q, k, o)) {
    ReformerRound& r = out.emplace_back();
    r.key_order = bucket_order(hk);
    r.query_order = bucket_order(hq);
    r.key_pos.resize(std::size_t(nk));
    for (Index t = 0; t < nk; ++t) r.key_pos[std::size_t(r.key_order[std::size_t(t)])] = t;
    r.lo.resize(std::size_t(nq));
    r.hi.resize(std::size_t(nq));
    for (Index t = 0; t < nq; ++t) {
      const Index i = r.query_order[std::size_t(t)];
      const Index c = std::min(chunks - 1, t * chunks / nq);  // the query's chunk, in sorted order
      r.lo[std::size_t(i)] = std::max<Index>(0, (c - 1) * chunk);
      r.hi[std::size_t(i)] = std::min(nk, (c + 1) * chunk);
    }
  }
  return out;
}

}  // namespace

template <typename T>
Pattern ReformerMethod<T>::pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const {
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  Pattern p(static_cast<std::size_t>(nq));
  for (auto& row : p) row.reserve(std::size_t(this->o_.rounds * 2 * this->o_.chunk + 1));  // no regrowth
  if (!opts.causal) {
    for (const ReformerRound& r : rounds<T>(q, k, this->o_))
      for (Index i = 0; i < nq; ++i)
        for (Index t = r.lo[std::size_t(i)]; t < r.hi[std::size_t(i)]; ++t)
          p[std::size_t(i)].push_back(r.key_order[std::size_t(t)]);
  } else {
    // Per bucket, the keys in position order; query i takes the 2·chunk latest ones with j ≤ c_i.
    const Index buckets = this->o_.buckets, chunk = this->o_.chunk;
    for (const auto& [hk, hq] : hashes<T>(q, k, this->o_)) {
      std::vector<std::vector<Index>> members(static_cast<std::size_t>(std::max<Index>(1, buckets)));
      for (Index j = 0; j < nk; ++j) members[std::size_t(hk[std::size_t(j)])].push_back(j);
      for (Index i = 0; i < nq; ++i) {
        const auto& m = members[std::size_t(hq[std::size_t(i)])];
        const auto end = std::upper_bound(m.begin(), m.end(), i + off);
        const auto begin = end - std::min<std::ptrdiff_t>(end - m.begin(), std::ptrdiff_t(2 * chunk));
        p[std::size_t(i)].insert(p[std::size_t(i)].end(), begin, end);
      }
    }
    for (Index i = 0; i < nq; ++i) p[std::size_t(i)].push_back(i + off);
  }
  for (Index i = 0; i < nq; ++i)  // a query whose chunks hold no key at all (n_k ≪ n_q): its aligned key
    if (p[std::size_t(i)].empty()) p[std::size_t(i)].push_back(std::min(nk - 1, i + off));
  return p;
}

/// Non-causal: the softmax over the union of the rounds' key sets as dense chunk products (Reformer §2-3): per
/// round and chunk, the chunk's queries against its two key chunks (gathered), one GEMM; a key already seen by the
/// query in an earlier round is skipped (the union counts it once, as the duplicate correction does); rounds merge
/// by an online softmax (running max, sum, weighted values per query). The same P̃ as the pattern.
template <typename T>
MatrixR<T> ReformerMethod<T>::do_output(const ConstRef<T>& v) const {
  const auto& opts = this->options();
  const Rounding rd_hook = this->rounding_hook();  // a no-op unless a reduced storage is emulated
  if (opts.causal) return PatternMethod<T>::do_output(v);  // the pattern softmax (emulated there)
  const MatrixR<T>& q = this->queries();
  const MatrixR<T>& k = this->keys();
  const Index nq = q.rows(), dv = v.cols();
  const std::vector<ReformerRound> rs = rounds<T>(q, k, this->o_);
  const T s = T(opts.scale), neg_inf = -std::numeric_limits<T>::infinity();
  VectorX<T> m = VectorX<T>::Constant(nq, neg_inf), l = VectorX<T>::Zero(nq);
  MatrixR<T> acc = MatrixR<T>::Zero(nq, dv);
  bool any_fallback = false;
  for (std::size_t r = 0; r < rs.size(); ++r) {
    const ReformerRound& rd = rs[r];
    // Runs of sorted queries that share a key range: one dense block each.
    std::vector<std::pair<Index, Index>> runs;
    for (Index t = 0; t < nq;) {
      const Index i = rd.query_order[std::size_t(t)];
      Index u = t + 1;
      while (u < nq && rd.lo[std::size_t(rd.query_order[std::size_t(u)])] == rd.lo[std::size_t(i)] &&
             rd.hi[std::size_t(rd.query_order[std::size_t(u)])] == rd.hi[std::size_t(i)])
        ++u;
      runs.emplace_back(t, u);
      t = u;
    }
#pragma omp parallel for schedule(dynamic)
    for (std::size_t run = 0; run < runs.size(); ++run) {
      const auto [t0, t1] = runs[run];
      const Index i0 = rd.query_order[std::size_t(t0)], lo = rd.lo[std::size_t(i0)], hi = rd.hi[std::size_t(i0)];
      const Index bi = t1 - t0, bj = hi - lo;
      if (bj <= 0) continue;
      MatrixR<T> qb(bi, q.cols()), kb(bj, k.cols()), vb(bj, dv);
      for (Index a = 0; a < bi; ++a) qb.row(a) = q.row(rd.query_order[std::size_t(t0 + a)]);
      for (Index b = 0; b < bj; ++b) {
        const Index j = rd.key_order[std::size_t(lo + b)];
        kb.row(b) = k.row(j);
        vb.row(b) = v.row(j);
      }
      MatrixR<T> logits = (qb * s) * kb.transpose();
      rd_hook(logits, Held::accumulator, "logits s·QKᵀ");
      for (Index a = 0; a < bi; ++a) {
        const Index i = rd.query_order[std::size_t(t0 + a)];
        for (Index b = 0; b < bj; ++b)  // seen in an earlier round: counted there
          for (std::size_t e = 0; e < r; ++e) {
            const Index pos = rs[e].key_pos[std::size_t(rd.key_order[std::size_t(lo + b)])];
            if (pos >= rs[e].lo[std::size_t(i)] && pos < rs[e].hi[std::size_t(i)]) {
              logits(a, b) = neg_inf;
              break;
            }
          }
        const T mx = logits.row(a).maxCoeff();
        if (mx == neg_inf) {
          logits.row(a).setZero();
          continue;
        }
        const T mnew = std::max(m(i), mx);
        const T old = m(i) == neg_inf ? T(0) : std::exp(m(i) - mnew);
        logits.row(a) = (logits.row(a).array() - mnew).exp();
        if (rd_hook.active()) rd_hook.span(logits.row(a).data(), std::size_t(bj), Held::tensor, "probabilities P");
        l(i) = l(i) * old + logits.row(a).sum();
        if (rd_hook.active()) rd_hook.span(&l(i), 1, Held::accumulator, "running sums ℓ");
        acc.row(i) *= old;
        m(i) = mnew;
      }
      const MatrixR<T> contrib = logits * vb;
      for (Index a = 0; a < bi; ++a) {
        const Index i = rd.query_order[std::size_t(t0 + a)];
        acc.row(i) += contrib.row(a);
        if (rd_hook.active())
          rd_hook.span(acc.row(i).data(), std::size_t(dv), Held::accumulator, "running accumulator");
      }
    }
  }
  for (Index i = 0; i < nq; ++i) {
    // A row that saw no key in any chunk (n_k ≪ n_q) takes the pattern's aligned-key fallback; under an emulated
    // storage a running sum that overflowed or became NaN is divided through (the failure is the finding).
    if (m(i) == neg_inf) any_fallback = true;
    else if (l(i) > 0 || rd_hook.active()) acc.row(i) /= l(i);
    else any_fallback = true;
  }
  if (any_fallback) return PatternMethod<T>::do_output(v);  // natively the operator's P̃·V, emulated when rounding
  return acc;
}

template class ReformerMethod<float>;
template class ReformerMethod<double>;

}  // namespace attnlab
