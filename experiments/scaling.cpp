// `scaling` — wall-clock time and peak memory against n for every method at its default budget, with the speed-up
// and memory saving relative to exact attention measured in the same run (Nyströmformer Table 1, Linformer
// Table 3 analogues); the log-log slope per method is fitted by tools/plot.py. float32, as the papers.
// Time and memory by the library's cost harness (attnlab/cost.hpp): a warm-up call, then --repeats timed calls in
// steady state (minimum, median and largest recorded); memory in a separate untimed call on a fresh method object
// (peak − resident before: what the method allocated, inputs excluded). Sizes whose quadratic matrix would not fit
// are refused by the memory guard and recorded as such.
#include "common.hpp"

#include "attnlab/analysis/cost.hpp"

#include "attnlab/core/random.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

class Scaling final : public Experiment {
 public:
  void declare(Options& o) override {
    o.add("--n", n_, "sequence lengths")
        .preset({512, 1024, 2048, 4096}, {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536});
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--methods", methods_, "method specs (default: exact both ways and every method's default)")
        .separator(';')
        .preset({"exact:impl=materialized", "exact", "linear", "performer", "nystrom", "linformer:k=128", "vq",
                 "probsparse", "local", "reformer"});
    o.add("--repeats", repeats_, "timed repetitions after a warm-up call (minimum, median and largest kept)")
        .preset(5, 7);
  }
  std::vector<Point> grid() override {
    std::vector<Point> pts;
    for (Index n : n_)
      pts.push_back({fmt::format("n={} d={}", n, d_), [=] { return run(n); }});
    return pts;
  }

 private:
  std::vector<Row> run(Index n) const {
    Rng rng(1);
    const MatrixR<float> q = gaussian_matrix<float>(n, d_, rng), k = gaussian_matrix<float>(n, d_, rng),
                         v = gaussian_matrix<float>(n, d_, rng);
    std::vector<Row> rows;
    for (const auto& spec : methods_) {
      auto m = make_method<float>(spec);
      Row r;
      r.source = "gaussian";
      r.method = m->name();
      r.spec = m->spec();
      r.variant = spec;
      r.n = n;
      r.d = d_;
      CostOptions co;
      co.repeats = int(repeats_);
      const Cost c = measure_method<float>(spec, q, k, v, 0, {}, co);
      const auto add = [&](const std::string& metric, double value) {
        Row x = r;
        x.metric = metric;
        x.value = value;
        rows.push_back(x);
      };
      if (c.refused) {
        add("refused_memory", 1);
        continue;
      }
      add("time_s", c.min_s);
      add("time_median_s", c.median_s);
      add("time_max_s", c.max_s);
      add("peak_memory_bytes", double(c.peak_bytes));
    }
    return rows;
  }

  std::vector<Index> n_;
  Index d_ = 64, repeats_ = 5;
  std::vector<std::string> methods_;
};

}  // namespace

std::unique_ptr<Experiment> make_scaling_experiment() { return std::make_unique<Scaling>(); }

}  // namespace attnlab::experiments
