// Informer's ProbSparse attention matrix as an operator (operators/probsparse.hpp; Zhou et al. 2021, eq. (3)).
#include "attnlab/operators/probsparse.hpp"

#include "attnlab/core/error.hpp"

#include <algorithm>

namespace attnlab {

template <typename T>
ProbSparseOperator<T>::ProbSparseOperator(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                                          std::vector<Index> selected, bool cumsum)
    : nq_(q.rows()), nk_(k.rows()), causal_(opts.causal), cumsum_(cumsum && opts.causal), selected_(selected),
      is_selected_(static_cast<std::size_t>(q.rows()), false) {
  off_ = nk_ - nq_;
  for (Index i : selected_) is_selected_[std::size_t(i)] = true;
  MatrixR<T> qs(Index(selected_.size()), q.cols());
  for (std::size_t r = 0; r < selected_.size(); ++r) qs.row(Index(r)) = q.row(selected_[r]);
  exact_.emplace(qs, k, opts, kDefaultTile, QueryLayout{selected_, nq_});
}

template <typename T>
MatrixR<T> ProbSparseOperator<T>::lazy_apply(const ConstRef<T>& x) const {
  MatrixR<T> y(nq_, x.cols());
  if (!causal_) {
    const Eigen::Matrix<T, 1, Eigen::Dynamic> sum = x.colwise().sum();
#pragma omp parallel for schedule(static)
    for (Index i = 0; i < nq_; ++i) y.row(i) = sum * lazy_weight(i);  // n × d writes (and the fresh y's pages)
    return y;
  }
  Eigen::Matrix<T, 1, Eigen::Dynamic> prefix = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(x.cols());
  Index next = 0;
  for (Index i = 0; i < nq_; ++i) {
    for (; next <= i + off_; ++next) prefix += x.row(next);
    y.row(i) = prefix * lazy_weight(i);
  }
  return y;
}

template <typename T>
MatrixR<T> ProbSparseOperator<T>::apply(const ConstRef<T>& x) const {
  require(x.rows() == nk_, "apply: dimension mismatch");
  MatrixR<T> y = lazy_apply(x);
  if (!selected_.empty()) scatter(exact_->apply(x), y);
  return y;
}

template <typename T>
MatrixR<T> ProbSparseOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == nq_, "apply_transpose: dimension mismatch");
  MatrixR<T> y = MatrixR<T>::Zero(nk_, x.cols());
  if (!selected_.empty()) {
    MatrixR<T> xs(Index(selected_.size()), x.cols());
    for (std::size_t r = 0; r < selected_.size(); ++r) xs.row(Index(r)) = x.row(selected_[r]);
    y = exact_->apply_transpose(xs);
  }
  // Lazy rows: key j collects w_i x_i from every lazy query i that sees it (suffix sums when causal).
  Eigen::Matrix<T, 1, Eigen::Dynamic> acc = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(x.cols());
  if (!causal_) {
    for (Index i = 0; i < nq_; ++i)
      if (!is_selected_[std::size_t(i)]) acc += x.row(i) * lazy_weight(i);
    y.rowwise() += acc;
    return y;
  }
  for (Index i = nq_ - 1; i >= 0; --i) {
    if (!is_selected_[std::size_t(i)]) acc += x.row(i) * lazy_weight(i);
    y.row(i + off_) += acc;
  }
  for (Index j = 0; j < off_; ++j) y.row(j) += acc;
  return y;
}

template <typename T>
void ProbSparseOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  require(first >= 0 && count >= 0 && first + count <= nq_, "row_block: rows out of range");
  out.setZero(count, nk_);
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r;
    if (is_selected_[std::size_t(i)]) {
      const Index pos = Index(std::lower_bound(selected_.begin(), selected_.end(), i) - selected_.begin());
      out.row(r) = exact_->row_block(pos, 1);
    } else {
      out.row(r).head(visible(i)).setConstant(lazy_weight(i));
    }
  }
}

namespace {

/// dst = src (the same shape), rows in parallel.
template <typename T>
void copy_parallel(const ConstRef<T>& src, MatrixR<T>& dst) {
  dst.resize(src.rows(), src.cols());
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < src.rows(); ++i) dst.row(i) = src.row(i);
}

/// a == b entry by entry, rows in parallel.
template <typename T>
bool equal_parallel(const MatrixR<T>& a, const ConstRef<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  bool same = true;
#pragma omp parallel for schedule(static) reduction(&& : same)
  for (Index i = 0; i < a.rows(); ++i) same = same && a.row(i) == b.row(i);
  return same;
}

}  // namespace

template <typename T>
MatrixR<T> ProbSparseOperator<T>::output(const ConstRef<T>& v, ProbSparseWorkspace<T>* ws,
                                         const Rounding& rounding) const {
  MatrixR<T> y = lazy_apply(v);
  if (ws) ws->kept = false;
  const QueryLayout layout{selected_, nq_};
  if (rounding.active()) {
    for (Index i = 0; i < nq_; ++i)
      if (!is_selected_[std::size_t(i)]) rounding.span(y.row(i).data(), std::size_t(y.cols()), Held::tensor,
                                                       "lazy rows mean(V)");
    if (!selected_.empty())
      scatter(exact_output<T>(exact_->queries(), exact_->keys(), v, exact_->options(), kDefaultTile, layout, nullptr,
                              rounding),
              y);
    return y;
  }
  if (selected_.empty()) return y;
  if (!ws) {
    scatter(exact_output<T>(exact_->queries(), exact_->keys(), v, exact_->options(), kDefaultTile, layout), y);
    return y;
  }
  // The same pass with ℓ, and a copy of V to know the backward's V for this one.
  ws->out = exact_output<T>(exact_->queries(), exact_->keys(), v, exact_->options(), kDefaultTile, layout, &ws->lse);
  scatter(ws->out, y);
  copy_parallel<T>(v, ws->v);
  ws->kept = true;
  return y;
}

template <typename T>
void ProbSparseOperator<T>::lazy_apply_transpose(const ConstRef<T>& x, MatrixR<T>& y) const {
  y.resize(nk_, x.cols());
  Eigen::Matrix<T, 1, Eigen::Dynamic> acc = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(x.cols());
  if (!causal_) {
    for (Index i = 0; i < nq_; ++i)
      if (!is_selected_[std::size_t(i)]) acc += x.row(i) * lazy_weight(i);
    // The same row for every key, written in parallel (the first touch of the pages, too, split between threads).
#pragma omp parallel for schedule(static)
    for (Index j = 0; j < nk_; ++j) y.row(j) = acc;
    return;
  }
  // Suffix sums: key i + off is seen by the lazy queries i, i + 1, …; the keys before off by all of them.
  for (Index i = nq_ - 1; i >= 0; --i) {
    if (!is_selected_[std::size_t(i)]) acc += x.row(i) * lazy_weight(i);
    y.row(i + off_) = acc;
  }
  for (Index j = 0; j < off_; ++j) y.row(j) = acc;
}

namespace {

/// x = 0, rows in parallel (a fresh buffer's pages are faulted in by both threads).
template <typename T>
void zero_parallel(MatrixR<T>& x) {
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < x.rows(); ++i) x.row(i).setZero();
}

}  // namespace

template <typename T>
Gradients<T> ProbSparseOperator<T>::backward(const ConstRef<T>& v, const ConstRef<T>& d_out,
                                             ProbSparseWorkspace<T>* ws, const Rounding& rounding) const {
  require(v.rows() == nk_ && d_out.rows() == nq_ && d_out.cols() == v.cols(), "probsparse backward: shapes");
  ProbSparseWorkspace<T> local;
  ProbSparseWorkspace<T>& w = ws ? *ws : local;
  const MatrixR<T>& qs = exact_->queries();
  Gradients<T> g;
  g.dq.resize(nq_, qs.cols());
  zero_parallel(g.dq);  // lazy rows: no dependence on Q (the measure only selects)
  g.dk.resize(nk_, qs.cols());
  zero_parallel(g.dk);  // lazy rows add nothing to dK
  lazy_apply_transpose(d_out, g.dv);
  if (selected_.empty()) return g;
  // The exact rows (eq. (3)): their O and log-sum-exp (output()'s when it was taken on this V, else a forward pass
  // of their own), then FlashAttention-2's backward, added into dK and dV (over the lazy rows' part) and into their
  // rows of dQ.
  const QueryLayout layout{selected_, nq_};
  const Index u = Index(selected_.size());
  w.dos.resize(u, d_out.cols());
  for (Index r = 0; r < u; ++r) w.dos.row(r) = d_out.row(selected_[std::size_t(r)]);
  if (rounding.active() || !(w.kept && equal_parallel<T>(w.v, v))) {
    w.kept = false;  // not this V: the forward again, for this call only (V is not copied here)
    // (Emulated: the forward's own rounding again, untallied: output() tallied it.)
    w.out = exact_output<T>(qs, exact_->keys(), v, exact_->options(), kDefaultTile, layout, &w.lse,
                            rounding.untallied());
  }
  w.dqs.setZero(u, qs.cols());
  exact_backward_add<T>(qs, exact_->keys(), v, w.out, w.lse, w.dos, exact_->options(), w.dqs, g.dk, g.dv, w.exact,
                        kDefaultTile, layout, rounding);
  scatter(w.dqs, g.dq);
  return g;
}

template <typename T>
void ProbSparseOperator<T>::scatter(const MatrixR<T>& rows, MatrixR<T>& y) const {
  for (std::size_t r = 0; r < selected_.size(); ++r) y.row(selected_[r]) = rows.row(Index(r));
}

template class ProbSparseOperator<float>;
template class ProbSparseOperator<double>;

}  // namespace attnlab
