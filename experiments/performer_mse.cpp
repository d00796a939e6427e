// `performer_mse` — Performer Fig. 4 and Fig. 2 (Choromanski et al. 2021): the kernel estimate's MSE against the
// number of random features M for iid/orthogonal × positive/trig/hyperbolic features, against Lemma 2's closed
// forms (iid):
//   MSE_trig = (1/2M)·e^{‖x‖²+‖y‖²}·(1 − e^{−‖x−y‖²})²,   MSE_+ = (1/M)·e^{2xᵀy}·(e^{‖x+y‖²} − 1),
//   MSE_hyp = ½(1 − e^{−‖x+y‖²})·MSE_+;
// the attention output's MSE at L = 4096, d = 16 (Fig. 4); and the closed-form ratio MSE_trig/MSE_+ over the
// angle between x and y and their length (Fig. 2), which explodes where the kernel value is small.
#include "attnlab/components/random_features.hpp"
#include "common.hpp"

#include <fmt/format.h>

#include <cmath>

namespace attnlab::experiments {
namespace {

class PerformerMse final : public Experiment {
 public:
  bool points_side_by_side() const override { return true; }  // it times nothing
  void declare(Options& o) override {
    o.add("--length", length_, "sequence length L").preset(1024, 4096);
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--features", features_, "numbers of random features M").preset({16, 32, 64, 128, 256});
    o.add("--draws", draws_, "independent feature draws per point").preset(12, 50);
    o.add("--pairs", pairs_, "(q, k) pairs whose kernel MSE is averaged");
  }
  std::vector<Point> grid() override {
    std::vector<Point> pts;
    for (const char* kernel : {"positive", "trig", "hyperbolic"})
      for (bool orth : {false, true})
        for (Index m : features_)
          pts.push_back({fmt::format("kernel={} orthogonal={} M={} L={} d={}", kernel, orth, m, length_, d_),
                         [=] { return run(kernel, orth, m); }});
    pts.push_back({fmt::format("ratio_grid d={}", d_), [=] { return ratio_grid(); }});
    return pts;
  }

 private:
  static double lemma2(const std::string& kernel, const VectorX<double>& x, const VectorX<double>& y, double m) {
    const double pos = std::exp(2 * x.dot(y)) * std::expm1((x + y).squaredNorm()) / m;
    if (kernel == "positive") return pos;
    if (kernel == "hyperbolic") return 0.5 * -std::expm1(-(x + y).squaredNorm()) * pos;
    const double t = -std::expm1(-(x - y).squaredNorm());
    return std::exp(x.squaredNorm() + y.squaredNorm()) * t * t / (2 * m);
  }
  std::vector<Row> run(const std::string& kernel, bool orth, Index m) const {
    // Performer Fig. 4's setting: q, k ~ N(0, I_d) entries, scaled by d^{-1/4} each (x = s^½·q, s = 1/√d).
    SourceOptions so;
    const Qkv<double> p = generate_problem<double>(so, length_, length_, d_, d_, 12345);
    const double root = std::pow(double(d_), -0.25);
    const MatrixR<double> x = p.q * root, y = p.k * root;
    const MatrixR<double> exact_out = exact_output<double>(p.q, p.k, p.v, {});
    const PerformerKernel pk = kernel == "trig" ? PerformerKernel::Trig
                               : kernel == "hyperbolic" ? PerformerKernel::Hyperbolic : PerformerKernel::Positive;
    double kernel_se = 0, out_mse = 0, out_rel = 0;
    for (Index t = 0; t < draws_; ++t) {
      Rng rng(std::uint64_t(1000 + t));
      const MatrixR<double> w = performer_projection<double>(m, d_, orth, true, rng);
      const auto fx = performer_features<double>(x.topRows(pairs_), w, pk);
      const auto fy = performer_features<double>(y.topRows(pairs_), w, pk);
      for (Index i = 0; i < pairs_; ++i) {  // pair (x_i, y_i)
        const double est = std::exp(fx.logscale(i) + fy.logscale(i)) * fx.f.row(i).dot(fy.f.row(i));
        const double truth = std::exp(x.row(i).dot(y.row(i)));
        kernel_se += (est - truth) * (est - truth);
      }
      auto method = make_method<double>(fmt::format("performer:features={},kernel={},orthogonal={},seed={}", m,
                                                    kernel, orth ? "true" : "false", 1000 + t));
      method->compute(p.q, p.k);
      const MatrixR<double> out = method->output(p.v);
      out_mse += (out - exact_out).squaredNorm() / double(out.size());
      out_rel += output_errors<double>(exact_out, out).rel_fro;
    }
    double theory = 0;
    for (Index i = 0; i < pairs_; ++i) theory += lemma2(kernel, x.row(i).transpose(), y.row(i).transpose(), double(m));
    std::vector<Row> rows;
    const auto add = [&](const std::string& metric, double value) {
      Row r;
      r.source = "gaussian";
      r.method = "performer";
      r.spec = fmt::format("kernel={},orthogonal={}", kernel, orth ? "true" : "false");
      r.variant = fmt::format("{}/{}", orth ? "orthogonal" : "iid", kernel);
      r.n = length_;
      r.d = d_;
      r.step = m;
      r.metric = metric;
      r.value = value;
      rows.push_back(r);
    };
    add("kernel_mse", kernel_se / double(draws_ * pairs_));
    add("kernel_mse_lemma2_iid", theory / double(pairs_));
    add("output_mse", out_mse / double(draws_));
    add("out_rel_fro", out_rel / double(draws_));
    return rows;
  }
  std::vector<Row> ratio_grid() const {
    // MSE_trig / MSE_+ for ‖x‖ = ‖y‖ = r at angle θ (Fig. 2): closed form, M cancels.
    std::vector<Row> rows;
    for (int a = 0; a <= 36; ++a)
      for (int l = 1; l <= 20; ++l) {
        const double theta = M_PI * a / 36.0, r = 0.1 * l;
        VectorX<double> x = VectorX<double>::Zero(2), y = VectorX<double>::Zero(2);
        x(0) = r;
        y(0) = r * std::cos(theta);
        y(1) = r * std::sin(theta);
        Row row;
        row.source = "closed_form";
        row.method = "performer";
        row.variant = fmt::format("r={:.1f}", r);
        row.d = 2;
        row.step = a * 5;  // the angle in degrees
        row.metric = "mse_ratio_trig_over_positive";
        row.value = lemma2("trig", x, y, 1) / lemma2("positive", x, y, 1);
        rows.push_back(row);
      }
    return rows;
  }

  Index length_ = 1024, d_ = 16, draws_ = 12, pairs_ = 256;
  std::vector<Index> features_;
};

}  // namespace

std::unique_ptr<Experiment> make_performer_mse_experiment() { return std::make_unique<PerformerMse>(); }

}  // namespace attnlab::experiments
