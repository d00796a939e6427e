// `error_vs_length` — error against n at a fixed budget: can Linformer's k and Nyström's m stay constant as n
// grows, as their papers claim (Linformer Theorem 2: k = O(log n / ε²) suffices), or not (Su 2020 doubts it: blog
// 'Exploring Linear Attention: Must Attention Have a Softmax?', §Linformer)?
// The Eckart–Young floor at the same rank is drawn in.
#include "common.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

class ErrorVsLength final : public Experiment {
 public:
  void declare(Options& o) override {
    o.add("--n", n_, "sequence lengths")
        .preset({256, 512, 1024, 2048}, {256, 512, 1024, 2048, 4096, 8192})
        .in_point_ids();
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--budget", budget_, "the fixed budget (rank, landmarks, k, features, codes)");
    o.add("--sources", sources_, "gaussian, clustered, lowrank")
        .preset({"gaussian", "clustered", "lowrank"})
        .in_point_ids();
    o.add("--methods", methods_, "method specs without the budget parameter")
        .separator(';')
        .preset({"svd:rank", "nystrom:landmarks", "linformer:projection=pool,k", "linformer:k", "performer:features",
                 "vq:codes"});
    o.add("--seeds", seeds_, "number of seeds")
        .preset(1, 3)
        .positive()
        .at_most(kMaxSeeds, "a grid point each")
        .in_point_ids();
  }
  std::vector<Point> grid() override {
    std::vector<Point> pts;
    for (const auto& src : sources_)
      for (Index n : n_)
        add_seed_points(pts, seeds_, fmt::format("source={} n={} d={} budget={}", src, n, d_, budget_),
                        [=](std::uint64_t s) { return run(src, n, s); });
    return pts;
  }

 private:
  std::vector<Row> run(const std::string& src, Index n, std::uint64_t seed) const {
    const Qkv<double> p = generated(src, n, d_, seed);
    const Reference<double> exact(p.q, p.k, p.v);
    std::vector<Row> rows;
    for (const auto& m : methods_) {
      if (budget_ > n) continue;
      // "name:param" or "name:fixed,...,param": the budget fills the last key.
      const std::string spec = m + "=" + std::to_string(budget_);
      const Row key = row_key(src, n, d_, seed, m, budget_);
      method_rows(rows, key, spec, p, exact, false);
    }
    return rows;
  }

  std::vector<Index> n_;
  Index d_ = 64, budget_ = 64, seeds_ = 1;
  std::vector<std::string> sources_, methods_;
};

}  // namespace

std::unique_ptr<Experiment> make_error_vs_length_experiment() { return std::make_unique<ErrorVsLength>(); }

}  // namespace attnlab::experiments
