// `error_vs_budget` — every method's error against its budget (landmarks, features, k, codes, window, ...), for
// several n, d and sources, every metric of the library, with the Eckart–Young floor (`svd:rank=R`) beside the
// rank-limited methods; and its cost as a user runs it (float32 time per call, best of --repeats, peak memory, and
// the speed-up over exact streaming attention timed in the same point), for the error-against-cost figure — every
// family but the SVD floor, which is a reference, not a method to run (BudgetFamily::measure_cost). Sources:
// generated, the trained/initialised transformer's heads (`trained`, `initialized`: the source column names the
// model, the sequence, layer and head columns the head; docs/reproducing.md: "Results files"), the causal model's
// (`trained_causal`: only the causal-capable families, with the causal mask — its heads never saw the future) and the
// user's .npy files.
#include "attnlab/io/npy.hpp"
#include "attnlab/analysis/budget_families.hpp"
#include "common.hpp"
#include "attnlab/analysis/cost.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

#include <map>

namespace attnlab::experiments {
namespace {

using Family = BudgetFamily;
const auto families = budget_families;

class ErrorVsBudget final : public Experiment {
 public:
  void declare(Options& o) override {
    std::vector<std::string> all_families;
    for (const auto& f : families()) all_families.push_back(f.label);
    o.add("--n", n_, "sequence lengths").preset({512}, {512, 2048}).in_point_ids();
    o.add("--d", d_, "head dimensions").preset({64}).positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized, trained_causal, pretrained")
        .preset({"gaussian", "clustered", "lowrank", "trained", "initialized", "pretrained"})
        .in_point_ids();
    o.add("--families", families_, "method families (default: all)").preset(all_families);
    o.add("--seeds", seeds_, "number of seeds")
        .preset(1, 3)
        .positive()
        .at_most(kMaxSeeds, "a grid point each")
        .in_point_ids();
    o.add("--spectral-limit", spectral_limit_, "compute spectral errors up to this n");
    o.add("--repeats", repeats_, "timed float32 repetitions per method for the cost (0: no cost rows)");
    // Quick: one head per layer (the diagonal) of one sequence; paper: every head of every exported sequence.
    // Also --q/--k/--v: the user's files, source 'files' (the head in the head column), one point per head.
    model_.declare(o, {"diagonal"}, {"all"}, 1, 0);
  }
  std::vector<Point> grid() override {
    std::vector<Point> pts;
    const auto all = families();
    // Each model source is opened (meta.json, shapes) once, not once per family.
    std::map<std::string, std::pair<std::shared_ptr<const ModelData>, std::vector<ModelHead>>> models;
    for (const auto& src : sources_)
      if (ModelData::is_model_source(src))
        models.emplace(src, src == "trained_causal" ? model_.open(src) : model_.open_bidirectional(src, name()));
    for (const auto& label : families_) {
      const auto it = std::find_if(all.begin(), all.end(), [&](const Family& f) { return f.label == label; });
      if (it == all.end()) {
        std::vector<std::string> names;
        for (const auto& f : all) names.push_back(f.label);
        throw Error(fmt::format("error_vs_budget: unknown family '{}'; valid: {}", label, join(names)));
      }
      for (const auto& src : sources_) {
        if (ModelData::is_model_source(src)) {
          const auto& [data, heads] = models.at(src);
          AttentionOptions opts;
          opts.causal = !data->bidirectional();
          // A causal model's heads get the causal-capable families only (the others would use the future).
          if (opts.causal && !find_method(it->spec.substr(0, it->spec.find(':'))).causal) continue;
          for (const ModelHead& h : heads) {
            const Family f = *it;
            pts.push_back({fmt::format("family={} {}", f.label, data->point_id(h)), [=, data = data] {
                             return evaluate(f, head_row(*data, h), data->load(h), std::uint64_t(h.seq), opts);
                           }});
          }
          continue;
        }
        for (Index n : n_)
          for (Index d : d_) {
            const Family f = *it;
            add_seed_points(pts, seeds_, fmt::format("family={} source={} n={} d={}", f.label, src, n, d),
                            [=](std::uint64_t s) { return run(f, src, n, d, s); });
          }
      }
    }
    return pts;
  }

 private:
  std::vector<Row> run(const Family& f, const std::string& src, Index n, Index d, std::uint64_t seed) const {
    return evaluate(f, source_row(src), generated(src, n, d, seed), seed);
  }
  std::vector<Row> evaluate(const Family& f, const Row& where, const Qkv<double>& p, std::uint64_t seed,
                            const AttentionOptions& opts = {}) const {
    const Reference<double> exact(p.q, p.k, p.v, opts);
    const Index n = std::min(p.q.rows(), p.k.rows());
    std::vector<Row> rows;
    // Cost in float32, as users run it; exact streaming attention timed in the same point gives the speed-up.
    const MatrixR<float> qf = p.q.cast<float>(), kf = p.k.cast<float>(), vf = p.v.cast<float>();
    CostOptions co;
    co.repeats = int(std::max<Index>(1, repeats_));
    const Cost exact_cost = repeats_ > 0 ? measure_method<float>("exact", qf, kf, vf, seed, opts, co) : Cost{};
    for (Index b : f.budgets) {
      if (b > n) continue;
      const Row key = row_key(where, p.q.rows(), p.q.cols(), seed, f.label, b);
      const std::string spec = f.spec_at(b);
      method_rows(rows, key, spec, p, exact, p.q.rows() <= spectral_limit_);
      if (repeats_ == 0 || !f.measure_cost) continue;  // no cost asked for, or a reference (the SVD floor)
      const Cost c = measure_method<float>(spec, qf, kf, vf, seed, opts, co);
      if (c.refused) continue;  // the memory guard refused the size
      Row r = rows.back();      // same identifying columns as the method's rows
      for (const auto& [metric, value] : {std::pair<const char*, double>{"cost_time_s", c.min_s},
                                          {"cost_time_median_s", c.median_s},
                                          {"cost_peak_memory_bytes", double(c.peak_bytes)},
                                          {"cost_speedup_vs_exact", speedup(exact_cost.min_s, c.min_s)}}) {
        r.metric = metric;
        r.value = value;
        rows.push_back(r);
      }
    }
    return rows;
  }
  std::vector<Index> n_, d_;
  std::vector<std::string> sources_, families_;
  Index seeds_ = 1, spectral_limit_ = 1024, repeats_ = 3;
  ModelOptions model_;
};

}  // namespace

std::unique_ptr<Experiment> make_error_vs_budget_experiment() { return std::make_unique<ErrorVsBudget>(); }

}  // namespace attnlab::experiments
