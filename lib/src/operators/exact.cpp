// Exact softmax attention kernels. One tiler forms scale·Q_I K_Jᵀ for a query tile I and a key tile J with
// the causal mask applied; the materialized, streaming, log-sum-exp and operator forms all use it, so they
// mask and scale identically. Parallel over tiles of the output (OpenMP).
#include "attnlab/operators/exact.hpp"

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "detail/exact_tiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attnlab {
using detail::checked_tile;
using detail::Tiler;
using detail::validate;

namespace {
/// exact_matrix's blocks of rows (many queries) or of columns (few queries, many keys) for its parallel logits.
constexpr Index kLogitRows = 240, kLogitCols = 960;
}  // namespace

template <typename T>
MatrixR<T> exact_matrix(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                        const Rounding& rounding) {
  validate(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  check_memory(matrix_bytes(q.rows(), k.rows(), sizeof(T)),
               "the {}×{} {} attention matrix", q.rows(), k.rows(), dtype_name(dtype_of<T>()));
  Tiler<T> t(q, k, opts);
  t.rounding = rounding;
  MatrixR<T> p;
  const Index nq = q.rows(), nk = k.rows();
  if (nq > kLogitRows) {
    // The logits by blocks of rows in parallel (one GEMM call is one thread). P is row-major, so Eigen forms Pᵀ = K·Qᵀ:
    // P's rows are the product's columns, taken 4 at a time by its register tile; blocks of 240 rows keep every entry
    // in the same kernel and depth order as in the whole product — the same bits
    // (ExactTest.MaterializedLogitsAreOneProductsBits).
    p.resize(nq, nk);
    const Index blocks = (nq + kLogitRows - 1) / kLogitRows;
#pragma omp parallel for schedule(dynamic)
    for (Index b = 0; b < blocks; ++b) {
      const Index i0 = b * kLogitRows, bi = std::min(kLogitRows, nq - i0);
      auto blk = p.middleRows(i0, bi);
      blk.noalias() = q.middleRows(i0, bi) * k.transpose();
      rounding.span(blk.data(), std::size_t(bi * nk), Held::accumulator, "logits QKᵀ");
      blk *= t.scale;
      rounding.span(blk.data(), std::size_t(bi * nk), Held::accumulator, "logits s·QKᵀ");
    }
  } else if (nk > 2 * kLogitCols) {
    // Few rows (Nyström's landmarks against every key): by blocks of columns — the product's rows, whose register
    // tile is 24 or 12 (AVX2, float or double) and 48 or 24 (AVX-512): 960 is a multiple of each.
    p.resize(nq, nk);
    const Index blocks = (nk + kLogitCols - 1) / kLogitCols;
#pragma omp parallel for schedule(dynamic)
    for (Index b = 0; b < blocks; ++b) {
      const Index j0 = b * kLogitCols, bj = std::min(kLogitCols, nk - j0);
      p.middleCols(j0, bj).noalias() = q * k.middleRows(j0, bj).transpose();
    }
    if (rounding.active()) {
      rounding(p, Held::accumulator, "logits QKᵀ");
      p *= t.scale;
      rounding(p, Held::accumulator, "logits s·QKᵀ");
    } else {
      p *= t.scale;
    }
  } else {
    t.logits(0, nq, 0, nk, p);
  }
  // Row softmax with the max subtracted first: exp never overflows, and the row's max becomes exp(0) = 1,
  // so the sum is ≥ 1 and never underflows (stable log-sum-exp).
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < p.rows(); ++i) {
    t.exp_row(p, i, i, 0, t.row_max(p, i, i, 0));
    p.row(i) /= p.row(i).sum();
  }
  rounding(p, Held::tensor, "probabilities P");
  return p;
}

namespace {

/// A thread's buffers for the online softmax over the key tiles of one query tile (Milakov & Gimelshein 2018):
/// the logit block s, each row's running max m and running sum l = Σ exp(s_ij − m), and (for the output) the
/// unnormalized accumulator Σ exp(s_ij − m)·v_j.
template <typename T>
struct OnlineRows {
  MatrixR<T> s, acc;
  VectorX<T> m, l;
  OnlineRows(Index tile, Index dv) : acc(tile, dv), m(tile), l(tile) {}
  void reset(Index bi) {
    m.head(bi).setConstant(-std::numeric_limits<T>::infinity());
    l.head(bi).setZero();
    acc.topRows(bi).setZero();
  }
};

/// exact_output's split-KV path (its header): the n_q ≤ tile queries against the keys in groups of kSplitKeys, each
/// group's online softmax over its key tiles (its own m, ℓ and accumulator per row; the logit tile a buffer of the
/// thread's) in parallel, then merged in group order: m = max_g m_g, ℓ = Σ_g e^{m_g − m} ℓ_g, acc = Σ_g e^{m_g − m}
/// acc_g. A group the row sees none of is skipped (key 0 is in group 0, so m is finite); one whose logits overflowed
/// (a non-finite m or ℓ) makes the row NaN, as the tiled path's would be — never a finite row without that group.
template <typename T>
void split_keys_output(const Tiler<T>& t, const ConstRef<T>& v, Index tile, MatrixR<T>& out, VectorX<T>* row_lse) {
  const Index nq = t.q.rows(), dv = v.cols(), kend = t.key_end(0, nq);
  const Index groups = (kend + kSplitKeys - 1) / kSplitKeys;
  struct Part {
    MatrixR<T> acc;
    VectorX<T> m, l;
  };
  std::vector<Part> part(static_cast<std::size_t>(groups));
#pragma omp parallel
  {
    MatrixR<T> s;  // the thread's logit tile
#pragma omp for schedule(dynamic)
    for (Index g = 0; g < groups; ++g) {
      if (cancel_requested()) continue;
      Part& w = part[std::size_t(g)];
      w.acc.setZero(nq, dv);
      w.m.setConstant(nq, -std::numeric_limits<T>::infinity());
      w.l.setZero(nq);
      const Index g0 = g * kSplitKeys, gend = std::min(kend, g0 + kSplitKeys);
      for (Index j0 = g0; j0 < gend; j0 += tile) {
        const Index bj = std::min(tile, gend - j0);
        t.logits(0, nq, j0, bj, s);
        for (Index r = 0; r < nq; ++r) {
          if (t.visible(r, j0, bj) == 0) {  // masked for this row (causal): nothing to add
            s.row(r).setZero();
            continue;
          }
          const T mnew = std::max(w.m(r), t.row_max(s, r, r, j0));
          const T alpha = std::exp(w.m(r) - mnew);
          t.exp_row(s, r, r, j0, mnew);
          w.l(r) = alpha * w.l(r) + s.row(r).sum();
          w.acc.row(r) *= alpha;
          w.m(r) = mnew;
        }
        w.acc.noalias() += s * v.middleRows(j0, bj);
      }
    }
  }
  throw_if_cancelled();
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  for (Index r = 0; r < nq; ++r) {
    T m = -std::numeric_limits<T>::infinity();
    bool finite = true;
    for (Index g = 0; g < groups; ++g) {
      if (t.visible(r, g * kSplitKeys, std::min(kSplitKeys, kend - g * kSplitKeys)) == 0) continue;
      const Part& w = part[std::size_t(g)];
      finite = finite && std::isfinite(w.m(r)) && std::isfinite(w.l(r));
      m = std::max(m, w.m(r));
    }
    if (!finite) {
      out.row(r).setConstant(nan);
      if (row_lse) (*row_lse)(r) = nan;
      continue;
    }
    T l = 0;
    out.row(r).setZero();
    for (Index g = 0; g < groups; ++g) {
      if (t.visible(r, g * kSplitKeys, std::min(kSplitKeys, kend - g * kSplitKeys)) == 0) continue;
      const Part& w = part[std::size_t(g)];
      const T a = std::exp(w.m(r) - m);
      l += a * w.l(r);
      out.row(r) += a * w.acc.row(r);
    }
    out.row(r) /= l;
    if (row_lse) (*row_lse)(r) = m + std::log(l);
  }
}

}  // namespace

template <typename T>
MatrixR<T> exact_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                        const AttentionOptions& opts, Index tile, const QueryLayout& layout, VectorX<T>* row_lse,
                        const Rounding& rounding) {
  validate(q.rows(), q.cols(), k.rows(), k.cols(), opts, layout);
  validate_v(k.rows(), v.rows());
  checked_tile(tile);
  Tiler<T> t(q, k, opts, layout);
  t.rounding = rounding;
  const Index nq = q.rows(), dv = v.cols();
  MatrixR<T> out(nq, dv);
  if (row_lse) row_lse->resize(nq);
  if (!rounding.active() && nq >= 1 && nq <= tile && t.key_end(0, nq) >= 2 * kSplitKeys) {
    split_keys_output<T>(t, v, tile, out, row_lse);
    return out;
  }
  t.for_query_tiles(tile, [&] { return OnlineRows<T>(tile, dv); }, [&](OnlineRows<T>& w, Index i0, Index bi) {
    w.reset(bi);
    t.for_key_tiles(i0, bi, tile, w.s, [&](MatrixR<T>& s, Index j0, Index bj) {
      // Online softmax: keep the running max m_i and the running sum l_i = Σ exp(s_ij − m_i); when the max
      // grows, rescale l and the accumulator by exp(m_old − m_new). Key 0 is in the first tile of every
      // row, so m_i is finite from the first tile on.
      for (Index r = 0; r < bi; ++r) {
        const T mnew = std::max(w.m(r), t.row_max(s, r, i0 + r, j0));
        const T alpha = std::exp(w.m(r) - mnew);
        t.exp_row(s, r, i0 + r, j0, mnew);
        if (rounding.active()) rounding.span(s.row(r).data(), std::size_t(bj), Held::tensor, "probabilities P");
        w.l(r) = alpha * w.l(r) + s.row(r).sum();
        if (rounding.active()) rounding.span(&w.l(r), 1, Held::accumulator, "running sums ℓ");
        w.acc.row(r) *= alpha;
        w.m(r) = mnew;
      }
      w.acc.topRows(bi).noalias() += s * v.middleRows(j0, bj);
      if (rounding.active())
        rounding.span(w.acc.data(), std::size_t(bi * w.acc.cols()), Held::accumulator, "running accumulator");
    });
    out.middleRows(i0, bi) = w.acc.topRows(bi).array().colwise() / w.l.head(bi).array();
    if (row_lse) row_lse->segment(i0, bi) = w.m.head(bi).array() + w.l.head(bi).array().log();
  });
  return out;
}

template <typename T>
VectorX<T> exact_row_lse(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts, Index tile,
                         const QueryLayout& layout) {
  validate(q.rows(), q.cols(), k.rows(), k.cols(), opts, layout);
  checked_tile(tile);
  const Tiler<T> t(q, k, opts, layout);
  VectorX<T> lse(q.rows());
  // The output's online softmax without the accumulator; the sum reads only the visible keys (no exp is written).
  t.for_query_tiles(tile, [&] { return OnlineRows<T>(tile, 0); }, [&](OnlineRows<T>& w, Index i0, Index bi) {
    w.reset(bi);
    t.for_key_tiles(i0, bi, tile, w.s, [&](const MatrixR<T>& s, Index j0, Index bj) {
      for (Index r = 0; r < bi; ++r) {
        const T mnew = std::max(w.m(r), t.row_max(s, r, i0 + r, j0));
        const Index vis = t.visible(i0 + r, j0, bj);
        w.l(r) = std::exp(w.m(r) - mnew) * w.l(r) + (s.row(r).head(vis).array() - mnew).exp().sum();
        w.m(r) = mnew;
      }
    });
    lse.segment(i0, bi) = w.m.head(bi).array() + w.l.head(bi).array().log();
  });
  return lse;
}

template <typename T>
ExactOperator<T>::ExactOperator(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                                Index tile, QueryLayout layout)
    : q_(q), k_(k), opts_(opts), tile_(checked_tile(tile)), layout_(std::move(layout)) {
  validate(q.rows(), q.cols(), k.rows(), k.cols(), opts, layout_);
  opts_.scale = opts.resolved_scale(q.cols());
}

template <typename T>
const VectorX<T>& ExactOperator<T>::row_lse() const {
  std::call_once(lse_once_, [this] { lse_ = exact_row_lse<T>(q_, k_, opts_, tile_, layout_); });
  return lse_;
}

template <typename T>
MatrixR<T> ExactOperator<T>::apply(const ConstRef<T>& x) const {
  require(x.rows() == cols(), "apply: X has {} rows, the operator has {} columns", x.rows(), cols());
  const VectorX<T>& lse = row_lse();
  const ConstRef<T> q(q_), k(k_);
  const Tiler<T> t(q, k, opts_, layout_);
  const Index tile = tile_;
  MatrixR<T> y = MatrixR<T>::Zero(rows(), x.cols());
  t.for_query_tiles(tile, [] { return MatrixR<T>(); }, [&](MatrixR<T>& buf, Index i0, Index bi) {
    t.for_key_tiles(i0, bi, tile, buf, [&](MatrixR<T>& s, Index j0, Index bj) {
      // P_ij = exp(s_ij − ℓ_i)
      for (Index r = 0; r < bi; ++r) t.exp_row(s, r, i0 + r, j0, lse(i0 + r));
      y.middleRows(i0, bi).noalias() += s * x.middleRows(j0, bj);
    });
  });
  return y;
}

template <typename T>
MatrixR<T> ExactOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == rows(),
          "apply_transpose: X has {} rows, the operator has {} rows", x.rows(), rows());
  const VectorX<T>& lse = row_lse();
  const ConstRef<T> q(q_), k(k_);
  const Tiler<T> t(q, k, opts_, layout_);
  const Index nq = rows(), nk = cols(), b = x.cols(), tile = tile_;
  const Index ntiles = (nk + tile - 1) / tile;
  MatrixR<T> y = MatrixR<T>::Zero(nk, b);
  // Parallel over key tiles, so that each thread owns the rows of Y it writes.
#pragma omp parallel
  {
    MatrixR<T> s;
#pragma omp for schedule(dynamic)
    for (Index jt = 0; jt < ntiles; ++jt) {
      if (cancel_requested()) continue;  // skipped; thrown after the parallel region
      const Index j0 = jt * tile, bj = std::min(tile, nk - j0);
      for (Index i0 = (t.query_begin(j0) / tile) * tile; i0 < nq; i0 += tile) {
        const Index bi = std::min(tile, nq - i0);
        t.logits(i0, bi, j0, bj, s);
        for (Index r = 0; r < bi; ++r) t.exp_row(s, r, i0 + r, j0, lse(i0 + r));
        y.middleRows(j0, bj).noalias() += s.transpose() * x.middleRows(i0, bi);
      }
    }
  }
  throw_if_cancelled();
  return y;
}

template <typename T>
void ExactOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& s) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  const VectorX<T>& lse = row_lse();
  const ConstRef<T> q(q_), k(k_);
  const Tiler<T> t(q, k, opts_, layout_);
  t.logits(first, count, 0, cols(), s);
  for (Index r = 0; r < count; ++r) t.exp_row(s, r, first + r, 0, lse(first + r));
}

#define ATTNLAB_INSTANTIATE_EXACT(T)                                                                     \
  template MatrixR<T> exact_matrix<T>(const ConstRef<T>&, const ConstRef<T>&, const AttentionOptions&, \
                                      const Rounding&);                                                 \
  template MatrixR<T> exact_output<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&,       \
                                      const AttentionOptions&, Index, const QueryLayout&, VectorX<T>*,  \
                                      const Rounding&);                                                 \
  template VectorX<T> exact_row_lse<T>(const ConstRef<T>&, const ConstRef<T>&, const AttentionOptions&, \
                                       Index, const QueryLayout&);                                      \
  template class ExactOperator<T>;
ATTNLAB_INSTANTIATE_EXACT(float)
ATTNLAB_INSTANTIATE_EXACT(double)

}  // namespace attnlab
