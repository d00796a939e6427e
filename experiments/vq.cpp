// `vq` — Transformer-VQ (seed 002): error against codebook size; hard against soft assignment over the
// temperature T of the GMM responsibilities; and Performer as a soft VQ (the seed's reading: the random
// projections ω play the codebook) compared at equal numbers of codes and features, on Gaussian and clustered keys.
#include "common.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

class VqExperiment final : public Experiment {
 public:
  std::string name() const override { return "vq"; }
  std::string question() const override { return "Transformer-VQ against codebook size, soft vs hard, vs Performer"; }
  void add_options(CLI::App& app) override {
    app.add_option("--n", n_, "sequence length");
    app.add_option("--d", d_, "head dimension");
    app.add_option("--codes", codes_, "codebook sizes (and Performer feature counts)")->delimiter(',');
    app.add_option("--temperatures", temps_, "soft-assignment temperatures")->delimiter(',');
    app.add_option("--sources", sources_, "gaussian, clustered, lowrank")->delimiter(',');
    app.add_option("--seeds", seeds_, "number of seeds");
  }
  void apply_preset(const std::string& preset, const CLI::App& app) override {
    const bool paper = preset == "paper";
    if (!given(app, "--n")) n_ = paper ? 2048 : 512;
    if (!given(app, "--codes")) codes_ = {8, 16, 32, 64, 128, 256};
    if (!given(app, "--temperatures")) temps_ = {0.1, 1, 10};
    if (!given(app, "--sources")) sources_ = {"gaussian", "clustered"};
    if (!given(app, "--seeds")) seeds_ = paper ? 3 : 1;
  }
  std::vector<std::pair<std::string, std::string>> settings() const override {
    const std::string t = csv_list(temps_);
    return {{"n", std::to_string(n_)}, {"d", std::to_string(d_)}, {"codes", csv_list(codes_)},
            {"temperatures", t}, {"sources", join(sources_)}, {"seeds", std::to_string(seeds_)}};
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
    const ExactOperator<double> exact(p.q, p.k, {});
    const MatrixR<double> exact_out = exact_output<double>(p.q, p.k, p.v, {});
    std::vector<Row> rows;
    const Row key = row_key(src, n_, d_, seed, "", c);
    const auto add = [&](const std::string& variant, const std::string& spec) {
      Row k = key;
      k.variant = variant;
      method_rows(rows, k, spec, p.q, p.k, p.v, exact_out, exact, false);
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
