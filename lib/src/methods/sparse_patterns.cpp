// Sparse attention patterns (the related work of seed 003): softmax over each row's pattern only.
//   local:window=W — keys with |j − c_i| ≤ W around the aligned position c_i = i + (n_k − n_q) (causal:
//                    c_i − W ≤ j ≤ c_i); O(n·W·d) (Beltagy et al. 2020, sliding window).
//   sparse:window=W,stride=S,globals=G,random=R — a union of fixed patterns: the band; strided keys with
//                    (c_i − j) mod S = 0 (Child et al. 2019, strided); G global tokens that attend to and are
//                    attended by all (Zaheer et al. 2020); R random keys per query (BigBird). Causal restricts
//                    every part to j ≤ c_i.
//   reformer:buckets=B,rounds=R,chunk=L — angular LSH (Kitaev et al. 2020): h(x) = argmax[xW; −xW] with a random
//                    rotation W (d×B/2), the same hash for queries and keys; queries and keys sorted by (bucket,
//                    position), cut into chunks of L keys (queries into as many chunks), each query attending to
//                    its chunk and the previous one. Rounds are combined by their log-sum-exp weights with the
//                    duplicate correction (Reformer §3 "multi-round"), which is exactly the softmax over the union
//                    of the rounds' key sets: that union is the pattern here.
//                    Causal: sorting all positions and cutting chunks would let future tokens' hashes decide which
//                    past keys a query sees (the sorted order of the past shifts when a future hash changes) — a
//                    leak. With a mask, query i instead attends to the 2·chunk most recent keys j ≤ c_i of its own
//                    bucket (what its sorted chunk and the previous one hold, restricted to the past), and to c_i.
#include "attnlab/error.hpp"
#include "attnlab/methods/local.hpp"
#include "attnlab/methods/reformer.hpp"
#include "attnlab/methods/sparse.hpp"
#include "attnlab/random.hpp"
#include "pattern_method.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

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

namespace {

/// The band around the aligned position c_i = i + off, cut at the future when causal.
void add_band(Pattern& p, Index nq, Index nk, Index w, bool causal) {
  const Index off = nk - nq;
  for (Index i = 0; i < nq; ++i) {
    const Index c = i + off;
    const Index lo = std::max<Index>(0, c - w), hi = causal ? std::min(c, nk - 1) : std::min(c + w, nk - 1);
    for (Index j = lo; j <= hi; ++j) p[std::size_t(i)].push_back(j);
  }
}

/// Sliding-window attention as dense blocks: a block of queries [i0, i0 + B) against the keys its bands span,
/// [c_i0 − W, c_{i0+B−1} + W] (causal: up to c_{i0+B−1}): one GEMM for the logits, the band mask, a stable row
/// softmax, one GEMM with V. O(n·(B + 2W)·d) work, O(B·(B + 2W)) memory per thread; the same P̃ as the pattern.
template <typename T>
MatrixR<T> local_output(const MatrixR<T>& q, const MatrixR<T>& k, const ConstRef<T>& v, const AttentionOptions& opts,
                        Index w) {
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq, dv = v.cols();
  const Index block = 64, blocks = (nq + block - 1) / block;
  const T s = T(opts.scale);
  MatrixR<T> out(nq, dv);
#pragma omp parallel
  {
    MatrixR<T> logits;
#pragma omp for schedule(static)
    for (Index b = 0; b < blocks; ++b) {
      const Index i0 = b * block, bi = std::min(block, nq - i0);
      const Index lo = std::max<Index>(0, i0 + off - w);
      const Index hi = opts.causal ? std::min(nk - 1, i0 + bi - 1 + off) : std::min(nk - 1, i0 + bi - 1 + off + w);
      const Index bj = hi - lo + 1;
      logits.noalias() = (q.middleRows(i0, bi) * s) * k.middleRows(lo, bj).transpose();
      for (Index r = 0; r < bi; ++r) {
        const Index c = i0 + r + off;
        const Index first = std::max<Index>(0, c - w) - lo;
        const Index last = (opts.causal ? std::min(c, nk - 1) : std::min(c + w, nk - 1)) - lo;
        auto row = logits.row(r);
        const T mx = row.segment(first, last - first + 1).maxCoeff();
        row.head(first).setZero();
        row.segment(first, last - first + 1) = (row.segment(first, last - first + 1).array() - mx).exp();
        row.tail(bj - last - 1).setZero();
        row /= row.sum();
      }
      out.middleRows(i0, bi).noalias() = logits * v.middleRows(lo, bj);
    }
  }
  return out;
}

template <typename T>
class LocalMethod final : public PatternMethod<T> {
 public:
  using PatternMethod<T>::PatternMethod;
  /// The spec's values, typed (attnlab/methods/local.hpp).
  LocalOptions typed() const { return LocalOptions::from(this->params()); }

 protected:
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    return local_output<T>(this->queries(), this->keys(), v, this->options(), typed().window);
  }
  Pattern pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const override {
    Pattern p(static_cast<std::size_t>(q.rows()));
    const Index w = typed().window;
    add_band(p, q.rows(), k.rows(), w, opts.causal);
    // Without a mask and with n_k > n_q + W the first queries' bands can miss every key: keep c_i at least.
    for (Index i = 0; i < q.rows(); ++i)
      if (p[std::size_t(i)].empty()) p[std::size_t(i)].push_back(std::min(k.rows() - 1, i + k.rows() - q.rows()));
    return p;
  }
};

/// Per query: the running max m, sum l = Σ exp(s_ij − m) and accumulator Σ exp(s_ij − m)·v_j of the keys seen so
/// far — the online softmax state, so that the parts of a pattern can be computed apart and merged.
template <typename T>
struct SoftmaxState {
  VectorX<T> m, l;
  MatrixR<T> acc;
  /// Merges a part's state (m2, l2, acc2) into row i (m2 = −∞: the part had no key for this query).
  template <typename Row>
  void merge(Index i, T m2, T l2, const Row& acc2) {
    if (m2 == -std::numeric_limits<T>::infinity()) return;
    const T mn = std::max(m(i), m2), a = std::exp(m(i) - mn), b = std::exp(m2 - mn);
    l(i) = a * l(i) + b * l2;
    acc.row(i) = a * acc.row(i) + b * acc2;
    m(i) = mn;
  }
};

/// The fixed sparse pattern's output without building P̃: the union of the parts — the band (or the query's own
/// position), the strided keys, the global keys, the random keys — each computed as dense products where the
/// structure allows, each key counted once (a part skips the keys of the parts before it), merged per query by
/// the online softmax; the global queries' rows are exact softmax rows. The same P̃ as `pattern` below, so the
/// same output up to rounding (the conformance test checks it against the materialized matrix).
///   band: blocks of 64 queries against the keys their bands span (one GEMM each), as local attention;
///   strided: queries at positions c ≡ ρ (mod S) share the strided keys j ≡ ρ (mod S): per residue ρ one GEMM of
///            the (n/S) queries against the (n/S) keys (a strided view, no copy), O(n²d/S) in all;
///   globals and random keys: a few dot products per query.
/// BigBird's random keys: for each query in turn, min(R, pool_i) distinct keys of [0, pool_i) by Floyd's algorithm,
/// all from one generator — so the pattern and the blocked kernel draw the same keys.
template <typename PoolOf>
std::vector<std::vector<Index>> random_keys(Index nq, Index r, std::uint64_t seed, PoolOf pool_of) {
  std::vector<std::vector<Index>> keys(static_cast<std::size_t>(nq));
  Rng rng(seed);
  for (Index i = 0; i < nq; ++i) {
    const Index pool = pool_of(i), take = std::min(r, pool);
    auto& chosen = keys[std::size_t(i)];
    for (Index t = pool - take; t < pool; ++t) {
      const Index x = Index(rng.below(std::uint64_t(t + 1)));
      chosen.push_back(std::find(chosen.begin(), chosen.end(), x) == chosen.end() ? x : t);
    }
  }
  return keys;
}

/// ⌊a / b⌋ for b > 0 (C++ division truncates towards zero).
inline Index floor_div(Index a, Index b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

template <typename T>
MatrixR<T> sparse_output(const MatrixR<T>& q, const MatrixR<T>& k, const ConstRef<T>& v, const AttentionOptions& opts,
                         Index w, Index stride, Index g, Index r, std::uint64_t seed) {
  using Strided = Eigen::Map<const MatrixR<T>, 0, Eigen::OuterStride<>>;
  using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq, d = q.cols(), dv = v.cols();
  const T s = T(opts.scale), ninf = -std::numeric_limits<T>::infinity();
  const bool causal = opts.causal;
  const auto last = [&](Index i) { return causal ? i + off : nk - 1; };
  // The dense part of query i: its band, or only its own position c_i when there is no band (window −1).
  const auto dlo = [&](Index i) { return w >= 0 ? std::max<Index>(0, i + off - w) : i + off; };
  const auto dhi = [&](Index i) { return w >= 0 ? (causal ? i + off : std::min(i + off + w, nk - 1)) : i + off; };
  const auto in_dense = [&](Index i, Index j) { return j >= dlo(i) && j <= dhi(i); };
  const auto in_strided = [&](Index i, Index j) { return stride > 0 && j <= last(i) && (i + off - j) % stride == 0; };
  const auto in_global = [&](Index i, Index j) { return j < std::min(g, last(i) + 1); };

  SoftmaxState<T> st;
  st.m.resize(nq);
  st.l.resize(nq);
  st.acc.resize(nq, dv);
  // 1. The dense part, by blocks of queries (every query has at least its own position: m is finite after it).
  const Index block = 64, blocks = (nq + block - 1) / block;
#pragma omp parallel
  {
    MatrixR<T> e;
#pragma omp for schedule(static)
    for (Index b = 0; b < blocks; ++b) {
      const Index i0 = b * block, bi = std::min(block, nq - i0);
      const Index lo = dlo(i0), bj = dhi(i0 + bi - 1) - lo + 1;
      e.noalias() = (q.middleRows(i0, bi) * s) * k.middleRows(lo, bj).transpose();
      for (Index t = 0; t < bi; ++t) {
        const Index first = dlo(i0 + t) - lo, len = dhi(i0 + t) - dlo(i0 + t) + 1;
        auto row = e.row(t);
        const T mx = row.segment(first, len).maxCoeff();
        row.head(first).setZero();
        row.segment(first, len) = (row.segment(first, len).array() - mx).exp();
        row.tail(bj - first - len).setZero();
        st.m(i0 + t) = mx;
        st.l(i0 + t) = row.sum();
      }
      st.acc.middleRows(i0, bi).noalias() = e * v.middleRows(lo, bj);
    }
  }
  // 2. Strided keys beyond the dense part, one residue class at a time (each query lies in exactly one class).
  if (stride > 0) {
#pragma omp parallel
    {
      MatrixR<T> e, part;
#pragma omp for schedule(dynamic)
      for (Index rho = 0; rho < stride; ++rho) {
        const Index ifirst = (((rho - off) % stride) + stride) % stride;
        if (ifirst >= nq || rho >= nk) continue;
        const Index nqr = (nq - ifirst + stride - 1) / stride, nkr = (nk - rho + stride - 1) / stride;
        const Strided qr(q.data() + ifirst * d, nqr, d, Eigen::OuterStride<>(stride * d));
        const Strided kr(k.data() + rho * d, nkr, d, Eigen::OuterStride<>(stride * d));
        e.noalias() = (qr * s) * kr.transpose();
        VectorX<T> mr(nqr), lr(nqr);
        for (Index u = 0; u < nqr; ++u) {
          const Index i = ifirst + u * stride;
          // Keys t of the class seen by query i: t·S + ρ ≤ last(i), minus those in its dense part [xlo, xhi).
          const Index tend = std::clamp<Index>(floor_div(last(i) - rho, stride) + 1, 0, nkr);
          const Index xlo = std::max<Index>(0, floor_div(dlo(i) - rho + stride - 1, stride));
          const Index xhi = floor_div(dhi(i) - rho, stride) + 1;
          const Index a_end = xhi > xlo ? std::min(xlo, tend) : tend;  // seen: [0, a_end) and [b_beg, tend)
          const Index b_beg = xhi > xlo ? std::clamp(xhi, a_end, tend) : tend;
          auto row = e.row(u);
          T mx = ninf;
          if (a_end > 0) mx = row.head(a_end).maxCoeff();
          if (tend > b_beg) mx = std::max(mx, row.segment(b_beg, tend - b_beg).maxCoeff());
          mr(u) = mx;
          if (mx == ninf) {
            row.setZero();
            lr(u) = 0;
            continue;
          }
          row.head(tend) = (row.head(tend).array() - mx).exp();
          row.tail(nkr - tend).setZero();
          row.segment(a_end, b_beg - a_end).setZero();
          lr(u) = row.sum();
        }
        const Strided vr(v.data() + rho * dv, nkr, dv, Eigen::OuterStride<>(stride * dv));
        part.noalias() = e * vr;
        for (Index u = 0; u < nqr; ++u) st.merge(ifirst + u * stride, mr(u), lr(u), part.row(u));
      }
    }
  }
  // 3, 4. Global keys and random keys not in an earlier part: a few dot products per query. The random keys are
  // drawn in the pattern's order (one generator over the queries in turn), so they are the pattern's keys.
  const std::vector<std::vector<Index>> rand = random_keys(nq, r, seed, [&](Index i) { return last(i) + 1; });
#pragma omp parallel
  {
    std::vector<Index> extra;
    VectorX<T> logit;
#pragma omp for schedule(static)
    for (Index i = 0; i < nq; ++i) {
      extra.clear();
      for (Index j = 0; j < std::min(g, last(i) + 1); ++j)
        if (!in_dense(i, j) && !in_strided(i, j)) extra.push_back(j);
      for (Index j : rand[std::size_t(i)])
        if (!in_dense(i, j) && !in_strided(i, j) && !in_global(i, j)) extra.push_back(j);
      if (extra.empty()) continue;
      logit.resize(Index(extra.size()));
      for (std::size_t t = 0; t < extra.size(); ++t) logit(Index(t)) = s * q.row(i).dot(k.row(extra[t]));
      const T mx = logit.maxCoeff();
      RowVec acc = RowVec::Zero(dv);
      T l = 0;
      for (std::size_t t = 0; t < extra.size(); ++t) {
        const T p = std::exp(logit(Index(t)) - mx);
        l += p;
        acc += p * v.row(extra[t]);
      }
      st.merge(i, mx, l, acc);
    }
  }
  MatrixR<T> out = st.acc.array().colwise() / st.l.array();
  // The global queries see every visible key: exact softmax rows.
  for (Index i = 0; i < std::min(g, nq); ++i) {
    const Index n_vis = last(i) + 1;
    RowVec lg = (q.row(i) * s) * k.topRows(n_vis).transpose();
    lg = (lg.array() - lg.maxCoeff()).exp();
    out.row(i) = (lg / lg.sum()) * v.topRows(n_vis);
  }
  return out;
}

template <typename T>
class SparseMethod final : public PatternMethod<T> {
 public:
  using PatternMethod<T>::PatternMethod;
  /// The spec's values, typed (attnlab/methods/sparse.hpp).
  SparseOptions typed() const { return SparseOptions::from(this->params()); }

 protected:
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    const MatrixR<T>& q = this->queries();
    const MatrixR<T>& k = this->keys();
    // With more queries than keys (non-causal), early queries' aligned positions fall before the first key: the
    // pattern path handles (and refuses) those; the blocked kernel assumes c_i ≥ 0.
    if (q.rows() > k.rows()) return PatternMethod<T>::do_output(v);
    const SparseOptions o = typed();
    return sparse_output<T>(q, k, v, this->options(), o.window, o.stride, o.globals, o.random, o.seed);
  }
  Pattern pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const override {
    const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
    const SparseOptions o = typed();
    const Index w = o.window, stride = o.stride, g = o.globals, r = o.random;
    Pattern p(static_cast<std::size_t>(nq));
    if (w >= 0) add_band(p, nq, nk, w, opts.causal);
    const auto last_of = [&](Index i) { return opts.causal ? i + off : nk - 1; };
    const std::vector<std::vector<Index>> rand =
        random_keys(nq, r, o.seed, [&](Index i) { return last_of(i) + 1; });
    for (Index i = 0; i < nq; ++i) {
      auto& row = p[std::size_t(i)];
      const Index c = i + off, last = last_of(i);  // the last key query i may see
      row.push_back(std::min(c, nk - 1));                        // every query sees its own position
      if (stride > 0)
        for (Index j = c % stride; j <= last; j += stride) row.push_back(j);
      // Global tokens: the first G keys are seen by everyone; the first G queries see every visible key.
      for (Index j = 0; j < std::min(g, last + 1); ++j) row.push_back(j);
      if (i < g)
        for (Index j = 0; j <= last; ++j) row.push_back(j);
      // R random keys among the visible ones, without replacement.
      row.insert(row.end(), rand[std::size_t(i)].begin(), rand[std::size_t(i)].end());
    }
    return p;
  }
};

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

template <typename T>
class ReformerMethod final : public PatternMethod<T> {
 public:
  using PatternMethod<T>::PatternMethod;
  /// The spec's values, typed (attnlab/methods/reformer.hpp).
  ReformerOptions typed() const { return ReformerOptions::from(this->params()); }

 protected:
  Pattern pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const override {
    const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
    Pattern p(static_cast<std::size_t>(nq));
    if (!opts.causal) {
      for (const ReformerRound& r : rounds(q, k))
        for (Index i = 0; i < nq; ++i)
          for (Index t = r.lo[std::size_t(i)]; t < r.hi[std::size_t(i)]; ++t)
            p[std::size_t(i)].push_back(r.key_order[std::size_t(t)]);
    } else {
      // Per bucket, the keys in position order; query i takes the 2·chunk latest ones with j ≤ c_i.
      const Index buckets = typed().buckets, chunk = typed().chunk;
      for (const auto& [hk, hq] : hashes(q, k)) {
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
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    const auto& opts = this->options();
    if (opts.causal) return this->do_op().apply(v);
    const MatrixR<T>& q = this->queries();
    const MatrixR<T>& k = this->keys();
    const Index nq = q.rows(), dv = v.cols();
    const std::vector<ReformerRound> rs = rounds(q, k);
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
          l(i) = l(i) * old + logits.row(a).sum();
          acc.row(i) *= old;
          m(i) = mnew;
        }
        const MatrixR<T> contrib = logits * vb;
        for (Index a = 0; a < bi; ++a) acc.row(rd.query_order[std::size_t(t0 + a)]) += contrib.row(a);
      }
    }
    for (Index i = 0; i < nq; ++i) {
      if (l(i) > 0) acc.row(i) /= l(i);
      else any_fallback = true;  // no key in any chunk (n_k ≪ n_q): the pattern's aligned-key fallback
    }
    if (any_fallback) return this->do_op().apply(v);
    return acc;
  }

 private:
  /// Per round, the buckets of the keys and of the queries: one rotation per round, drawn from the seed in round
  /// order (the causal and the non-causal forms hash alike).
  std::vector<std::pair<std::vector<Index>, std::vector<Index>>> hashes(const ConstRef<T>& q,
                                                                        const ConstRef<T>& k) const {
    const Index buckets = typed().buckets, rounds = typed().rounds;
    require(buckets == 1 || buckets % 2 == 0, fmt::format("reformer: buckets must be 1 or even, got {}", buckets));
    Rng rng(typed().seed);
    std::vector<std::pair<std::vector<Index>, std::vector<Index>>> out;
    for (Index round = 0; round < rounds; ++round) {
      const MatrixR<T> w = gaussian_matrix<T>(q.cols(), std::max<Index>(1, buckets / 2), rng);
      out.emplace_back(lsh<T>(k, w, buckets), lsh<T>(q, w, buckets));
    }
    return out;
  }

  std::vector<ReformerRound> rounds(const ConstRef<T>& q, const ConstRef<T>& k) const {
    const Index nq = q.rows(), nk = k.rows(), chunk = typed().chunk;
    const Index chunks = (nk + chunk - 1) / chunk;
    std::vector<ReformerRound> out;
    for (const auto& [hk, hq] : hashes(q, k)) {
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
};

}  // namespace

MethodDescriptor LocalOptions::descriptor() {
  return describe<LocalMethod>(kName, "sliding-window attention, |j − i| ≤ W",
                               "Beltagy et al. 2020 (Longformer) §3.1, sliding window", Causal::yes(),
                               {ParamSpec::integer("window", 64, 0, 1 << 24, "half-width W of the band").budget()});
}

MethodDescriptor SparseOptions::descriptor() {
  return describe<SparseMethod>(
      kName, "fixed sparse patterns: band + strided + global tokens + random keys",
      "Child et al. 2019 (strided); Zaheer et al. 2020 (BigBird: window, global, random)", Causal::yes(),
      {ParamSpec::integer("window", 16, -1, 1 << 24, "half-width of the band (−1: no band)").budget(),
       ParamSpec::integer("stride", 32, 0, 1 << 24, "strided keys (c_i − j) mod S = 0 (0: none)"),
       ParamSpec::integer("globals", 2, 0, 1 << 24, "number of global tokens"),
       ParamSpec::integer("random", 8, 0, 1 << 24, "random keys per query"), ParamSpec::seed()});
}

MethodDescriptor ReformerOptions::descriptor() {
  return describe<ReformerMethod>(
      kName, "Reformer LSH attention: angular hashing, sorted chunks, multi-round union",
      "Kitaev et al. 2020 (Reformer) §2: angular LSH, sorted chunks, multi-round",
      Causal::yes("the most recent same-bucket keys"),
      {ParamSpec::integer("buckets", 8, 1, 1 << 16, "number of hash buckets (1 or even)"),
       ParamSpec::integer("rounds", 2, 1, 64, "hashing rounds"),
       ParamSpec::integer("chunk", 64, 1, 1 << 24, "keys per chunk (each query sees its chunk and the previous)")
           .budget(),
       ParamSpec::seed()});
}

ATTNLAB_TYPED_METHOD_DEFINE(Local)

ATTNLAB_TYPED_METHOD_DEFINE(Sparse)

ATTNLAB_TYPED_METHOD_DEFINE(Reformer)

}  // namespace attnlab
