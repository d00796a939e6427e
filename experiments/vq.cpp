// `vq` — Transformer-VQ (seed 002): error against codebook size; hard against soft assignment over the
// temperature T of the GMM responsibilities; and Performer as a soft VQ (the seed's reading: the random
// projections ω play the codebook) compared at equal numbers of codes and features, on Gaussian and clustered keys.
#include "common.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

class VqExperiment final : public Experiment {
 public:
  void declare(Options& o) override {
    o.add("--n", n_, "sequence length").preset(512, 2048);
    o.add("--d", d_, "head dimension");
    o.add("--codes", codes_, "codebook sizes (and Performer feature counts)").preset({8, 16, 32, 64, 128, 256});
    o.add("--temperatures", temps_, "soft-assignment temperatures").preset({0.1, 1, 10});
    o.add("--sources", sources_, "gaussian, clustered, lowrank").preset({"gaussian", "clustered"});
    o.add("--seeds", seeds_, "number of seeds").preset(1, 3);
  }
  std::vector<Point> grid() override {
    std::vector<Point> pts;
    for (const auto& src : sources_)
      for (Index c : codes_)
        for (Index s = 0; s < seeds_; ++s) {
          if (c > n_) continue;
          pts.push_back({fmt::format("source={} codes={} n={} d={} seed={}", src, c, n_, d_, s),
                         [=] { return run(src, c, std::uint64_t(s)); }});
        }
    return pts;
  }

 private:
  std::vector<Row> run(const std::string& src, Index c, std::uint64_t seed) const {
    const Qkv<double> p = generated(src, n_, d_, seed);
    const Reference exact(p);
    std::vector<Row> rows;
    const Row key = row_key(src, n_, d_, seed, "", c);
    const auto add = [&](const std::string& variant, const std::string& spec) {
      Row k = key;
      k.variant = variant;
      method_rows(rows, k, spec, p, exact, false);
    };
    add("hard", fmt::format("vq:codes={}", c));
    for (double t : temps_) add(fmt::format("soft T={}", t), fmt::format("vq:codes={},assign=soft,temperature={}", c, t));
    add("both (mean-field)", fmt::format("vq:codes={},quantize=both", c));
    add("performer", fmt::format("performer:features={}", c));
    return rows;
  }

  Index n_ = 512, d_ = 64, seeds_ = 1;
  std::vector<Index> codes_;
  std::vector<double> temps_;
  std::vector<std::string> sources_;
};

}  // namespace

std::unique_ptr<Experiment> make_vq_experiment() { return std::make_unique<VqExperiment>(); }

}  // namespace attnlab::experiments
