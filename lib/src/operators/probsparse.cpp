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
    for (Index i = 0; i < nq_; ++i) y.row(i) = sum * lazy_weight(i);
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
MatrixR<T> ProbSparseOperator<T>::row_block(Index first, Index count) const {
  require(first >= 0 && count >= 0 && first + count <= nq_, "row_block: rows out of range");
  MatrixR<T> out = MatrixR<T>::Zero(count, nk_);
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r;
    if (is_selected_[std::size_t(i)]) {
      const Index pos = Index(std::lower_bound(selected_.begin(), selected_.end(), i) - selected_.begin());
      out.row(r) = exact_->row_block(pos, 1);
    } else {
      out.row(r).head(visible(i)).setConstant(lazy_weight(i));
    }
  }
  return out;
}

template <typename T>
MatrixR<T> ProbSparseOperator<T>::output(const ConstRef<T>& v) const {
  MatrixR<T> y = lazy_apply(v);
  if (!selected_.empty())
    scatter(exact_output<T>(exact_->queries(), exact_->keys(), v, exact_->options(), kDefaultTile,
                            QueryLayout{selected_, nq_}),
            y);
  return y;
}

template <typename T>
MatrixR<T> ProbSparseOperator<T>::lazy_apply_transpose(const ConstRef<T>& x) const {
  MatrixR<T> y = MatrixR<T>::Zero(nk_, x.cols());
  Eigen::Matrix<T, 1, Eigen::Dynamic> acc = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(x.cols());
  if (!causal_) {
    for (Index i = 0; i < nq_; ++i)
      if (!is_selected_[std::size_t(i)]) acc += x.row(i) * lazy_weight(i);
    y.rowwise() = acc;
    return y;
  }
  // Suffix sums: key i + off is seen by the lazy queries i, i + 1, …; the keys before off by all of them.
  for (Index i = nq_ - 1; i >= 0; --i) {
    if (!is_selected_[std::size_t(i)]) acc += x.row(i) * lazy_weight(i);
    y.row(i + off_) = acc;
  }
  for (Index j = 0; j < off_; ++j) y.row(j) = acc;
  return y;
}

template <typename T>
Gradients<T> ProbSparseOperator<T>::backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  require(v.rows() == nk_ && d_out.rows() == nq_ && d_out.cols() == v.cols(), "probsparse backward: shapes");
  const MatrixR<T>& qs = exact_->queries();
  Gradients<T> g;
  g.dq = MatrixR<T>::Zero(nq_, qs.cols());  // lazy rows: no dependence on Q (the measure only selects)
  g.dv = lazy_apply_transpose(d_out);
  if (selected_.empty()) {
    g.dk = MatrixR<T>::Zero(nk_, qs.cols());
    return g;
  }
  // The exact rows (eq. (3)): their own forward pass for O and the log-sum-exp, then FlashAttention-2's backward.
  const QueryLayout layout{selected_, nq_};
  MatrixR<T> dos(Index(selected_.size()), d_out.cols());
  for (std::size_t r = 0; r < selected_.size(); ++r) dos.row(Index(r)) = d_out.row(selected_[r]);
  VectorX<T> lse;
  const MatrixR<T> out = exact_output<T>(qs, exact_->keys(), v, exact_->options(), kDefaultTile, layout, &lse);
  Gradients<T> ge = exact_backward<T>(qs, exact_->keys(), v, out, lse, dos, exact_->options(), kDefaultTile, layout);
  scatter(ge.dq, g.dq);
  g.dk = std::move(ge.dk);
  g.dv += ge.dv;
  return g;
}

template <typename T>
void ProbSparseOperator<T>::scatter(const MatrixR<T>& rows, MatrixR<T>& y) const {
  for (std::size_t r = 0; r < selected_.size(); ++r) y.row(selected_[r]) = rows.row(Index(r));
}

template class ProbSparseOperator<float>;
template class ProbSparseOperator<double>;

}  // namespace attnlab
