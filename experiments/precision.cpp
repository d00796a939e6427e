// `precision` — the methods as users run them in bfloat16 and float16 (issue "Reduced precision"): each method's
// output in fp32 and in emulated bf16 / fp16 storage (core/precision.hpp) under the eager and the careful policy, on
// generated problems and on the model sources' heads, with logits sharpened by a temperature t (Q·t, softmax(t·s·QKᵀ):
// the GPU transcriptions' convention, tools/gpu_precision.py). Per cell: the rounding error against the method's own
// float64 output, the total error against exact attention in float64, the non-finite output entries, the all-zero
// output rows, and what the forward's rounding overflowed, underflowed to zero or met as NaN; where the backward is
// emulated, dQ, dK, dV against the method's own float64 gradients (err_dq, ...), the non-finite gradient entries
// (grad_nonfinite) and the entries the backward's rounding overflowed (grad_overflow: its stored tensors, the
// forward's formed again among them). The fp64 rows give each method's
// approximation error, the yardstick the rounding error is read against. For exact attention, the pattern methods
// (local, sparse: exact's materialised bound over their pattern), Linformer (the same over its projected keys and
// values, with the envelopes of EK and FV as formed), linear attention, Performer (both policies) and Reformer
// (given both runs' key sets: a row whose set rounding moved has none) also their derived worst-case rounding
// bounds (analysis/rounding_bound.hpp): ‖bound‖_F / ‖O‖_F (`bound`), the measured error over the bound
// (`bound_ratio`, ≤ 1) and the entries outside it (`bound_violations`, 0); the kernel methods' give up on a row
// where the format may overflow (`bound_rows_none`; `bound` only when they give up nowhere, `bound_ratio` over the
// rows they hold). A method or policy the library does not emulate is a `refused` row, not a
// silent gap.
#include "attnlab/analysis/rounding_bound.hpp"
#include "attnlab/core/precision.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/linear.hpp"
#include "attnlab/methods/linformer.hpp"
#include "attnlab/methods/performer.hpp"
#include "attnlab/methods/reformer.hpp"
#include "attnlab/operators/sparse.hpp"
#include "common.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace attnlab::experiments {
namespace {

class Precision final : public SourcesExperiment {
 public:
  void declare(Options& o) override {
    o.add("--n", n_, "sequence lengths").preset({256, 512, 1024, 4096}, {256, 512, 1024, 4096, 16384});
    o.add("--d", d_, "head dimension");
    o.add("--temperatures", temps_, "logit temperatures t (Q·t)").preset({0.5, 1, 2, 4});
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized, pretrained")
        .preset({"gaussian", "clustered", "trained", "pretrained"});
    // Every deployable family at its default budget and one other (attnlab methods --families; Nyström with the
    // SVD pseudo-inverse and pooled Linformer at their defaults, Scatterbrain at 64 features; the analysis floors svd
    // and cur, whose SVD of the n × n P dominates the run, with --methods).
    o.add("--methods", methods_, "method specs")
        .separator(';')
        .preset({"exact:impl=materialized", "exact", "linear", "performer:features=256", "performer:features=64",
                 "linformer:k=256", "linformer:k=64", "local:window=64", "local:window=16", "nystrom:landmarks=64",
                 "nystrom:landmarks=16", "reformer:rounds=2", "reformer:rounds=2,chunk=32", "probsparse",
                 "probsparse:factor=2", "vq:codes=64", "vq:codes=16", "nystrom:landmarks=64,pinv=svd",
                 "linformer:k=256,projection=pool", "scatterbrain:features=64"});
    o.add("--formats", formats_, "storage formats beside fp64: fp32, bf16, fp16").preset({"fp32", "bf16", "fp16"});
    declare_seeds_and_model(o, {"diagonal"}, {"all"}, 1, 1);
  }

 private:
  void model_points(std::vector<Point>& pts, const std::string& src) const override {
    for (const auto& f : formats_) parse_storage(f);  // an unknown format fails before any point
    const auto [data, heads] = model_.open_bidirectional(src, name());
    for (const ModelHead& h : heads)
      for (double t : temps_)
        pts.push_back({fmt::format("{} T={}", data->point_id(h), t), [=, data = data] {
                         return evaluate(head_row(*data, h), data->load(h), t, std::uint64_t(h.seq));
                       }});
  }
  void generated_points(std::vector<Point>& pts, const std::string& src) const override {
    for (const auto& f : formats_) parse_storage(f);
    for (Index n : n_)
      for (double t : temps_)
        add_seed_points(pts, seeds_, fmt::format("source={} n={} d={} T={}", src, n, d_, t),
                        [=](std::uint64_t s) { return evaluate(source_row(src), generated(src, n, d_, s), t, s); });
  }

  std::vector<Row> evaluate(const Row& where, Qkv<double> p, double t, std::uint64_t seed) const {
    // The float32 values the emulation stores from are the inputs: the references are taken on them.
    p.q = (p.q * t).cast<float>().cast<double>();
    p.k = p.k.cast<float>().cast<double>();
    p.v = p.v.cast<float>().cast<double>();
    const Index n = p.q.rows(), d = p.q.cols();
    const Reference<double> exact(p.q, p.k, p.v);
    const double exact_norm = exact.output().norm();
    const MatrixR<float> q32 = p.q.cast<float>(), k32 = p.k.cast<float>(), v32 = p.v.cast<float>();
    std::vector<Row> rows;
    const std::string temp = fmt::format("T={}", t);
    std::optional<SoftmaxRoundingAnalysis> analysis;  // exact attention's bound: formed when an exact spec runs
    // The upstream gradient of the backward rows: Gaussian, seeded by the point, stored in float32 like the inputs.
    Rng drng(seed ^ 0x5eedd0u);
    MatrixR<double> dout(n, p.v.cols());
    for (Index i = 0; i < dout.size(); ++i) dout.data()[i] = double(float(drng.normal()));
    const MatrixR<float> dout32 = dout.cast<float>();
    for (const auto& spec : methods_) {
      auto m64 = make_method<double>(spec, seed);
      m64->compute(p.q, p.k);
      const MatrixR<double> own = m64->output(p.v);
      const double own_norm = own.norm();
      Row key = row_key(where, n, d, seed, temp);
      key.method = m64->name();
      key.spec = m64->spec();
      const auto add = [&](const std::string& dtype, const std::string& policy, const char* metric, double value) {
        Row r = key;
        r.dtype = dtype;
        if (!policy.empty()) r.variant += " " + policy;
        r.metric = metric;
        r.value = value;
        rows.push_back(r);
      };
      add("fp64", "", "err_total", (own - exact.output()).norm() / exact_norm);
      // A softmax bound's rows beside the measured output od: its size against ‖ref‖, the measured error over it
      // and the entries outside it.
      const auto add_bound = [&](const std::string& format, const std::string& pol, const SoftmaxRoundingBound& b,
                                 const MatrixR<double>& od, const MatrixR<double>& ref, double ref_norm) {
        const MatrixR<double> err = (od - ref).cwiseAbs();
        Index outside = 0;
        for (Index i = 0; i < err.size(); ++i) outside += !(err.data()[i] <= b.output.data()[i]);
        add(format, pol, "bound", b.output_norm() / ref_norm);
        add(format, pol, "bound_ratio", (od - ref).norm() / b.output_norm());
        add(format, pol, "bound_violations", double(outside));
      };
      std::optional<SoftmaxRoundingAnalysis> pattern_analysis;  // the pattern methods' bound (formed when asked)
      std::vector<std::vector<Index>> keys64;                   // Reformer's: the float64 method's key sets
      // The backward where the emulation covers it (the registry's StorageEmulation::backward): dQ, dK, dV against
      // the method's own float64 gradients.
      const MethodDescriptor& desc = find_method(m64->name());
      const bool backward = desc.backward && desc.storage.backward;
      const attnlab::Gradients<double> g64 = backward ? m64->backward(p.v, dout) : attnlab::Gradients<double>{};
      for (const auto& format : formats_) {
        const Storage storage = parse_storage(format);
        const bool native = storage == Storage::native;
        for (const Policy policy : {Policy::eager, Policy::careful}) {
          if (native && policy == Policy::careful) continue;  // nothing is rounded: one row
          const std::string pol = native ? "" : policy_name(policy);
          AttentionOptions opts;
          opts.storage = storage;
          opts.policy = policy;
          auto m = make_method<float>(spec, seed);
          MatrixR<float> o;
          try {
            m->compute(q32, k32, opts);
            o = m->output(v32);
          } catch (const Error&) {
            add(format, pol, "refused", 1);  // not emulated (yet) for this method or policy: said, not skipped
            continue;
          }
          const MatrixR<double> od = o.cast<double>();
          const OutputCheck check = check_output<float>(o);  // as Method::output takes it under a reduced storage
          const std::uint64_t nonfinite = check.nonfinite, zero = check.zero_rows;
          add(format, pol, "nonfinite", double(nonfinite));
          add(format, pol, "zero_rows", double(zero));
          if (nonfinite == 0) {
            add(format, pol, "err_rounding", (od - own).norm() / own_norm);
            add(format, pol, "err_total", (od - exact.output()).norm() / exact_norm);
          }
          // The forward's tallies (compute and output), before the backward adds its own to the method's log.
          RoundingTally forward;
          for (const auto& e : m->rounding()) forward += e.tally;
          if (backward) {
            const attnlab::Gradients<float> g = m->backward(v32, dout32);
            std::uint64_t bad = 0;
            for (const MatrixR<float>* x : {&g.dq, &g.dk, &g.dv})
              for (Index i = 0; i < x->size(); ++i) bad += !std::isfinite(x->data()[i]);
            add(format, pol, "grad_nonfinite", double(bad));
            if (bad == 0) {
              add(format, pol, "err_dq", (g.dq.cast<double>() - g64.dq).norm() / g64.dq.norm());
              add(format, pol, "err_dk", (g.dk.cast<double>() - g64.dk).norm() / g64.dk.norm());
              add(format, pol, "err_dv", (g.dv.cast<double>() - g64.dv).norm() / g64.dv.norm());
            }
          }
          if (!native && m->name() == "exact") {
            // The derived worst-case bound (analysis/rounding_bound.hpp) beside the measurement.
            if (!analysis) analysis.emplace(p.q, p.k, p.v, AttentionOptions{});
            const bool streaming = spec.find("materialized") == std::string::npos;
            add_bound(format, pol, analysis->bound(opts, streaming), od, analysis->o, exact_norm);
          }
          if (!native && (m->name() == "local" || m->name() == "sparse")) {
            // The pattern methods: exact attention's materialised bound over their pattern (read from the float64
            // method's own sparse P̃), formed once per spec.
            if (!pattern_analysis) {
              const auto* sp = dynamic_cast<const SparseOperator<double>*>(&m64->op());
              require(sp != nullptr, "precision: {} has no sparse operator", spec);
              pattern_analysis.emplace(p.q, p.k, p.v, sp->row_keys(), AttentionOptions{}.resolved_scale(d));
            }
            add_bound(format, pol, pattern_analysis->bound(opts, false), od, own, own_norm);
          }
          if (!native && m->name() == "linformer") {
            // Linformer: exact's materialised bound over the projected keys and values, with the envelopes of EK
            // and FV as its emulation forms and stores them (the float64 method's E and F, and the float32
            // method's, which it stores).
            const auto* l64 = dynamic_cast<const LinformerMethod<double>*>(m64.get());
            const auto* l32 = dynamic_cast<const LinformerMethod<float>*>(m.get());
            require(l64 != nullptr && l32 != nullptr, "precision: {} is not a Linformer", spec);
            const auto& [e32, f32] = l32->projections();
            add_bound(format, pol,
                      linformer_rounding_bound(p.q, p.k, p.v, l64->projections().first, l64->projections().second,
                                               e32.cast<double>(), f32.cast<double>(), opts),
                      od, own, own_norm);
          }
          // A kernel method's bound (the same file): +inf on a row where the format may overflow; counted
          // (bound_rows_none), its finite rows held to it, and a failed row must be one of them.
          const auto add_kernel_bound = [&](const KernelRoundingBound& b) {
            Index outside = 0;
            double measured = 0, bounded = 0;
            for (Index i = 0; i < od.size(); ++i) {
              const double err = std::abs(od.data()[i] - own.data()[i]), bi = b.output.data()[i];
              outside += !(std::isinf(bi) || err <= bi);  // no guarantee: NaN or ±inf there is no violation
              if (std::isfinite(bi)) {
                measured += err * err;
                bounded += bi * bi;
              }
            }
            add(format, pol, "bound_rows_none", double(b.rows_without_guarantee));
            if (b.rows_without_guarantee == 0) add(format, pol, "bound", b.output_norm() / own_norm);
            if (bounded > 0) add(format, pol, "bound_ratio", std::sqrt(measured / bounded));
            add(format, pol, "bound_violations", double(outside));
          };
          if (!native && m->name() == "linear") {
            const LinearFeature feature =
                m->spec().find("feature=relu") != std::string::npos ? LinearFeature::Relu : LinearFeature::Elu;
            add_kernel_bound(linear_rounding_bound(p.q, p.k, p.v, feature, opts));
          }
          if (!native && m->name() == "performer" &&
              dynamic_cast<const PerformerMethod<double>*>(m64.get())->settings().kernel ==
                  PerformerKernel::Positive) {
            // Performer's (careful: attnlab's stabilised features; eager: the reference code's, every step stored),
            // with the float64 and the float32 method's own ω.
            const auto* p64 = dynamic_cast<const PerformerMethod<double>*>(m64.get());
            const auto* p32 = dynamic_cast<const PerformerMethod<float>*>(m.get());
            require(p64 != nullptr && p32 != nullptr, "precision: {} is not a Performer", spec);
            add_kernel_bound(performer_rounding_bound(p.q, p.k, p.v, p64->omega(), p32->omega().cast<double>(),
                                                      p64->settings().kernel, opts));
          }
          if (!native && m->name() == "reformer") {
            // Reformer's, given both runs' key sets (a row whose set rounding moved is counted, not bounded): exact's
            // streaming bound over the float64 method's key sets, in as many pieces as rounds.
            const auto* r64 = dynamic_cast<const ReformerMethod<double>*>(m64.get());
            const auto* r32 = dynamic_cast<const ReformerMethod<float>*>(m.get());
            require(r64 != nullptr && r32 != nullptr, "precision: {} is not a Reformer", spec);
            if (!pattern_analysis) {
              keys64 = r64->key_sets();
              pattern_analysis.emplace(p.q, p.k, p.v, keys64, AttentionOptions{}.resolved_scale(d));
            }
            add_kernel_bound(
                reformer_rounding_bound(*pattern_analysis, keys64, r32->key_sets(), r64->settings().rounds, opts));
          }
          if (!native) {
            add(format, pol, "overflow", double(forward.overflow));
            add(format, pol, "underflow", double(forward.underflow));
            add(format, pol, "nan_stored", double(forward.nan));
            if (backward) {  // what the backward stored overflowing: the log's total less the forward's
              RoundingTally all;
              for (const auto& e : m->rounding()) all += e.tally;
              add(format, pol, "grad_overflow", double(all.overflow - forward.overflow));
            }
          }
        }
      }
    }
    return rows;
  }

  std::vector<Index> n_;
  Index d_ = 64;
  std::vector<double> temps_;
  std::vector<std::string> methods_, formats_;
};

}  // namespace

std::unique_ptr<Experiment> make_precision_experiment() { return std::make_unique<Precision>(); }

}  // namespace attnlab::experiments
