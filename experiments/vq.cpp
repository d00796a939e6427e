// `vq` — Transformer-VQ (Lingle 2023): error against codebook size; hard against soft assignment over the
// temperature T of the GMM responsibilities; and Performer as a soft VQ (Su 2023's reading, blog 'Traces of
// Transformer-VQ in the Performer': the random projections ω play the codebook) compared at equal numbers of codes
// and features, on Gaussian and clustered keys —
// and on the heads of the exported model or the user's files (--q/--k/--v), one point per head and codebook size.
#include "common.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

class VqExperiment final : public SourcesExperiment {
 public:
  void declare(Options& o) override {
    o.add("--n", n_, "sequence length").preset(512, 2048);
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--codes", codes_, "codebook sizes (and Performer feature counts)")
        .preset({8, 16, 32, 64, 128, 256})
        .in_point_ids();
    o.add("--temperatures", temps_, "soft-assignment temperatures").preset({0.1, 1, 10});
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized")
        .preset({"gaussian", "clustered"})
        .in_point_ids();
    declare_seeds_and_model(o, {"diagonal"}, {"all"}, 1, 1);
  }

 private:
  void model_points(std::vector<Point>& pts, const std::string& src) const override {
    model_.add_head_points(pts, src, name(), "codes", codes_,
                           [this](const ModelData& data, const ModelHead& h, Index c) {
                             return evaluate(head_row(data, h), data.load(h), c, std::uint64_t(h.seq));
                           });
  }
  void generated_points(std::vector<Point>& pts, const std::string& src) const override {
    for (Index c : codes_)
      if (c <= n_)
        add_seed_points(pts, seeds_, fmt::format("source={} codes={} n={} d={}", src, c, n_, d_),
                        [=](std::uint64_t s) { return run(src, c, s); });
  }
  std::vector<Row> run(const std::string& src, Index c, std::uint64_t seed) const {
    return evaluate(source_row(src), generated(src, n_, d_, seed), c, seed);
  }
  std::vector<Row> evaluate(const Row& where, const Qkv<double>& p, Index c, std::uint64_t seed) const {
    const Reference<double> exact(p.q, p.k, p.v);
    std::vector<Row> rows;
    const Row key = row_key(where, p.q.rows(), p.q.cols(), seed, "", c);
    const auto add = [&](const std::string& variant, const std::string& spec) {
      Row k = key;
      k.variant = variant;
      method_rows(rows, k, spec, p, exact, false);
    };
    add("hard", fmt::format("vq:codes={}", c));
    for (double t : temps_)
      add(fmt::format("soft T={}", t), fmt::format("vq:codes={},assign=soft,temperature={}", c, t));
    add("both (mean-field)", fmt::format("vq:codes={},quantize=both", c));
    add("performer", fmt::format("performer:features={}", c));
    return rows;
  }

  Index n_ = 512, d_ = 64;
  std::vector<Index> codes_;
  std::vector<double> temps_;
};

}  // namespace

std::unique_ptr<Experiment> make_vq_experiment() { return std::make_unique<VqExperiment>(); }

}  // namespace attnlab::experiments
