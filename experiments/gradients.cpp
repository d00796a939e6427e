// `gradients` — how far each approximation's gradients are from exact attention's. For the loss L = ⟨dO, O⟩ (any
// upstream gradient dO), every method's backward (Method::backward: its own forward differentiated, random and
// discrete choices held at their fitted values) gives dQ̃, dK̃, dṼ; exact attention's (FlashAttention-2's backward,
// Dao 2023) gives dQ, dK, dV. Rows per method and budget: the output error ‖Õ − O‖_F/‖O‖_F beside
// ‖dX̃ − dX‖_F/‖dX‖_F and cos(dX̃, dX) for X = Q, K, V — a low-rank or sampled estimate can be close in value and
// far in derivative. dO is (a) Gaussian (variant `dO=gaussian`) and, on the exported models' heads, (b) the model's own
// upstream gradient of its held-out loss (`dO=model`: ∂loss/∂O of that head, exported by tools/trained_attention.py).
// Sources: generated (gaussian, clustered, lowrank), the trained model's heads (`trained`, bidirectional: every
// family), the causal model's (`trained_causal`: the causal-capable families under the causal mask) and the
// pretrained all-MiniLM-L6-v2's (`pretrained`: dO=model from its own contrastive training loss, tools/pretrained.py).
// Each family runs at its budgets (analysis/budget_families.hpp) and at its method's default budget (metric
// default_budget = 1 on those rows).
#include "attnlab/analysis/budget_families.hpp"
#include "attnlab/core/random.hpp"
#include "common.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace attnlab::experiments {
namespace {

/// cos(a, b) over all entries (0 when either is zero).
double cosine(const MatrixR<double>& a, const MatrixR<double>& b) {
  const double na = a.norm(), nb = b.norm();
  return na > 0 && nb > 0 ? (a.array() * b.array()).sum() / (na * nb) : 0.0;
}

/// A method to measure: its family label, its spec and its budget (−1: a method without one).
struct Entry {
  std::string family, spec;
  Index budget = -1;
  bool is_default = false;  // the method's default budget (the note's "at its default budget")
};

class Gradients final : public Experiment {
 public:
  void declare(Options& o) override {
    std::vector<std::string> all;
    for (const auto& f : budget_families())
      if (f.deployable) all.push_back(f.label);
    o.add("--n", n_, "sequence length of the generated sources").preset(512, 1024);
    o.add("--d", d_, "head dimension of the generated sources").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized, trained_causal, pretrained")
        .preset({"gaussian", "clustered", "lowrank", "trained", "trained_causal", "pretrained"})
        .in_point_ids();
    o.add("--families", families_, "budget families (analysis/budget_families.hpp; default: the deployable ones)")
        .preset(all);
    o.add("--fixed", fixed_, "methods without a budget, measured once per problem").separator(';')
        .preset({"linear", "taylor", "efficient"});
    o.add("--seeds", seeds_, "number of seeds of the generated sources")
        .preset(1, 3)
        .positive()
        .at_most(kMaxSeeds, "a grid point each")
        .in_point_ids();
    // Quick: one head per layer (the diagonal) of one held-out sequence; paper: every head of every sequence.
    model_.declare(o, {"diagonal"}, {"all"}, 1, 0);
  }

  std::vector<Point> grid() override {
    const std::vector<Entry> entries = methods();
    std::vector<Point> pts;
    for (const auto& src : sources_) {
      if (ModelData::is_model_source(src)) {
        const auto [data, heads] = src == "trained_causal" ? model_.open(src) : model_.open_bidirectional(src, name());
        AttentionOptions opts;
        opts.causal = !data->bidirectional();
        for (const ModelHead& h : heads)
          pts.push_back({data->point_id(h), [=, data = data] {
                           const Qkv<double> p = data->load(h);
                           std::vector<Row> rows;
                           const Row where = head_row(*data, h);
                           measure(rows, where, "dO=gaussian", p, gaussian_upstream(p, h.seq), std::uint64_t(h.seq),
                                   opts, entries);
                           if (data->has_upstream(h))
                             measure(rows, where, "dO=model", p, data->upstream(h), std::uint64_t(h.seq), opts,
                                     entries);
                           return rows;
                         }});
        continue;
      }
      add_seed_points(pts, seeds_, fmt::format("source={} n={} d={}", src, n_, d_), [=](std::uint64_t s) {
        const Qkv<double> p = generated(src, n_, d_, s);
        std::vector<Row> rows;
        measure(rows, source_row(src), "dO=gaussian", p, gaussian_upstream(p, s), s, {}, entries);
        return rows;
      });
    }
    return pts;
  }

 private:
  /// Every family's budgets and its method's default budget (the note's "at its default budget"), and the fixed
  /// methods; those without a backward pass (the analysis floors) are left out with a message at the grid.
  std::vector<Entry> methods() const {
    std::vector<Entry> v;
    const auto all = budget_families();
    for (const auto& label : families_) {
      const auto it = std::find_if(all.begin(), all.end(), [&](const BudgetFamily& f) { return f.label == label; });
      require(it != all.end(), "gradients: unknown family '{}'", label);
      const MethodDescriptor& d = find_method(it->spec.substr(0, it->spec.find(':')));
      require(d.backward, "gradients: family '{}': method '{}' has no backward pass ({})", label, d.name,
                          d.backward_note);
      std::vector<Index> budgets = it->budgets;
      Index fallback = -1;
      for (const auto& p : d.params)
        if (p.name == d.budget) fallback = std::stoll(p.default_value);
      budgets.push_back(fallback);
      std::sort(budgets.begin(), budgets.end());
      budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
      for (Index b : budgets) v.push_back({label, it->spec_at(b), b, b == fallback});
    }
    for (const auto& spec : fixed_) {
      const MethodDescriptor& d = find_method(spec.substr(0, spec.find(':')));
      require(d.backward, "gradients: method '{}' has no backward pass ({})", d.name, d.backward_note);
      v.push_back({d.name, spec, -1, true});
    }
    return v;
  }

  static MatrixR<double> gaussian_upstream(const Qkv<double>& p, std::uint64_t seed) {
    Rng rng(seed ^ 0x6772616455LL);  // a stream of its own: not the generator's Q, K, V
    return gaussian_matrix<double>(p.q.rows(), p.v.cols(), rng);
  }

  void measure(std::vector<Row>& rows, const Row& where, const std::string& variant, const Qkv<double>& p,
               const MatrixR<double>& d_out, std::uint64_t seed, const AttentionOptions& opts,
               const std::vector<Entry>& entries) const {
    const Index n = p.q.rows();
    auto exact = make_method<double>("exact");
    exact->compute(p.q, p.k, opts);
    const MatrixR<double> out = exact->output(p.v);
    const attnlab::Gradients<double> g = exact->backward(p.v, d_out);
    const MatrixR<double>* want[3] = {&g.dq, &g.dk, &g.dv};
    const char* names[3] = {"dq", "dk", "dv"};
    for (const Entry& e : entries) {
      auto m = make_method<double>(e.spec, seed);
      if (opts.causal && !m->supports_causal()) continue;  // the causal model: causal-capable methods only
      try {
        check_method_fits(*m, ProblemSize{n, n, p.q.cols(), p.v.cols(), 8});
      } catch (const Error&) {
        continue;  // a budget beyond the sequence (landmarks > n, ...)
      }
      m->compute(p.q, p.k, opts);
      const MatrixR<double> o = m->output(p.v);
      const attnlab::Gradients<double> gm = m->backward(p.v, d_out);
      const MatrixR<double>* got[3] = {&gm.dq, &gm.dk, &gm.dv};
      Row key = row_key(where, n, p.q.cols(), seed, variant, e.budget);
      key.method = m->name();
      key.spec = m->spec();
      auto add = [&](const std::string& metric, double value) {
        Row r = key;
        r.metric = metric;
        r.value = value;
        rows.push_back(r);
      };
      add("default_budget", e.is_default ? 1 : 0);
      add("output_rel_fro", (o - out).norm() / out.norm());
      for (int x = 0; x < 3; ++x) {
        add(std::string(names[x]) + "_rel_fro", (*got[x] - *want[x]).norm() / want[x]->norm());
        add(std::string(names[x]) + "_cos", cosine(*got[x], *want[x]));
      }
    }
  }

  Index n_ = 512, d_ = 64, seeds_ = 1;
  std::vector<std::string> sources_, families_, fixed_;
  ModelOptions model_;
};

}  // namespace

std::unique_ptr<Experiment> make_gradients_experiment() { return std::make_unique<Gradients>(); }

}  // namespace attnlab::experiments
