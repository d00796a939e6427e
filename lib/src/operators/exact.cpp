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

namespace attnlab {
using detail::checked_tile;
using detail::Tiler;
using detail::validate;

template <typename T>
MatrixR<T> exact_matrix(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  validate(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  check_memory(matrix_bytes(q.rows(), k.rows(), sizeof(T)),
               fmt::format("the {}×{} {} attention matrix", q.rows(), k.rows(), dtype_name(dtype_of<T>())));
  Tiler<T> t(q, k, opts);
  MatrixR<T> p;
  t.logits(0, q.rows(), 0, k.rows(), p);
  // Row softmax with the max subtracted first: exp never overflows, and the row's max becomes exp(0) = 1,
  // so the sum is ≥ 1 and never underflows (stable log-sum-exp).
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < p.rows(); ++i) {
    t.exp_row(p, i, i, 0, t.row_max(p, i, i, 0));
    p.row(i) /= p.row(i).sum();
  }
  return p;
}

template <typename T>
MatrixR<T> exact_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                        const AttentionOptions& opts, Index tile, const QueryLayout& layout, VectorX<T>* row_lse) {
  validate(q.rows(), q.cols(), k.rows(), k.cols(), opts, layout);
  validate_v(k.rows(), v.rows());
  checked_tile(tile);
  const Tiler<T> t(q, k, opts, layout);
  const Index nq = q.rows(), dv = v.cols();
  const Index ntiles = (nq + tile - 1) / tile;
  MatrixR<T> out(nq, dv);
  if (row_lse) row_lse->resize(nq);
#pragma omp parallel
  {
    MatrixR<T> s;
    MatrixR<T> acc(tile, dv);
    VectorX<T> m(tile), l(tile);
#pragma omp for schedule(dynamic)
    for (Index it = 0; it < ntiles; ++it) {
      if (cancel_requested()) continue;  // skipped; thrown after the parallel region
      const Index i0 = it * tile, bi = std::min(tile, nq - i0);
      m.head(bi).setConstant(-std::numeric_limits<T>::infinity());
      l.head(bi).setZero();
      acc.topRows(bi).setZero();
      const Index kend = t.key_end(i0, bi);
      for (Index j0 = 0; j0 < kend; j0 += tile) {
        const Index bj = std::min(tile, kend - j0);
        t.logits(i0, bi, j0, bj, s);
        // Online softmax: keep the running max m_i and the running sum l_i = Σ exp(s_ij − m_i); when the max
        // grows, rescale l and the accumulator by exp(m_old − m_new). Key 0 is in the first tile of every
        // row, so m_i is finite from the first tile on.
        for (Index r = 0; r < bi; ++r) {
          const T mnew = std::max(m(r), t.row_max(s, r, i0 + r, j0));
          const T alpha = std::exp(m(r) - mnew);
          t.exp_row(s, r, i0 + r, j0, mnew);
          l(r) = alpha * l(r) + s.row(r).sum();
          acc.row(r) *= alpha;
          m(r) = mnew;
        }
        acc.topRows(bi).noalias() += s * v.middleRows(j0, bj);
      }
      out.middleRows(i0, bi) = acc.topRows(bi).array().colwise() / l.head(bi).array();
      if (row_lse) row_lse->segment(i0, bi) = m.head(bi).array() + l.head(bi).array().log();
    }
  }
  throw_if_cancelled();
  return out;
}

template <typename T>
VectorX<T> exact_row_lse(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts, Index tile,
                         const QueryLayout& layout) {
  validate(q.rows(), q.cols(), k.rows(), k.cols(), opts, layout);
  checked_tile(tile);
  const Tiler<T> t(q, k, opts, layout);
  const Index nq = q.rows();
  const Index ntiles = (nq + tile - 1) / tile;
  VectorX<T> lse(nq);
#pragma omp parallel
  {
    MatrixR<T> s;
#pragma omp for schedule(dynamic)
    for (Index it = 0; it < ntiles; ++it) {
      if (cancel_requested()) continue;  // skipped; thrown after the parallel region
      const Index i0 = it * tile, bi = std::min(tile, nq - i0);
      VectorX<T> m = VectorX<T>::Constant(bi, -std::numeric_limits<T>::infinity());
      VectorX<T> l = VectorX<T>::Zero(bi);
      const Index kend = t.key_end(i0, bi);
      for (Index j0 = 0; j0 < kend; j0 += tile) {
        const Index bj = std::min(tile, kend - j0);
        t.logits(i0, bi, j0, bj, s);
        for (Index r = 0; r < bi; ++r) {
          const T mnew = std::max(m(r), t.row_max(s, r, i0 + r, j0));
          const Index vis = t.visible(i0 + r, j0, bj);
          l(r) = std::exp(m(r) - mnew) * l(r) + (s.row(r).head(vis).array() - mnew).exp().sum();
          m(r) = mnew;
        }
      }
      lse.segment(i0, bi) = m.array() + l.array().log();
    }
  }
  throw_if_cancelled();
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
  require(x.rows() == cols(), fmt::format("apply: X has {} rows, the operator has {} columns", x.rows(), cols()));
  const VectorX<T>& lse = row_lse();
  const ConstRef<T> q(q_), k(k_);
  const Tiler<T> t(q, k, opts_, layout_);
  const Index nq = rows(), b = x.cols(), tile = tile_;
  const Index ntiles = (nq + tile - 1) / tile;
  MatrixR<T> y = MatrixR<T>::Zero(nq, b);
#pragma omp parallel
  {
    MatrixR<T> s;
#pragma omp for schedule(dynamic)
    for (Index it = 0; it < ntiles; ++it) {
      if (cancel_requested()) continue;  // skipped; thrown after the parallel region
      const Index i0 = it * tile, bi = std::min(tile, nq - i0);
      const Index kend = t.key_end(i0, bi);
      for (Index j0 = 0; j0 < kend; j0 += tile) {
        const Index bj = std::min(tile, kend - j0);
        t.logits(i0, bi, j0, bj, s);
        // P_ij = exp(s_ij − ℓ_i)
        for (Index r = 0; r < bi; ++r) t.exp_row(s, r, i0 + r, j0, lse(i0 + r));
        y.middleRows(i0, bi).noalias() += s * x.middleRows(j0, bj);
      }
    }
  }
  throw_if_cancelled();
  return y;
}

template <typename T>
MatrixR<T> ExactOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == rows(),
          fmt::format("apply_transpose: X has {} rows, the operator has {} rows", x.rows(), rows()));
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
MatrixR<T> ExactOperator<T>::row_block(Index first, Index count) const {
  MatrixR<T> s;
  row_block_into(first, count, s);
  return s;
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
  template MatrixR<T> exact_matrix<T>(const ConstRef<T>&, const ConstRef<T>&, const AttentionOptions&); \
  template MatrixR<T> exact_output<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&,       \
                                      const AttentionOptions&, Index, const QueryLayout&, VectorX<T>*); \
  template VectorX<T> exact_row_lse<T>(const ConstRef<T>&, const ConstRef<T>&, const AttentionOptions&, \
                                       Index, const QueryLayout&);                                      \
  template class ExactOperator<T>;
ATTNLAB_INSTANTIATE_EXACT(float)
ATTNLAB_INSTANTIATE_EXACT(double)

}  // namespace attnlab
