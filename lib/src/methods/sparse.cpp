// `sparse` — fixed sparse patterns, softmax over each row's union of parts only:
//   the band |j − c_i| ≤ W around the aligned position c_i = i + (n_k − n_q) (Beltagy et al. 2020, Longformer §3.1,
//   sliding window); strided keys with (c_i − j) mod S = 0 (Child et al. 2019, "Generating Long Sequences with Sparse
//   Transformers", strided attention); G global tokens that attend to and are attended by all (Beltagy et al. 2020
//   §3.1; Zaheer et al. 2020, BigBird §2); R random keys per query (Zaheer et al. 2020, BigBird §2). Causal restricts
//   every part to j ≤ c_i.
#include "attnlab/methods/sparse.hpp"

#include "attnlab/core/random.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {

MethodDescriptor SparseOptions::registry_entry() {
  return describe<SparseMethod, SparseOptions>(
      "fixed sparse patterns: band + strided + global tokens + random keys",
      "Child et al. 2019 (strided); Zaheer et al. 2020 (BigBird: window, global, random)", Causal::yes())
      .with_backward(Backward::yes("random keys held fixed: softmax over each query's pattern, O(nnz·d)"))
      .with_storage(StorageEmulation::both(
          "causal too; the pattern softmax: both policies store Q, K, V, each query's probabilities on its pattern "
          "and O; eager also its logits qᵀk and s·qᵀk; careful keeps those in float32; the softmax's max, "
          "exponentials and sums and the product's sums in float32")
                        .with_backward("V, dO and dQ, dK, dV in the format; the pattern softmax's backward in "
                                       "autograd's form: the forward's stored P, dP = dO·Vᵀ and dS under both "
                                       "policies, s·dS under eager; D and the products' sums in float32"));
}

namespace {

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

}  // namespace

template <typename T>
MatrixR<T> SparseMethod<T>::do_output(const ConstRef<T>& v) const {
  const MatrixR<T>& q = this->queries();
  const MatrixR<T>& k = this->keys();
  // With more queries than keys (non-causal), early queries' aligned positions fall before the first key: the
  // pattern path handles (and refuses) those; the blocked kernel assumes c_i ≥ 0.
  // Under an emulated reduced storage: the pattern softmax with its rounding (PatternMethod::do_output).
  if (q.rows() > k.rows() || this->rounding_hook().active()) return PatternMethod<T>::do_output(v);
  const SparseOptions& o = this->o_;
  return sparse_output<T>(q, k, v, this->options(), o.window, o.stride, o.globals, o.random, o.seed);
}

template <typename T>
Pattern SparseMethod<T>::pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const {
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  const SparseOptions& o = this->o_;
  const Index w = o.window, stride = o.stride, g = o.globals, r = o.random;
  Pattern p(static_cast<std::size_t>(nq));
  if (w >= 0) add_band(p, nq, nk, w, opts.causal);
  const auto last_of = [&](Index i) { return opts.causal ? i + off : nk - 1; };
  const std::vector<std::vector<Index>> rand = random_keys(nq, r, o.seed, [&](Index i) { return last_of(i) + 1; });
  for (Index i = 0; i < nq; ++i) {
    auto& row = p[std::size_t(i)];
    const Index c = i + off, last = last_of(i);  // the last key query i may see
    row.push_back(std::min(c, nk - 1));           // every query sees its own position
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

template class SparseMethod<float>;
template class SparseMethod<double>;

}  // namespace attnlab
