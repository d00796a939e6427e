// `vq` — Transformer-VQ (Lingle 2023; seed 002 eqs. (1)-(3)): keys quantized to a codebook C learned by k-means,
// K̂ = ΔC, and exp(s·QK̂ᵀ)V = exp(s·QCᵀ)(ΔᵀV) (seed 002 eq. (3)): exact attention on K̂ in O(n·c·d).
//   assign=hard: Δ one-hot (nearest code). P̃_ij = exp(s·q_iᵀc_a(j) − L_i), L_i = log Σ_y N_y exp(s·q_iᵀc_y).
//   assign=soft: Δ → the GMM responsibilities R_jy = softmax_y(−‖k_j − c_y‖²/(2T)) (seed 002 eqs. (8)-(9));
//                T → 0 recovers hard VQ. Non-causal.
//   quantize=both: the mean-field form of the seed's comments, q·k ≈ q·⟨k⟩ + ⟨q⟩·k − ⟨q⟩·⟨k⟩ with ⟨q⟩ from a
//                second codebook on the queries: logits s(q_i·c_a(j) + c'_b(i)·(k_j − c_a(j))), still linear. Non-causal.
// Causal (hard, keys): running per-code sums of values and counts, so output i reads only keys j ≤ i. The
// codebook itself is fitted on all keys before the pass — a look-ahead in the codebook (as when Transformer-VQ's
// codebook is trained), not in the attention.
#include "attnlab/error.hpp"
#include "attnlab/kmeans.hpp"
#include "attnlab/vq.hpp"
#include "attnlab/methods/vq.hpp"
#include "lowrank_method.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>

namespace attnlab {
namespace {

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

/// Hard-assignment VQ attention: P̃_ij = exp(ℓ_{i,a(j)} − L_i) for visible j, ℓ = s·QCᵀ, L_i the log of the
/// normalizer over the codes of the visible keys (counted with multiplicity).
template <typename T>
class CodebookOperator final : public AttentionOperator<T> {
 public:
  CodebookOperator(MatrixR<T> logits, std::vector<Index> assign, bool causal)
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
  Index rows() const override { return l_.rows(); }
  Index cols() const override { return Index(a_.size()); }

  MatrixR<T> apply(const ConstRef<T>& x) const override {
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

  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override {
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

  MatrixR<T> row_block(Index first, Index count) const override {
    require(first >= 0 && count >= 0 && first + count <= rows(), "row_block: rows out of range");
    MatrixR<T> out = MatrixR<T>::Zero(count, cols());
    for (Index r = 0; r < count; ++r) {
      const Index i = first + r, last = causal_ ? i + off_ : cols() - 1;
      for (Index j = 0; j <= last; ++j) out(r, j) = std::exp(l_(i, a_[std::size_t(j)]) - lse_(i));
    }
    return out;
  }

 private:
  /// exp(ℓ_iy − L_i) for every code (codes no visible key uses are never read: their sums are zero, and a key
  /// of code y is only seen by queries for which y is visible).
  Eigen::Matrix<T, 1, Eigen::Dynamic> weights(Index i) const {
    return (l_.row(i).array() - lse_(i)).min(T(0)).exp().matrix();
  }
  MatrixR<T> l_;
  std::vector<Index> a_;
  bool causal_;
  Index off_ = 0;
  VectorX<T> lse_;
};

/// The mean-field form of quantizing both: logits ℓ_ij = s(q_i·c_a(j) + c'_b(i)·r_j), r_j = k_j − c_a(j).
/// Stabilized in the log domain as exact attention is (a stable log-sum-exp per query over the joint logits):
/// with m_by = max_{j: a(j)=y} g_bj (g = s·C'Rᵀ), G̃_bj = exp(g_bj − m_b,a(j)) ≤ 1 and H_by = Σ_{j: a(j)=y} G̃_bj,
/// L_i = log Σ_y exp(λ_iy + m_b(i),y)·H_b(i),y (λ = s·QCᵀ), E_iy = exp(λ_iy + m_b(i),y − L_i) ≤ 1, and
/// P̃_ij = E_i,a(j)·G̃_b(i),j. Every factor is at most one, so nothing overflows at any logit scale (shifting λ and g
/// by their own maxima, as before, let Σ_y underflow to a denormal at logits ×100 in float32, and 1/Σ overflow).
template <typename T>
class MeanFieldOperator final : public AttentionOperator<T> {
 public:
  MeanFieldOperator(const MatrixR<T>& lq, const MatrixR<T>& g, std::vector<Index> a, std::vector<Index> b)
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
  Index rows() const override { return e_.rows(); }
  Index cols() const override { return Index(a_.size()); }
  MatrixR<T> apply(const ConstRef<T>& x) const override {
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
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override {
    require(x.rows() == rows(), "apply_transpose: dimension mismatch");
    const Index c = e_.cols(), cq = gt_.rows(), bc = x.cols();
    std::vector<MatrixR<T>> u(static_cast<std::size_t>(cq), MatrixR<T>::Zero(c, bc));
    for (Index i = 0; i < rows(); ++i) u[std::size_t(b_[std::size_t(i)])].noalias() += e_.row(i).transpose() * x.row(i);
    MatrixR<T> y = MatrixR<T>::Zero(cols(), bc);
    for (Index j = 0; j < cols(); ++j)
      for (Index bq = 0; bq < cq; ++bq) y.row(j) += gt_(bq, j) * u[std::size_t(bq)].row(a_[std::size_t(j)]);
    return y;
  }
  MatrixR<T> row_block(Index first, Index count) const override {
    MatrixR<T> out(count, cols());
    for (Index r = 0; r < count; ++r) {
      const Index i = first + r;
      for (Index j = 0; j < cols(); ++j) out(r, j) = e_(i, a_[std::size_t(j)]) * gt_(b_[std::size_t(i)], j);
    }
    return out;
  }

 private:
  MatrixR<T> e_, gt_;  // E (n_q × c), G̃ (c_q × n_k)
  std::vector<Index> a_, b_;
};

}  // namespace

template <typename T>
std::unique_ptr<AttentionOperator<T>> codebook_attention(const ConstRef<T>& q, const ConstRef<T>& k,
                                                         const ConstRef<T>& codebook, const AttentionOptions& opts) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  require(codebook.cols() == k.cols() && codebook.rows() >= 1, "vq: the codebook must have the keys' dimension");
  MatrixR<T> logits = (q * codebook.transpose()) * T(opts.resolved_scale(q.cols()));
  return std::make_unique<CodebookOperator<T>>(std::move(logits), nearest<T>(k, codebook), opts.causal);
}

template std::unique_ptr<AttentionOperator<float>> codebook_attention<float>(const ConstRef<float>&,
                                                                            const ConstRef<float>&,
                                                                            const ConstRef<float>&,
                                                                            const AttentionOptions&);
template std::unique_ptr<AttentionOperator<double>> codebook_attention<double>(const ConstRef<double>&,
                                                                              const ConstRef<double>&,
                                                                              const ConstRef<double>&,
                                                                              const AttentionOptions&);

namespace {

template <typename T>
class VqMethod final : public Method<T> {
 public:
  VqMethod(const MethodDescriptor& d, Params p) : Method<T>(d, std::move(p)) {
    o_ = VqOptions::from(this->params());  // the spec's values, typed
    hard_ = o_.assign == "hard";
    both_ = o_.quantize == "both";
  }
  bool supports_causal() const override { return hard_ && !both_; }
  std::string lookahead() const override { return "the codebook is fitted by k-means on all keys"; }
  std::vector<std::pair<std::string, double>> diagnostics() const override {
    return {{"kmeans_inertia", inertia_}, {"kmeans_iterations", double(iterations_)}};
  }

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    const Index codes = o_.codes;
    require(codes <= k.rows(), fmt::format("vq: codes = {} exceeds the {} keys", codes, k.rows()));
    Rng rng(o_.seed);
    const Index iters = o_.iters;
    const KMeansResult<T> km = kmeans<T>(k, codes, iters, rng);
    inertia_ = km.inertia;
    iterations_ = km.iterations;
    const T s = T(opts.scale);
    MatrixR<T> logits = (q * km.centroids.transpose()) * s;  // ℓ = s·QCᵀ
    if (both_) {
      require(codes <= q.rows(), fmt::format("vq: codes = {} exceeds the {} queries", codes, q.rows()));
      const KMeansResult<T> kq = kmeans<T>(q, codes, iters, rng);
      MatrixR<T> resid = k;  // r_j = k_j − c_a(j)
      for (Index j = 0; j < k.rows(); ++j) resid.row(j) -= km.centroids.row(km.assignment[std::size_t(j)]);
      const MatrixR<T> g = (kq.centroids * resid.transpose()) * s;  // c_q × n_k
      op_ = std::make_unique<MeanFieldOperator<T>>(logits, g, km.assignment, kq.assignment);
    } else if (hard_) {
      op_ = codebook_attention<T>(q, k, km.centroids, opts);
    } else {
      // Responsibilities R_jy = softmax_y(−‖k_j − c_y‖²/(2T)) (seed 002 eq. (8)), then
      // P̃_ij = Σ_y exp(ℓ_iy − L_i) R_jy with L_i = log Σ_y exp(ℓ_iy)·Σ_j R_jy.
      const T temp = T(o_.temperature);
      MatrixR<T> r = (k * km.centroids.transpose()) * T(2);
      r.colwise() -= k.rowwise().squaredNorm();
      r.rowwise() -= km.centroids.rowwise().squaredNorm().transpose();  // −‖k − c‖²
      r /= T(2) * temp;
      for (Index j = 0; j < r.rows(); ++j) {
        r.row(j) = (r.row(j).array() - r.row(j).maxCoeff()).exp();
        r.row(j) /= r.row(j).sum();
      }
      const VectorX<T> mass = r.colwise().sum().transpose();
      MatrixR<T> e(logits.rows(), logits.cols());
      for (Index i = 0; i < logits.rows(); ++i) {
        T mx = kNegInf<T>;
        for (Index y = 0; y < logits.cols(); ++y)
          if (mass(y) > 0) mx = std::max(mx, logits(i, y));
        const T lse = mx + std::log(((logits.row(i).array() - mx).exp() * mass.transpose().array()).sum());
        e.row(i) = (logits.row(i).array() - lse).min(T(0)).exp();
      }
      op_ = std::make_unique<LowRankOperator<T>>(std::move(e), std::move(r), true);
    }
    return Status::Success;
  }
  const AttentionOperator<T>& do_op() const override { return *op_; }

 private:
  VqOptions o_;  // the spec's values, typed
  bool hard_ = true, both_ = false;
  double inertia_ = 0;
  Index iterations_ = 0;
  std::unique_ptr<AttentionOperator<T>> op_;
};

}  // namespace

MethodDescriptor VqOptions::descriptor() {
  return describe<VqMethod>(
      kName, "Transformer-VQ: keys quantized to a k-means codebook, exp(QCᵀ)(ΔᵀV); causal with assign=hard",
      "Lingle 2023 (Transformer-VQ): K ≈ ΔC, exp(QCᵀ)(ΔᵀV); soft (GMM) assignment after Su 2023, blog "
      "'Traces of Transformer-VQ in the Performer'",
      Causal::conditional("assign=hard, quantize=keys: the attention is causal; the codebook is fitted on all keys "
                          "(a look-ahead in the codebook)"),
      {ParamSpec::integer("codes", 64, 1, 1 << 20, "codebook size c").budget(),
       ParamSpec::integer("iters", 20, 0, 10000, "Lloyd iterations after k-means++"),
       ParamSpec::choice("assign", {"hard", "soft"}, "nearest code, or GMM responsibilities at temperature T"),
       ParamSpec::real("temperature", 1.0, 1e-12, 1e12, "T of the soft assignment"),
       ParamSpec::choice("quantize", {"keys", "both"}, "quantize K, or K and Q (mean-field form)"), ParamSpec::seed()})
      .with_size_check([](const Params& p, const ProblemSize& s) {
        require_budget_within("vq", "codes", p.integer("codes"), s.n_k, "n_k, the keys");
        if (p.choice("quantize") == "both")
          require_budget_within("vq", "codes", p.integer("codes"), s.n_q, "n_q, the queries");
      });
}

ATTNLAB_TYPED_METHOD_DEFINE(Vq)

}  // namespace attnlab
