// `error_vs_budget` — every method's error against its budget (landmarks, features, k, codes, window, ...), for
// several n, d and sources, every metric of the library, with the Eckart–Young floor (`svd:rank=R`) beside the
// rank-limited methods.
#include "common.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

struct Family {
  std::string label, spec, param;  // spec prefix (may hold fixed options), the budget parameter
  std::vector<Index> budgets;
};

std::vector<Family> families() {
  const std::vector<Index> ranks = {8, 16, 32, 64, 128};
  return {
      {"svd", "svd", "rank", ranks},
      {"nystrom", "nystrom", "landmarks", ranks},
      {"nystrom_svd", "nystrom:pinv=svd", "landmarks", ranks},
      {"linformer_pool", "linformer:projection=pool", "k", ranks},
      {"linformer_gaussian", "linformer:projection=gaussian", "k", ranks},
      {"cur", "cur", "columns", ranks},
      {"performer", "performer", "features", {16, 32, 64, 128, 256}},
      {"vq", "vq", "codes", ranks},
      {"local", "local", "window", {4, 8, 16, 32, 64}},
      {"reformer", "reformer:rounds=2", "chunk", {8, 16, 32, 64, 128}},
      {"probsparse", "probsparse", "factor", {1, 2, 5, 10, 20}},
      {"scatterbrain", "scatterbrain:features=64", "window", {4, 8, 16, 32, 64}},
  };
}

class ErrorVsBudget final : public Experiment {
 public:
  std::string name() const override { return "error_vs_budget"; }
  std::string question() const override { return "each method's error against its budget, with the Eckart–Young floor"; }
  void add_options(CLI::App& app) override {
    app.add_option("--n", n_, "sequence lengths")->delimiter(',');
    app.add_option("--d", d_, "head dimensions")->delimiter(',');
    app.add_option("--sources", sources_, "gaussian, clustered, lowrank")->delimiter(',');
    app.add_option("--families", families_, "method families (default: all)")->delimiter(',');
    app.add_option("--seeds", seeds_, "number of seeds");
    app.add_option("--spectral-limit", spectral_limit_, "compute spectral errors up to this n");
  }
  void apply_preset(const std::string& preset, const CLI::App& app) override {
    const bool paper = preset == "paper";
    if (!given(app, "--n")) n_ = paper ? std::vector<Index>{512, 2048} : std::vector<Index>{512};
    if (!given(app, "--d")) d_ = {64};
    if (!given(app, "--sources")) sources_ = {"gaussian", "clustered", "lowrank"};
    if (!given(app, "--seeds")) seeds_ = paper ? 3 : 1;
    if (!given(app, "--families")) {
      families_.clear();
      for (const auto& f : families()) families_.push_back(f.label);
    }
  }
  std::vector<std::pair<std::string, std::string>> settings() const override {
    return {{"n", csv_list(n_)}, {"d", csv_list(d_)}, {"sources", join(sources_)}, {"families", join(families_)},
            {"seeds", std::to_string(seeds_)}, {"spectral-limit", std::to_string(spectral_limit_)}};
  }
  std::vector<Point> grid() override {
    std::vector<Point> pts;
    const auto all = families();
    for (const auto& label : families_) {
      const auto it = std::find_if(all.begin(), all.end(), [&](const Family& f) { return f.label == label; });
      if (it == all.end()) {
        std::vector<std::string> names;
        for (const auto& f : all) names.push_back(f.label);
        throw Error(fmt::format("error_vs_budget: unknown family '{}'; valid: {}", label, join(names)));
      }
      for (const auto& src : sources_)
        for (Index n : n_)
          for (Index d : d_)
            for (Index s = 0; s < seeds_; ++s) {
              const Family f = *it;
              pts.push_back({fmt::format("family={} source={} n={} d={} seed={}", f.label, src, n, d, s),
                             [=] { return run(f, src, n, d, std::uint64_t(s)); }});
            }
    }
    return pts;
  }

 private:
  std::vector<Row> run(const Family& f, const std::string& src, Index n, Index d, std::uint64_t seed) const {
    SourceOptions so;
    so.kind = src;
    const Qkv<double> p = generate_problem<double>(so, n, n, d, d, seed);
    const ExactOperator<double> exact(p.q, p.k, {});
    const MatrixR<double> exact_out = exact_output<double>(p.q, p.k, p.v, {});
    std::vector<Row> rows;
    for (Index b : f.budgets) {
      if (b > n) continue;
      Row key;
      key.source = src;
      key.n = n;
      key.d = d;
      key.seed = seed;
      key.variant = f.label;
      key.step = b;
      const std::string spec = f.spec + (f.spec.find(':') == std::string::npos ? ":" : ",") + f.param + "=" +
                               std::to_string(b);
      method_rows(rows, key, spec, p.q, p.k, p.v, exact_out, exact, n <= spectral_limit_);
    }
    return rows;
  }

  std::vector<Index> n_, d_;
  std::vector<std::string> sources_, families_;
  Index seeds_ = 1, spectral_limit_ = 1024;
};

}  // namespace

std::unique_ptr<Experiment> make_error_vs_budget_experiment() { return std::make_unique<ErrorVsBudget>(); }

}  // namespace attnlab::experiments
