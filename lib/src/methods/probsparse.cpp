// `probsparse` — Informer's ProbSparse self-attention (Zhou et al. 2021 eqs. (3)-(4), Lemma 1; seed 004): the u
// queries with the largest sparsity measure get exact softmax rows; the other ("lazy") queries get mean(V) — a
// uniform row of P̃. Causal: exact rows are masked; lazy rows get the mean of V over the visible keys
// (lazy=mean) or the reference code's unnormalized cumulative sum of V (lazy=cumsum: P̃'s row is all ones on the
// visible keys, not a distribution — documented as the reference's behaviour, Informer2020 issue #633).
// M̄ averages over the sampled keys; the reference code divides the sampled sum by n_k instead (ANCHORS.md), which
// shifts every M̄ by a query-dependent amount: attnlab follows the paper's definition.
#include "attnlab/probsparse.hpp"

#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/methods/probsparse.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <queue>

namespace attnlab {

Index probsparse_u(Index n_q, double factor) {
  return std::min<Index>(n_q, std::max<Index>(1, Index(factor * std::ceil(std::log(double(n_q))))));
}

Index probsparse_default_samples(Index n_k, double factor) {
  return std::max<Index>(1, Index(factor * std::ceil(std::log(double(n_k)))));
}

template <typename T>
VectorX<double> sparsity_measure(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                                 SparsityMeasure kind, Index samples, Rng& rng) {
  validate_qk(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  const double s = opts.resolved_scale(q.cols());
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  VectorX<double> m(nq);
  // The sampled keys of every query drawn first, in query order (the same draws as one query at a time), so that the
  // measure can then be computed in parallel over queries: each thread's gathered rows of K are cache misses at
  // large n, and two threads keep twice as many in flight.
  const bool sampled = samples > 0 && kind == SparsityMeasure::MaxMean;
  std::vector<Index> idx(sampled ? std::size_t(nq) * std::size_t(samples) : 0);
  if (sampled)
    for (Index i = 0; i < nq; ++i) {
      const Index visible = opts.causal ? i + off + 1 : nk;
      for (Index t = 0; t < samples; ++t) idx[std::size_t(i * samples + t)] = Index(rng.below(std::uint64_t(visible)));
    }
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < nq; ++i) {
    const Index visible = opts.causal ? i + off + 1 : nk;
    VectorX<double> logits;
    if (sampled) {
      logits.resize(samples);
      for (Index t = 0; t < samples; ++t)
        logits(t) = s * double(q.row(i).dot(k.row(idx[std::size_t(i * samples + t)])));
    } else {
      logits = (k.topRows(visible) * q.row(i).transpose()).template cast<double>() * s;
    }
    const double mx = logits.maxCoeff(), mean = logits.mean();
    m(i) = kind == SparsityMeasure::MaxMean ? mx - mean : mx + std::log((logits.array() - mx).exp().sum()) - mean;
  }
  return m;
}

std::vector<Index> select_queries(const VectorX<double>& measure, Index u, bool causal) {
  const Index n = measure.size();
  std::vector<Index> sel;
  if (!causal) {
    std::vector<Index> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), Index(0));
    std::stable_sort(order.begin(), order.end(), [&](Index a, Index b) { return measure(a) > measure(b); });
    sel.assign(order.begin(), order.begin() + std::min(u, n));
  } else {
    std::priority_queue<double, std::vector<double>, std::greater<>> best;  // the u largest so far
    for (Index i = 0; i < n; ++i) {
      if (Index(best.size()) < u || measure(i) > best.top()) {
        sel.push_back(i);
        best.push(measure(i));
        if (Index(best.size()) > u) best.pop();
      }
    }
  }
  std::sort(sel.begin(), sel.end());
  return sel;
}

template VectorX<double> sparsity_measure<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                 const AttentionOptions&, SparsityMeasure, Index, Rng&);
template VectorX<double> sparsity_measure<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                  const AttentionOptions&, SparsityMeasure, Index, Rng&);

namespace {

/// Exact rows for the selected queries, uniform (mean) or all-ones (cumsum) rows on the visible keys elsewhere.
template <typename T>
class ProbSparseOperator final : public AttentionOperator<T> {
 public:
  ProbSparseOperator(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                     std::vector<Index> selected, bool cumsum)
      : nq_(q.rows()), nk_(k.rows()), causal_(opts.causal), cumsum_(cumsum && opts.causal), selected_(selected),
        is_selected_(static_cast<std::size_t>(q.rows()), false) {
    off_ = nk_ - nq_;
    for (Index i : selected_) is_selected_[std::size_t(i)] = true;
    MatrixR<T> qs(Index(selected_.size()), q.cols());
    for (std::size_t r = 0; r < selected_.size(); ++r) qs.row(Index(r)) = q.row(selected_[r]);
    exact_.emplace(qs, k, opts, kDefaultTile, QueryLayout{selected_, nq_});
  }
  Index rows() const override { return nq_; }
  Index cols() const override { return nk_; }
  bool rows_are_distributions() const override { return !cumsum_; }

  /// Lazy rows' weight on each visible key.
  T lazy_weight(Index i) const { return cumsum_ ? T(1) : T(1) / T(visible(i)); }
  Index visible(Index i) const { return causal_ ? i + off_ + 1 : nk_; }

  /// Y_i = Σ_{visible j} w_i x_j for the lazy rows; selected rows are left for the caller.
  MatrixR<T> lazy_apply(const ConstRef<T>& x) const {
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

  MatrixR<T> apply(const ConstRef<T>& x) const override {
    require(x.rows() == nk_, "apply: dimension mismatch");
    MatrixR<T> y = lazy_apply(x);
    if (!selected_.empty()) scatter(exact_->apply(x), y);
    return y;
  }

  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override {
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

  MatrixR<T> row_block(Index first, Index count) const override {
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

  /// The fast path: exact rows by the streaming kernel (no log-sum-exp pass), lazy rows by (prefix) sums.
  MatrixR<T> output(const ConstRef<T>& v) const {
    MatrixR<T> y = lazy_apply(v);
    if (!selected_.empty())
      scatter(exact_output<T>(exact_->queries(), exact_->keys(), v, exact_->options(), kDefaultTile,
                              QueryLayout{selected_, nq_}),
              y);
    return y;
  }
  Index selected() const { return Index(selected_.size()); }

 private:
  void scatter(const MatrixR<T>& rows, MatrixR<T>& y) const {
    for (std::size_t r = 0; r < selected_.size(); ++r) y.row(selected_[r]) = rows.row(Index(r));
  }
  Index nq_, nk_, off_ = 0;
  bool causal_, cumsum_;
  std::vector<Index> selected_;
  std::vector<bool> is_selected_;
  std::optional<ExactOperator<T>> exact_;
};

template <typename T>
class ProbSparseMethod final : public Method<T> {
 public:
  using Method<T>::Method;
  std::vector<std::pair<std::string, double>> diagnostics() const override {
    return {{"selected_queries", op_ ? double(op_->selected()) : 0.0}};
  }

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    const ProbsparseOptions o = ProbsparseOptions::from(this->params());  // the spec's values, typed
    const double c = o.factor;
    const bool lse = o.measure == "lse";
    Index samples = 0;  // all keys
    if (!lse && o.sample == "random") {
      samples = o.samples;
      if (samples == 0) samples = probsparse_default_samples(k.rows(), c);
    }
    Rng rng(o.seed);
    const VectorX<double> m =
        sparsity_measure<T>(q, k, opts, lse ? SparsityMeasure::Lse : SparsityMeasure::MaxMean, samples, rng);
    op_.emplace(q, k, opts, select_queries(m, probsparse_u(q.rows(), c), opts.causal),
                o.lazy == "cumsum");
    return Status::Success;
  }
  const AttentionOperator<T>& do_op() const override { return *op_; }
  MatrixR<T> do_output(const ConstRef<T>& v) const override { return op_->output(v); }

 private:
  std::optional<ProbSparseOperator<T>> op_;
};

}  // namespace

MethodDescriptor ProbsparseOptions::descriptor() {
  return describe<ProbSparseMethod>(
      kName, "Informer ProbSparse: exact rows for the top-u queries by sparsity measure, mean(V) for the rest",
      "Zhou et al. 2021 (Informer) eqs. (2)-(4), Lemma 1",
      Causal::yes("online top-u selection (query i is exact when its measure is among the u largest so far)"),
      {ParamSpec::real("factor", 5, 1e-3, 1e9, "sampling factor c: u = c·⌈ln n_q⌉ queries, U = c·⌈ln n_k⌉ keys")
           .budget(),
       ParamSpec::integer("samples", 0, 0, 1 << 30, "keys sampled per query for M̄ (0: c·⌈ln n_k⌉)"),
       ParamSpec::choice("sample", {"random", "full"}, "M̄ on sampled keys (with replacement) or on all keys"),
       ParamSpec::choice("measure", {"maxmean", "lse"}, "M̄ = max − mean (the paper's estimate) or M = LSE − mean"),
       ParamSpec::choice("lazy", {"mean", "cumsum"},
                         "causal lazy rows: mean of visible V, or the reference's unnormalized cumulative sum"),
       ParamSpec::seed()});
}

ATTNLAB_TYPED_METHOD_DEFINE(Probsparse)

}  // namespace attnlab
