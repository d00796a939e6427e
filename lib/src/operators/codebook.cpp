// The VQ attention operators (operators/codebook.hpp): hard-assignment attention over a codebook (Transformer-VQ,
// Lingle 2023) and attnlab's mean-field form of quantizing queries and keys.
#include "attnlab/operators/codebook.hpp"

#include "attnlab/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {
namespace {

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

}  // namespace

template <typename T>
CodebookOperator<T>::CodebookOperator(MatrixR<T> logits, std::vector<Index> assign, bool causal)
    : l_(std::move(logits)), a_(std::move(assign)), causal_(causal) {
  const Index nq = l_.rows(), c = l_.cols();
  off_ = cols() - nq;
  lse_.resize(nq);
  std::vector<Index> count(static_cast<std::size_t>(c), 0);
  Index next = 0;
  if (!causal_)
    for (Index y : a_) ++count[std::size_t(y)];
  for (Index i = 0; i < nq; ++i) {
    if (causal_)
      while (next <= i + off_) ++count[std::size_t(a_[std::size_t(next++)])];
    T mx = kNegInf<T>;
    for (Index y = 0; y < c; ++y)
      if (count[std::size_t(y)]) mx = std::max(mx, l_(i, y));
    T sum = 0;
    for (Index y = 0; y < c; ++y)
      if (count[std::size_t(y)]) sum += T(count[std::size_t(y)]) * std::exp(l_(i, y) - mx);
    lse_(i) = mx + std::log(sum);
  }
}

template <typename T>
MatrixR<T> CodebookOperator<T>::apply(const ConstRef<T>& x) const {
  require(x.rows() == cols(), "apply: dimension mismatch");
  const Index c = l_.cols(), b = x.cols();
  MatrixR<T> s = MatrixR<T>::Zero(c, b);  // per-code sums Σ_{visible j, a(j)=y} x_j
  MatrixR<T> y(rows(), b);
  Index next = 0;
  if (!causal_)
    for (Index j = 0; j < cols(); ++j) s.row(a_[std::size_t(j)]) += x.row(j);
  for (Index i = 0; i < rows(); ++i) {
    if (causal_)
      for (; next <= i + off_; ++next) s.row(a_[std::size_t(next)]) += x.row(next);
    y.row(i) = weights(i) * s;
  }
  return y;
}

template <typename T>
MatrixR<T> CodebookOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == rows(), "apply_transpose: dimension mismatch");
  const Index c = l_.cols(), b = x.cols();
  MatrixR<T> t = MatrixR<T>::Zero(c, b);  // Σ_{queries i that see the key} exp(ℓ_iy − L_i) x_i
  MatrixR<T> y(cols(), b);
  if (!causal_) {
    for (Index i = 0; i < rows(); ++i) t.noalias() += weights(i).transpose() * x.row(i);
    for (Index j = 0; j < cols(); ++j) y.row(j) = t.row(a_[std::size_t(j)]);
    return y;
  }
  // Backwards: after adding query i, key i + off is seen by exactly the queries added so far.
  for (Index i = rows() - 1; i >= 0; --i) {
    t.noalias() += weights(i).transpose() * x.row(i);
    y.row(i + off_) = t.row(a_[std::size_t(i + off_)]);
  }
  for (Index j = 0; j < off_; ++j) y.row(j) = t.row(a_[std::size_t(j)]);
  return y;
}

template <typename T>
MatrixR<T> CodebookOperator<T>::row_block(Index first, Index count) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  MatrixR<T> out = MatrixR<T>::Zero(count, cols());
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r, last = causal_ ? i + off_ : cols() - 1;
    for (Index j = 0; j <= last; ++j) out(r, j) = std::exp(l_(i, a_[std::size_t(j)]) - lse_(i));
  }
  return out;
}

template <typename T>
Eigen::Matrix<T, 1, Eigen::Dynamic> CodebookOperator<T>::weights(Index i) const {
  return (l_.row(i).array() - lse_(i)).min(T(0)).exp().matrix();
}

template <typename T>
MeanFieldOperator<T>::MeanFieldOperator(const MatrixR<T>& lq, const MatrixR<T>& g, std::vector<Index> a,
                                        std::vector<Index> b)
    : a_(std::move(a)), b_(std::move(b)) {
  const Index c = lq.cols(), cq = g.rows(), nk = g.cols(), nq = lq.rows();
  MatrixR<T> m = MatrixR<T>::Constant(cq, c, kNegInf<T>);  // m_by
  for (Index j = 0; j < nk; ++j) {
    const Index y = a_[std::size_t(j)];
    for (Index bq = 0; bq < cq; ++bq) m(bq, y) = std::max(m(bq, y), g(bq, j));
  }
  gt_.resize(cq, nk);
  MatrixR<T> h = MatrixR<T>::Zero(cq, c);  // H_by
  for (Index j = 0; j < nk; ++j) {
    const Index y = a_[std::size_t(j)];
    for (Index bq = 0; bq < cq; ++bq) {
      gt_(bq, j) = std::exp(g(bq, j) - m(bq, y));
      h(bq, y) += gt_(bq, j);
    }
  }
  e_.resize(nq, c);
  for (Index i = 0; i < nq; ++i) {
    const Index bq = b_[std::size_t(i)];
    T mx = kNegInf<T>;
    for (Index y = 0; y < c; ++y)
      if (h(bq, y) > 0) mx = std::max(mx, lq(i, y) + m(bq, y));
    T sum = 0;
    for (Index y = 0; y < c; ++y)
      if (h(bq, y) > 0) sum += std::exp(lq(i, y) + m(bq, y) - mx) * h(bq, y);  // ≥ 1: the maximum's term
    const T lse = mx + std::log(sum);
    for (Index y = 0; y < c; ++y)
      e_(i, y) = h(bq, y) > 0 ? std::exp(std::min(T(0), lq(i, y) + m(bq, y) - lse)) : T(0);
  }
}

template <typename T>
MatrixR<T> MeanFieldOperator<T>::apply(const ConstRef<T>& x) const {
  require(x.rows() == cols(), "apply: dimension mismatch");
  const Index c = e_.cols(), cq = gt_.rows(), bc = x.cols();
  // W_b = Σ_j G̃_bj e_{a(j)} x_jᵀ: per query code, the per-key-code weighted sums of X.
  std::vector<MatrixR<T>> w(static_cast<std::size_t>(cq), MatrixR<T>::Zero(c, bc));
  for (Index j = 0; j < cols(); ++j)
    for (Index bq = 0; bq < cq; ++bq) w[std::size_t(bq)].row(a_[std::size_t(j)]) += gt_(bq, j) * x.row(j);
  MatrixR<T> y(rows(), bc);
  for (Index i = 0; i < rows(); ++i) y.row(i).noalias() = e_.row(i) * w[std::size_t(b_[std::size_t(i)])];
  return y;
}

template <typename T>
MatrixR<T> MeanFieldOperator<T>::apply_transpose(const ConstRef<T>& x) const {
  require(x.rows() == rows(), "apply_transpose: dimension mismatch");
  const Index c = e_.cols(), cq = gt_.rows(), bc = x.cols();
  std::vector<MatrixR<T>> u(static_cast<std::size_t>(cq), MatrixR<T>::Zero(c, bc));
  for (Index i = 0; i < rows(); ++i) u[std::size_t(b_[std::size_t(i)])].noalias() += e_.row(i).transpose() * x.row(i);
  MatrixR<T> y = MatrixR<T>::Zero(cols(), bc);
  for (Index j = 0; j < cols(); ++j)
    for (Index bq = 0; bq < cq; ++bq) y.row(j) += gt_(bq, j) * u[std::size_t(bq)].row(a_[std::size_t(j)]);
  return y;
}

template <typename T>
MatrixR<T> MeanFieldOperator<T>::row_block(Index first, Index count) const {
  MatrixR<T> out(count, cols());
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r;
    for (Index j = 0; j < cols(); ++j) out(r, j) = e_(i, a_[std::size_t(j)]) * gt_(b_[std::size_t(i)], j);
  }
  return out;
}

template class CodebookOperator<float>;
template class CodebookOperator<double>;
template class MeanFieldOperator<float>;
template class MeanFieldOperator<double>;

}  // namespace attnlab
