// `attnlab report`: which approximation for my model, head by head (experiments/report.hpp does the work; the
// Python module's attnlab.report() calls the same code).
#include "attnlab/core/error.hpp"
#include "commands.hpp"
#include "inputs.hpp"
#include "report.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

namespace attnlab::cli {

void add_report(CLI::App& app) {
  struct Flags {
    std::string q, k, v, model_dir, layers = "all", precision, policy;
    Index seq = 0;
    attnlab::report::Options opts;
  };
  auto f = std::make_shared<Flags>();
  auto* sub = app.add_subcommand(
      "report", "per head: entropy, spectrum, every method's error against its cost, and the method to use");
  auto* qo = add_qkv_files(sub, f->q, f->k, f->v, "queries .npy, (heads, n, d) or (n, d)");
  auto* mo = sub->add_option("--model-dir", f->model_dir,
                             "a model export (tools/trained_attention.py: data/attention, or data/attention/trained)");
  mo->excludes(qo);
  sub->add_option("--layers", f->layers, "with --model-dir: 'all' or a comma list of layer indices")
      ->capture_default_str();
  sub->add_option("--seq", f->seq, "with --model-dir: which exported sequence (the report says which of how many)")
      ->capture_default_str();
  sub->add_option("--out", f->opts.out, "report directory (index.html, report.csv, summary.md)")->required();
  sub->add_option("--target", f->opts.target, "largest output error ‖O − Õ‖_F/‖O‖_F a recommendation may have")
      ->check(positive_finite())
      ->capture_default_str();
  sub->add_option("--families", f->opts.families, "method families (error_vs_budget's labels; default: every "
                                                  "deployable one)")
      ->delimiter(',');
  sub->add_option("--repeats", f->opts.repeats, "timing: timed calls after a warm-up (the fastest is quoted)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--cost-n", f->opts.cost_n,
                  "measure costs at this sequence length (the length the model will run at; each head's rows "
                  "repeated to it); errors stay measured on the heads. Default: the heads' own length")
      ->check(CLI::Range(Index(1), Index(1) << 22));
  sub->add_option("--noise", f->opts.noise,
                  "relative timing noise below which two costs count as equal (at least the calls' own spread)")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  sub->add_option("--threads", f->opts.threads, "threads (default: OMP_NUM_THREADS, else every core)")
      ->check(CLI::Range(1, 4096));
  sub->add_flag("--causal", f->opts.causal,
                "causal mask (only the methods that honour one); must agree with what a capture says: an export's "
                "meta.json (\"bidirectional\"), a file's FILE.npy.json or meta.json (\"causal\")");
  sub->add_option("--title", f->opts.title, "the report's title")->capture_default_str();
  sub->add_option("--precision", f->precision,
                  "the format the model runs attention in: fp32 (default: errors of the float64 methods), bf16 or "
                  "fp16 (each method's error in that format, emulated, against exact float64: the recommendation "
                  "is for it; costs stay float32 on this CPU)");
  sub->add_option("--costs", f->opts.costs,
                  "costs measured on your device instead of timing here: a CSV of per-method, per-length times "
                  "(columns method, budget, n, ms; optional d, dtype, pass, causal, status, device_name) — what "
                  "tools/bench_gpu.py writes (results/bench/gpu_*.csv); the report names its device wherever it quotes "
                  "a cost")
      ->check(CLI::ExistingFile);
  sub->add_option("--exact-peer", f->opts.exact_peer,
                  "a faster exact attention on this CPU: tools/bench_exact_peer.py's table (attnlab's exact against "
                  "PyTorch's scaled_dot_product_attention, measured here at the report's threads); the speed-ups and "
                  "the keep-exact rule are then over the faster of the two, named")
      ->check(CLI::ExistingFile);
  sub->add_option("--costs-dtype", f->opts.costs_dtype,
                  "with --costs: the table's format to take (default: --precision's, else the table's only one, "
                  "else fp32)");
  sub->add_option("--policy", f->policy,
                  "with --precision bf16|fp16: eager (every intermediate stored in the format, as a plain "
                  "transcription; the default) or careful (accumulators and statistics in float32, as FlashAttention)");
  sub->callback([f] {
    f->opts.storage = parse_storage(f->precision.empty() ? "native" : f->precision);
    f->opts.policy = parse_policy(f->policy.empty() ? "eager" : f->policy);
    // A policy says what bf16/fp16 round: refused where nothing is (float16 files take one: checked once read).
    const auto require_policy_rounds = [&] {
      require(f->policy.empty() || f->opts.storage != Storage::native,
              "report: --policy needs --precision bf16 or fp16 (or float16 files)");
    };
    std::vector<attnlab::report::Layer> layers;
    if (!f->model_dir.empty()) {
      require_policy_rounds();
      layers = attnlab::report::load_model_export(f->model_dir, f->layers, f->seq, f->opts.causal);
    } else {
      require(!f->q.empty(), "report: give --q/--k/--v or --model-dir");
      attnlab::report::Layer layer;
      layer.origin = attnlab::report::files_origin(f->q, f->k, f->v);  // their sidecars; the sequence
      attnlab::report::causal_rule(layer.origin, f->opts.causal);         // refused before the files are read
      const QkvFiles files = load_qkv(f->q, f->k, f->v);
      if (f->precision.empty() && files.q.float16()) {  // as apply and compare: computed as they are stored
        f->opts.storage = Storage::fp16;
        fmt::print("report: float16 files: the recommendation is for fp16 storage ({} policy; --precision fp32 for "
                   "the float64 methods' errors)\n", policy_name(f->opts.policy));
      }
      require_policy_rounds();
      layer.name = "input";
      for (Index h = 0; h < files.heads(); ++h)
        layer.heads.push_back({files.q.head_as<double>(h), files.k.head_as<double>(h), files.v.head_as<double>(h)});
      layers.push_back(std::move(layer));
    }
    // What the report says of its input (the sequence, the mask), before the work: also in summary.md, index.html.
    for (const std::string& note : attnlab::report::input_notes(layers, f->opts.causal))
      fmt::print("report: {}\n", note);
    std::fflush(stdout);
    const auto s = attnlab::report::write_report(layers, f->opts);
    fmt::print("wrote {} ({} heads; {} keep exact), {}, {}\n", s.index_html, s.heads, s.keep_exact, s.csv,
               s.summary_md);
  });
}

}  // namespace attnlab::cli
