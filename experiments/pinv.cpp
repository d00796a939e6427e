// `pinv` — does Nyströmformer's iterative pseudo-inverse converge, how fast, and does it matter?
// Xiong et al. 2021 (Nyströmformer) Lemma 1 and eq. (16), the iteration of Razavi et al. 2014: ‖I − AZ_k‖_F and
// ‖Z_k − A⁺‖_F against k for the order-3 and Newton–Schulz iterations on the softmax landmark matrix
// A = softmax(s·Q̃K̃ᵀ), m = 8…512, with A's condition number; the iterations each needs to reach 1e-6; the measured
// convergence order; and Nyström's attention error as a function of the iteration count, against the SVD
// pseudo-inverse — on generated sources and on the heads of the trained and initialised transformer (`trained`,
// `initialized`; sequence, layer and head in their columns).
#include "attnlab/components/landmarks.hpp"
#include "attnlab/components/pinv.hpp"
#include "attnlab/components/spectrum.hpp"
#include "common.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

class PinvExperiment final : public SourcesExperiment {
 public:
  bool points_side_by_side() const override { return true; }  // it times nothing
  void declare(Options& o) override {
    o.add("--n", n_, "sequence lengths").preset({512}, {512, 4096}).in_point_ids();
    o.add("--m", m_, "landmark counts").preset({8, 32, 64, 128}, {8, 16, 32, 64, 128, 256, 512}).in_point_ids();
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--iters", iters_, "iterations of each pseudo-inverse iteration").preset(40, 60);
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized, pretrained")
        .preset({"gaussian", "clustered", "lowrank", "trained", "initialized", "pretrained"})
        .in_point_ids();
    declare_seeds_and_model(o, {"diagonal"}, {"all"}, 1, 1);
  }

 private:
  void model_points(std::vector<Point>& pts, const std::string& src) const override {
    model_.add_head_points(pts, src, name(), "m", m_, [this](const ModelData& data, const ModelHead& h, Index m) {
      return evaluate(head_row(data, h), data.load(h), m, std::uint64_t(h.seq));
    });
  }
  void generated_points(std::vector<Point>& pts, const std::string& src) const override {
    for (Index n : n_)
      for (Index m : m_)
        if (m <= n)
          add_seed_points(pts, seeds_, fmt::format("source={} n={} m={} d={}", src, n, m, d_),
                          [=](std::uint64_t s) { return run(src, n, m, s); });
  }
  std::vector<Row> run(const std::string& src, Index n, Index m, std::uint64_t seed) const {
    return evaluate(source_row(src), generated(src, n, d_, seed), m, seed);
  }
  std::vector<Row> evaluate(const Row& where, const Qkv<double>& p, Index m, std::uint64_t seed) const {
    const MatrixR<double> a =
        exact_matrix<double>(segment_means<double>(p.q, m), segment_means<double>(p.k, m), {});
    const VectorX<double> sv = singular_values<double>(a);
    const MatrixR<double> ref = svd_pinv<double>(a);
    std::vector<Row> rows;
    Row key = row_key(where, p.q.rows(), p.q.cols(), seed);
    key.method = "nystrom";
    const auto add = [&](const std::string& variant, Index step, const std::string& metric, double value) {
      Row r = key;
      r.variant = variant;
      r.step = step;
      r.spec = fmt::format("landmarks={}", m);
      r.metric = metric;
      r.value = value;
      rows.push_back(r);
    };
    add("", m, "cond", sv(0) / sv(sv.size() - 1));
    for (auto [variant, method] :
         {std::pair{"order3", PinvMethod::Order3}, std::pair{"newton", PinvMethod::NewtonSchulz}}) {
      Pseudoinverse<double> pi;
      pi.setMethod(method).setIterations(iters_).setReference(ref).compute(a);
      Index reached = -1;
      for (std::size_t k = 0; k < pi.residuals().size(); ++k) {
        add(variant, Index(k), "residual", pi.residuals()[k]);
        add(variant, Index(k), "pinv_error", pi.errors()[k]);
        if (reached < 0 && pi.residuals()[k] < 1e-6) reached = Index(k);
      }
      add(variant, m, "iterations_to_1e-6", reached >= 0 ? double(reached) : std::numeric_limits<double>::infinity());
      add(variant, m, "order", convergence_order(pi.residuals(), 1e-11, 1.0));
    }
    // Nyström's error against the iteration count (does an unconverged pseudo-inverse help?), and with the SVD.
    const Reference<double> exact(p.q, p.k, p.v);
    EvaluateOptions eo;
    eo.spectral = false;
    const auto nystrom = [&](const std::string& variant, Index k, const std::string& spec) {
      auto ny = make_method<double>(spec);
      const Evaluation e = attnlab::evaluate<double>(*ny, exact, eo);
      add(variant, k, "nystrom_out_rel_fro", *e.value("out_rel_fro"));
      add(variant, k, "nystrom_P_rel_fro", *e.value("P_rel_fro"));
    };
    for (Index k : {Index(0), Index(1), Index(2), Index(3), Index(4), Index(6), Index(8), Index(12), Index(16),
                    Index(24), Index(32), iters_}) {
      if (k > iters_) continue;
      for (const std::string pinv : {"iterative", "newton"})
        nystrom(pinv == "iterative" ? "order3" : "newton", k,
                fmt::format("nystrom:landmarks={},pinv={},iters={}", m, pinv, k));
    }
    nystrom("svd", -1, fmt::format("nystrom:landmarks={},pinv=svd", m));
    return rows;
  }

  std::vector<Index> n_, m_;
  Index d_ = 64, iters_ = 40;
};

}  // namespace

std::unique_ptr<Experiment> make_pinv_experiment() { return std::make_unique<PinvExperiment>(); }

}  // namespace attnlab::experiments
