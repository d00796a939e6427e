// `regimes` — low-rank vs sparse vs sparse + low-rank against the entropy of the attention (Scatterbrain Fig. 1,
// Chen et al. 2021): a temperature sweep moves attention from sharp (low entropy, sparse-friendly) to diffuse
// (high entropy, low-rank-friendly). Methods at matched budgets: Performer (low-rank), Reformer and a local window
// (sparse), Scatterbrain (both), with the ideal rank-R approximation as reference. The heads of the trained and
// initialised transformer (`trained`, `initialized`: layer and head in their columns) are points at their own
// entropies.
#include "common.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

#include <cmath>

namespace attnlab::experiments {
namespace {

class Regimes final : public SourcesExperiment {
 public:
  void declare(Options& o) override {
    o.add("--n", n_, "sequence length").preset(512, 1024);
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--temperatures", temps_, "logit temperatures (small: sharp attention)")
        .preset({0.125, 0.25, 0.5, 1, 2, 4, 8})
        .in_point_ids();
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized, pretrained")
        .preset({"gaussian", "clustered", "trained", "pretrained"})
        .in_point_ids();
    o.add("--methods", methods_, "method specs at matched budgets")
        .separator(';')
        .preset({"svd:rank=64", "performer:features=64", "reformer:buckets=8,rounds=2,chunk=32", "local:window=32",
                 "scatterbrain:features=64,window=16"});
    declare_seeds_and_model(o, {"all"}, {"all"}, 1, 0);
  }

 private:
  void model_points(std::vector<Point>& pts, const std::string& src) const override {
    model_.add_head_points(pts, src, name(), [this](const ModelData& data, const ModelHead& h) {
      return evaluate(head_row(data, h), "", data.load(h), std::uint64_t(h.seq));
    });
  }
  void generated_points(std::vector<Point>& pts, const std::string& src) const override {
    for (double t : temps_)
      add_seed_points(pts, seeds_, fmt::format("source={} T={} n={} d={}", src, t, n_, d_),
                      [=](std::uint64_t s) { return run(src, t, s); });
  }
  std::vector<Row> run(const std::string& src, double t, std::uint64_t seed) const {
    return evaluate(source_row(src), fmt::format("T={}", t), generated(src, n_, d_, seed, t), seed);
  }
  std::vector<Row> evaluate(const Row& where, const std::string& variant, const Qkv<double>& p,
                            std::uint64_t seed) const {
    const Index n = p.q.rows();
    const Reference<double> exact(p.q, p.k, p.v);
    // Mean row entropy of P, −Σ_j P_ij log P_ij (nats), read block by block.
    const double entropy = row_stats(exact.op()).mean_entropy;
    std::vector<Row> rows;
    const Row key = row_key(where, n, p.q.cols(), seed, variant);
    {
      Row r = key;
      r.method = "exact";
      r.metric = "entropy";
      r.value = entropy;
      rows.push_back(r);
    }
    for (const auto& spec : methods_) method_rows(rows, key, spec, p, exact, false);
    return rows;
  }

  Index n_ = 512, d_ = 64;
  std::vector<double> temps_;
  std::vector<std::string> methods_;
};

}  // namespace

std::unique_ptr<Experiment> make_regimes_experiment() { return std::make_unique<Regimes>(); }

}  // namespace attnlab::experiments
