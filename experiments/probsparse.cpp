// `probsparse` — Informer's query sparsity measurement (Zhou et al. 2021, Informer, Lemma 1): M against its
// max-mean estimate M̄ with Lemma 1's bounds M̄ ≤ M ≤ M̄ + ln n_k (over the same keys); the recall of the true top-u
// queries (by M) when ranking by the sampled M̄, against the factor c and the number of sampled keys; the output
// error against c; and the (long-tailed) distribution of M as quantiles — on generated sources and on the heads of
// the trained and initialised transformer (`trained`, `initialized`; sequence, layer and head in their columns).
#include "attnlab/components/sparsity_measure.hpp"
#include "common.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace attnlab::experiments {
namespace {

class ProbSparseExperiment final : public SourcesExperiment {
 public:
  void declare(Options& o) override {
    o.add("--n", n_, "sequence lengths").preset({512, 2048}, {512, 2048, 8192}).in_point_ids();
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--factors", factors_, "sampling factors c").preset({1, 2, 3, 5, 8, 12});
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized, pretrained")
        .preset({"gaussian", "clustered", "lowrank", "trained", "initialized", "pretrained"})
        .in_point_ids();
    declare_seeds_and_model(o, {"all"}, {"all"}, 1, 0);
  }

 private:
  void model_points(std::vector<Point>& pts, const std::string& src) const override {
    model_.add_head_points(pts, src, name(), [this](const ModelData& data, const ModelHead& h) {
      return evaluate(head_row(data, h), data.load(h), std::uint64_t(h.seq));
    });
  }
  void generated_points(std::vector<Point>& pts, const std::string& src) const override {
    for (Index n : n_)
      add_seed_points(pts, seeds_, fmt::format("source={} n={} d={}", src, n, d_),
                      [=](std::uint64_t s) { return run(src, n, s); });
  }
  std::vector<Row> run(const std::string& src, Index n, std::uint64_t seed) const {
    return evaluate(source_row(src), generated(src, n, d_, seed), seed);
  }
  std::vector<Row> evaluate(const Row& where, const Qkv<double>& p, std::uint64_t seed) const {
    const Index n = p.q.rows();
    Rng rng(seed);
    const VectorX<double> m = sparsity_measure<double>(p.q, p.k, {}, SparsityMeasure::Lse, 0, rng);
    const VectorX<double> mbar = sparsity_measure<double>(p.q, p.k, {}, SparsityMeasure::MaxMean, 0, rng);
    std::vector<Row> rows;
    Row key = row_key(where, n, p.q.cols(), seed);
    key.method = "probsparse";
    const auto add = [&](const std::string& variant, Index step, const std::string& metric, double value) {
      Row r = key;
      r.variant = variant;
      r.step = step;
      r.metric = metric;
      r.value = value;
      rows.push_back(r);
    };
    // Lemma 1 over all keys: the share of queries for which each bound holds (1 unless something is wrong).
    Index lower = 0, upper = 0;
    for (Index i = 0; i < n; ++i) {
      lower += mbar(i) <= m(i) + 1e-12;
      upper += m(i) <= mbar(i) + std::log(double(n)) + 1e-12;
    }
    add("full", -1, "lemma1_lower_holds", double(lower) / double(n));
    add("full", -1, "lemma1_upper_holds", double(upper) / double(n));
    add("full", -1, "corr_M_Mbar", correlation(m, mbar));
    // The distribution of M: quantiles (the long tail Informer builds on).
    VectorX<double> sorted = m;
    std::sort(sorted.data(), sorted.data() + sorted.size());
    for (int q : {1, 5, 10, 25, 50, 75, 90, 95, 99})
      add("full", q, "M_quantile", sorted(std::min<Index>(n - 1, Index(double(q) / 100.0 * double(n)))));
    const Reference<double> exact(p.q, p.k, p.v);
    for (double c : factors_) {
      const Index u = probsparse_u(n, c), samples = probsparse_default_samples(n, c);
      const std::vector<Index> truth = select_queries(m, u, false);
      const std::set<Index> truth_set(truth.begin(), truth.end());
      Rng r2(seed + 17);
      const VectorX<double> sampled = sparsity_measure<double>(p.q, p.k, {}, SparsityMeasure::MaxMean, samples, r2);
      for (const auto& [variant, measure] : {std::pair<std::string, const VectorX<double>*>{"full M̄", &mbar},
                                             std::pair<std::string, const VectorX<double>*>{"sampled M̄", &sampled}}) {
        Index hit = 0;
        for (Index i : select_queries(*measure, u, false)) hit += truth_set.count(i);
        add(variant, Index(std::lround(c * 100)), "top_u_recall", double(hit) / double(u));
      }
      Row k2 = key;
      k2.variant = "method";
      k2.step = Index(std::lround(c * 100));  // c × 100, as an integer step
      method_rows(rows, k2, fmt::format("probsparse:factor={},seed={}", c, seed), p, exact, false);
    }
    return rows;
  }
  static double correlation(const VectorX<double>& a, const VectorX<double>& b) {
    const VectorX<double> x = a.array() - a.mean(), y = b.array() - b.mean();
    return x.dot(y) / std::sqrt(x.squaredNorm() * y.squaredNorm());
  }

  std::vector<Index> n_;
  Index d_ = 64;
  std::vector<double> factors_;
};

}  // namespace

std::unique_ptr<Experiment> make_probsparse_experiment() { return std::make_unique<ProbSparseExperiment>(); }

}  // namespace attnlab::experiments
