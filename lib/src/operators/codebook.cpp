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
void CodebookOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
  out.setZero(count, cols());
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r, last = causal_ ? i + off_ : cols() - 1;
    for (Index j = 0; j <= last; ++j) out(r, j) = std::exp(l_(i, a_[std::size_t(j)]) - lse_(i));
  }
}

template <typename T>
Eigen::Matrix<T, 1, Eigen::Dynamic> CodebookOperator<T>::weights(Index i) const {
  return (l_.row(i).array() - lse_(i)).min(T(0)).exp().matrix();
}

template <typename T>
Gradients<T> CodebookOperator<T>::backward(const ConstRef<T>& q, const ConstRef<T>& codebook, const ConstRef<T>& v,
                                           const ConstRef<T>& d_out, double scale) const {
  const Index nq = rows(), nk = cols(), c = l_.cols(), d = q.cols(), dv = v.cols();
  require(q.rows() == nq && codebook.rows() == c && codebook.cols() == d && v.rows() == nk && d_out.rows() == nq &&
              d_out.cols() == dv,
          "vq backward: shapes");
  const T s = T(scale);
  MatrixR<T> e(nq, c);
  for (Index i = 0; i < nq; ++i) e.row(i) = weights(i);
  // dℓ and D, with the per-code sums W, N of the keys each query sees (running sums when causal).
  MatrixR<T> w = MatrixR<T>::Zero(c, dv);
  VectorX<T> cnt = VectorX<T>::Zero(c), dsum(nq);
  MatrixR<T> dl(nq, c);
  if (!causal_) {
    for (Index j = 0; j < nk; ++j) {
      w.row(a_[std::size_t(j)]) += v.row(j);
      cnt(a_[std::size_t(j)]) += T(1);
    }
    const MatrixR<T> o = e * w;
    dsum = (d_out.array() * o.array()).rowwise().sum();
    const MatrixR<T> de = d_out * w.transpose();
    dl = e.array() * (de.array() - (dsum * cnt.transpose()).array());
  } else {
    Index next = 0;
    for (Index i = 0; i < nq; ++i) {
      for (; next <= i + off_; ++next) {
        w.row(a_[std::size_t(next)]) += v.row(next);
        cnt(a_[std::size_t(next)]) += T(1);
      }
      dsum(i) = d_out.row(i).dot(e.row(i) * w);
      dl.row(i) = e.row(i).array() * ((d_out.row(i) * w.transpose()).array() - dsum(i) * cnt.transpose().array());
    }
  }
  Gradients<T> g;
  g.dq.noalias() = dl * codebook;
  g.dq *= s;
  // dV_j = Σ_{i sees j} E_{i,a(j)} dO_i: Eᵀ dO per code (suffix sums when causal, as apply_transpose).
  g.dv.resize(nk, dv);
  MatrixR<T> t = MatrixR<T>::Zero(c, dv);
  if (!causal_) {
    t.noalias() = e.transpose() * d_out;
    for (Index j = 0; j < nk; ++j) g.dv.row(j) = t.row(a_[std::size_t(j)]);
  } else {
    for (Index i = nq - 1; i >= 0; --i) {
      t.noalias() += e.row(i).transpose() * d_out.row(i);
      g.dv.row(i + off_) = t.row(a_[std::size_t(i + off_)]);
    }
    for (Index j = 0; j < off_; ++j) g.dv.row(j) = t.row(a_[std::size_t(j)]);
  }
  // dK̂_j = s (M_{a(j)} v_j − b_{a(j)}), one code per task: each key's row is written by the task of its code.
  g.dk = MatrixR<T>::Zero(nk, d);
  std::vector<std::vector<Index>> members(static_cast<std::size_t>(c));
  for (Index j = 0; j < nk; ++j) members[std::size_t(a_[std::size_t(j)])].push_back(j);
#pragma omp parallel
  {
    MatrixR<T> m(d, dv), qw;
    VectorX<T> b(d);
    const auto key_grad = [&](Index j) { g.dk.row(j) = s * (m * v.row(j).transpose() - b).transpose(); };
#pragma omp for schedule(dynamic)
    for (Index y = 0; y < c; ++y) {
      const auto& keys = members[std::size_t(y)];
      if (keys.empty()) continue;
      if (!causal_) {
        qw = q.array().colwise() * e.col(y).array();
        m.noalias() = qw.transpose() * d_out;
        b.noalias() = qw.transpose() * dsum;
        for (Index j : keys) key_grad(j);
        continue;
      }
      // Suffix sums over the queries that see key j: i ≥ j − off.
      m.setZero();
      b.setZero();
      for (Index i = nq - 1; i >= 0; --i) {
        if (e(i, y) != T(0)) {
          m.noalias() += (e(i, y) * q.row(i)).transpose() * d_out.row(i);
          b += (e(i, y) * dsum(i)) * q.row(i).transpose();
        }
        if (a_[std::size_t(i + off_)] == y) key_grad(i + off_);
      }
      for (Index j : keys) {
        if (j >= off_) break;
        key_grad(j);
      }
    }
  }
  return g;
}

template <typename T>
typename MeanFieldOperator<T>::Backward MeanFieldOperator<T>::backward(const ConstRef<T>& q, const ConstRef<T>& v,
                                                                       const ConstRef<T>& d_out, double scale) const {
  const Index nq = rows(), nk = cols(), c = e_.cols(), cq = gt_.rows(), d = q.cols(), dv = v.cols();
  require(q.rows() == nq && v.rows() == nk && d_out.rows() == nq && d_out.cols() == dv, "vq backward: shapes");
  // Per query code b: W_b (c × d_v) = Σ_j G̃_bj e_{a(j)} v_jᵀ and H_by = Σ_{a(j)=y} G̃_bj.
  std::vector<MatrixR<T>> w(static_cast<std::size_t>(cq), MatrixR<T>::Zero(c, dv));
  MatrixR<T> h = MatrixR<T>::Zero(cq, c);
  for (Index j = 0; j < nk; ++j) {
    const Index y = a_[std::size_t(j)];
    for (Index bq = 0; bq < cq; ++bq) {
      w[std::size_t(bq)].row(y) += gt_(bq, j) * v.row(j);
      h(bq, y) += gt_(bq, j);
    }
  }
  // D_i = dO_i·O_i and dλ_iy = E_iy (dO_i·W_{b(i),y} − D_i H_{b(i),y}).
  Backward r;
  VectorX<T> dsum(nq);
  r.dlambda.resize(nq, c);
  for (Index i = 0; i < nq; ++i) {
    const MatrixR<T>& wb = w[std::size_t(b_[std::size_t(i)])];
    dsum(i) = d_out.row(i).dot(e_.row(i) * wb);
    r.dlambda.row(i) =
        e_.row(i).array() * ((d_out.row(i) * wb.transpose()).array() - dsum(i) * h.row(b_[std::size_t(i)]).array());
  }
  // U_by = Σ_{b(i)=b} E_iy dO_i, F_by = Σ_{b(i)=b} E_iy D_i; dg_bj = G̃_bj (U_{b,a(j)}·v_j − F_{b,a(j)}),
  // dV_j = Σ_b G̃_bj U_{b,a(j)}.
  std::vector<MatrixR<T>> u(static_cast<std::size_t>(cq), MatrixR<T>::Zero(c, dv));
  MatrixR<T> f = MatrixR<T>::Zero(cq, c);
  std::vector<std::vector<Index>> queries_of(static_cast<std::size_t>(cq));
  for (Index i = 0; i < nq; ++i) {
    const Index bq = b_[std::size_t(i)];
    u[std::size_t(bq)].noalias() += e_.row(i).transpose() * d_out.row(i);
    f.row(bq) += dsum(i) * e_.row(i);
    queries_of[std::size_t(bq)].push_back(i);
  }
  r.dg.resize(cq, nk);
  r.dv = MatrixR<T>::Zero(nk, dv);
#pragma omp parallel for schedule(static)
  for (Index j = 0; j < nk; ++j) {
    const Index y = a_[std::size_t(j)];
    for (Index bq = 0; bq < cq; ++bq) {
      const auto uy = u[std::size_t(bq)].row(y);
      r.dg(bq, j) = gt_(bq, j) * (uy.dot(v.row(j)) - f(bq, y));
      r.dv.row(j) += gt_(bq, j) * uy;
    }
  }
  // dk_j = s Σ_b G̃_bj (M_{b,a(j)} v_j − f_{b,a(j)}), M_by = Σ_{b(i)=b} E_iy q_i dO_iᵀ, f_by = Σ_{b(i)=b} E_iy D_i q_i:
  // one query code at a time (c matrices d × d_v), the keys in parallel.
  r.dk = MatrixR<T>::Zero(nk, d);
  std::vector<MatrixR<T>> m(static_cast<std::size_t>(c));
  MatrixR<T> fq(c, d);
  for (Index bq = 0; bq < cq; ++bq) {
    const auto& qi = queries_of[std::size_t(bq)];
    if (qi.empty()) continue;
    const Index nb = Index(qi.size());
    MatrixR<T> qb(nb, d), dob(nb, dv);
    VectorX<T> db(nb);
    for (Index t = 0; t < nb; ++t) {
      qb.row(t) = q.row(qi[std::size_t(t)]);
      dob.row(t) = d_out.row(qi[std::size_t(t)]);
      db(t) = dsum(qi[std::size_t(t)]);
    }
#pragma omp parallel for schedule(static)
    for (Index y = 0; y < c; ++y) {
      VectorX<T> ey(nb);
      for (Index t = 0; t < nb; ++t) ey(t) = e_(qi[std::size_t(t)], y);
      const MatrixR<T> qw = qb.array().colwise() * ey.array();
      m[std::size_t(y)].noalias() = qw.transpose() * dob;
      fq.row(y).noalias() = (qw.transpose() * db).transpose();
    }
#pragma omp parallel for schedule(static)
    for (Index j = 0; j < nk; ++j) {
      const Index y = a_[std::size_t(j)];
      r.dk.row(j) += gt_(bq, j) * (v.row(j) * m[std::size_t(y)].transpose() - fq.row(y));
    }
  }
  r.dk *= T(scale);
  return r;
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
void MeanFieldOperator<T>::row_block_into(Index first, Index count, MatrixR<T>& out) const {
  out.resize(count, cols());
  for (Index r = 0; r < count; ++r) {
    const Index i = first + r;
    for (Index j = 0; j < cols(); ++j) out(r, j) = e_(i, a_[std::size_t(j)]) * gt_(b_[std::size_t(i)], j);
  }
}

template class CodebookOperator<float>;
template class CodebookOperator<double>;
template class MeanFieldOperator<float>;
template class MeanFieldOperator<double>;

}  // namespace attnlab
