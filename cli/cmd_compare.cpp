// `attnlab compare`: run methods against exact attention on the user's arrays or a generated problem, print
// the error metrics, and write them as tidy CSV.
#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/analysis/cost.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/analysis/metrics.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/io/sources.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/io/tidy_csv.hpp"
#include "commands.hpp"
#include "inputs.hpp"
#include "sweep.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

namespace attnlab::cli {
namespace {

struct CompareOptions {
  std::vector<std::string> methods;
  bool all = false;
  std::string q, k, v;
  Index n = 1024, n_k = 0, d = 64, d_v = 0;
  SourceOptions source;
  std::uint64_t seed = 0;
  bool causal = false;
  double scale = std::numeric_limits<double>::quiet_NaN();
  std::string dtype = "auto";
  std::string csv;
  std::string matrix_metrics = "auto";
  Index matrix_limit = 4096;
  int repeats = 5, warmup = 1;
  PrecisionOptions p;
};

std::string opt(const std::optional<double>& x) { return x ? fmt::format("{:.3e}", *x) : "-"; }

template <typename T>
void run(const CompareOptions& o, const std::optional<QkvFiles>& files) {
  // The methods, built (and their specs validated) before any work.
  std::vector<std::unique_ptr<Method<T>>> methods;
  std::vector<std::string> shown;  // each method's spec as a user writes it (the CSV keeps the canonical spec)
  std::vector<std::string> specs = o.methods;
  if (o.all)
    for (const auto& d : registered_methods()) specs.push_back(d.name);
  require(!specs.empty(), "compare: give --method SPEC (repeatable) or --all");
  for (const auto& s : specs) {
    auto m = make_method<T>(s, o.seed);
    if (o.causal && !m->supports_causal()) {
      if (o.all) {
        fmt::print(stderr, "attnlab: note: skipping {}: it cannot honour a causal mask\n", m->name());
        continue;
      }
      throw Error(fmt::format("method '{}' cannot honour a causal mask; drop it or --causal", m->name()));
    }
    shown.push_back(short_spec(find_method(m->name()), m->params(), o.seed));
    methods.push_back(std::move(m));
  }

  const Index heads = files ? files->heads() : 1;
  const ProblemSize size{files ? files->q.rows() : o.n, files ? files->k.rows() : (o.n_k > 0 ? o.n_k : o.n),
                         files ? files->q.cols() : o.d, files ? files->v.cols() : (o.d_v > 0 ? o.d_v : o.d),
                         sizeof(T)};
  const bool matrix_metrics = o.matrix_metrics == "on" || (o.matrix_metrics == "auto" && size.n_q <= o.matrix_limit &&
                                                           size.n_k <= o.matrix_limit);
  // Memory, before any work (at n = 10⁵ exact attention alone takes half a minute): the inputs, each method's
  // own allocations (exact:impl=materialized's P, svd's dense path, ...), and the matrix metrics' row blocks of
  // P and P̃ (float64) with the block a generic P̃ is read through.
  const std::string inputs = describe_inputs(size.n_q, size.n_k, size.d, size.d_v, dtype_of<T>());
  if (!files)
    check_memory(
        input_bytes(size.n_q, size.n_k, size.d, size.d_v, dtype_of<T>()),
        "the generated problem (" + describe_inputs(size.n_q, size.n_k, size.d, size.d_v, dtype_of<T>(), false) + ")");
  for (const auto& m : methods) check_method_fits(*m, size);
  if (matrix_metrics) {
    const Index block = MatrixErrorOptions{}.block_rows;
    check_memory(add_bytes(matrix_bytes(std::uint64_t(3 * block), std::uint64_t(size.n_k), 8),
                           matrix_bytes(std::uint64_t(size.n_q), std::uint64_t(block), sizeof(T))),
                 "the matrix metrics (rows of P and P̃ {} at a time, n_k = {}; --matrix-metrics off "
                 "skips them)", block, size.n_k);
  }
  set_work(fmt::format("compare on {}{}", heads > 1 ? fmt::format("{} heads of ", heads) : "", inputs));
  const std::string source = files ? "files" : o.source.kind;
  std::optional<TidyCsvWriter> csv;
  if (!o.csv.empty()) {
    // The experiments' schema (sweep.hpp; docs/reproducing.md: "Results files"): one tidy format for every results
    // file. n is n_q; dtype the compute type, head the head (0 for a generated problem), variant "causal" under the
    // mask (else empty); the point id names everything else.
    csv.emplace(o.csv, experiments::result_columns());
    std::ofstream side(o.csv + ".config");  // the sweeps' sidecar name (sweep.cpp)
    side << "command: " << command_line() << "\ncode_version: " << code_version() << "\ncosts measured with: "
         << cost_context() << "\n";
  }
  AttentionOptions aopts;
  aopts.scale = o.scale;
  aopts.causal = o.causal;
  aopts.storage = parse_storage(o.p.precision.empty() ? "native" : o.p.precision);
  aopts.policy = parse_policy(o.p.policy);
  const bool reduced = aopts.storage != Storage::native;

  std::size_t width = 8;
  for (const auto& s : shown) width = std::max(width, s.size());
  // One row per method and head: the head first when the files hold several.
  const std::string head_header = heads > 1 ? fmt::format("{:>4} ", "head") : "";
  // Times in milliseconds here (3 significant digits: the fast methods take microseconds); seconds in the CSV.
  // Under bf16/fp16: the error against exact attention in float32 (total), against the method's own float32 run
  // (rounding), the output's non-finite entries and all-zero rows; no P̃ metrics, no times (the emulation's).
  // The header with the first row: a method that refuses its storage when computed (performer's eager emulation
  // of kernel=trig) fails before anything is printed.
  bool header = false;
  const auto print_header = [&] {
    if (std::exchange(header, true)) return;
    if (reduced)
      fmt::print("{}{:<{}} {:>10} {:>10} {:>10} {:>10} {:>9}\n", head_header, "method", width, "out_relF",
                 "round_relF", "out_cos", "nonfinite", "zero_rows");
    else
      fmt::print("{}{:<{}} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8}\n", head_header, "method", width,
                 "out_relF", "out_cos", "P_relF", "P_rel2", "P_KL", "P_TV", "time_ms", "speedup");
  };
  std::uint64_t failed = 0;
  std::vector<std::string> failed_specs;
  for (Index h = 0; h < heads; ++h) {
    MatrixR<T> qs, ks, vs;
    if (!files) {
      Qkv<T> g = generate_problem<T>(o.source, o.n, o.n_k > 0 ? o.n_k : o.n, o.d, o.d_v > 0 ? o.d_v : o.d, o.seed);
      qs = std::move(g.q);
      ks = std::move(g.k);
      vs = std::move(g.v);
    }
    MatrixR<T> qc, kc, vc;
    const ConstRef<T> q = files ? head_view<T>(files->q, h, qc) : ConstRef<T>(qs);
    const ConstRef<T> k = files ? head_view<T>(files->k, h, kc) : ConstRef<T>(ks);
    const ConstRef<T> v = files ? head_view<T>(files->v, h, vc) : ConstRef<T>(vs);

    attnlab::CompareOptions copts;
    copts.attention = aopts;
    copts.matrix_metrics = matrix_metrics;
    copts.cost.repeats = o.repeats;
    copts.cost.warmup = o.warmup;
    std::size_t row_index = 0;  // compare_methods reports the rows in the methods' order
    const auto print_row = [&](const Evaluation& r) {
      const std::string& spec_shown = shown.at(row_index++);
      print_header();
      const std::string head_cell = heads > 1 ? fmt::format("{:>4} ", h) : "";
      if (reduced) {
        const auto nonfinite = r.value("output_nonfinite"), zero = r.value("output_zero_rows");
        fmt::print("{}{:<{}} {:>10} {:>10} {:>10} {:>10.0f} {:>9.0f}\n", head_cell, spec_shown, width,
                   opt(r.value("out_rel_fro")), opt(r.value("round_rel_fro")),
                   r.value("out_mean_cosine") ? fmt::format("{:.6f}", *r.value("out_mean_cosine")) : "-",
                   nonfinite.value_or(0), zero.value_or(0));
        if (r.failed()) {
          ++failed;
          if (std::find(failed_specs.begin(), failed_specs.end(), spec_shown) == failed_specs.end())
            failed_specs.push_back(spec_shown);
        }
      } else {
        fmt::print("{}{:<{}} {:>10.3e} {:>10.6f} {:>10} {:>10} {:>10} {:>10} {:>9.3g} {:>8.2f}\n", head_cell,
                   spec_shown, width, *r.value("out_rel_fro"), *r.value("out_mean_cosine"), opt(r.value("P_rel_fro")),
                   opt(r.value("P_rel_spectral")), opt(r.value("P_mean_kl")), opt(r.value("P_mean_tv")),
                   r.time_s() * 1e3, r.speedup());
      }
      if (!csv) return;
      const std::vector<std::string> keys = {
          "compare",
          fmt::format("source={} dtype={} causal={} n_q={} n_k={} d={} d_v={} seed={} head={}", source,
                      dtype_name(dtype_of<T>()), o.causal, q.rows(), k.rows(), q.cols(), v.cols(), o.seed, h) +
              (reduced ? fmt::format(" precision={} policy={}", storage_name(aopts.storage),
                                     policy_name(aopts.policy))
                       : std::string()),
          source, r.method, r.spec, std::to_string(q.rows()), std::to_string(q.cols()), std::to_string(o.seed),
          /*sequence=*/"", /*layer=*/"", /*head=*/std::to_string(h),
          // under emulation the dtype column names the format (as the precision experiment's does)
          reduced ? std::string(storage_name(aopts.storage)) : std::string(dtype_name(dtype_of<T>())),
          /*variant=*/reduced ? fmt::format("{}{}", o.causal ? "causal " : "", policy_name(aopts.policy))
                              : (o.causal ? "causal" : ""),
          /*step=*/""};
      // The library's one serializer (evaluate.hpp): errors, times by the cost harness, diagnostics, P̃ errors.
      for (const auto& [metric, value] : evaluation_rows(r)) csv->write(keys, metric, value);
    };
    compare_methods<T>(q, k, v, methods, copts, print_row);
  }
  if (reduced) {
    fmt::print("out_relF: against exact attention in float32; round_relF: against the method's own float32 run (the "
               "rounding of {} storage, {} policy, emulated on this CPU); no times: the emulation's are not the "
               "format's\n", storage_name(aopts.storage), policy_name(aopts.policy));
    fmt::print(stderr, "compare: under {} storage ({}): {} of {} rows with non-finite entries or all-zero output rows"
               "{}\n", storage_name(aopts.storage), policy_name(aopts.policy), failed, heads * Index(methods.size()),
               failed_specs.empty() ? std::string() : fmt::format(" ({})", fmt::join(failed_specs, ", ")));
    if (csv) fmt::print("wrote {}\n", csv->path());
    if (o.p.fail_on_nonfinite && failed > 0)
      throw Error(fmt::format("--fail-on-nonfinite: {} of {} rows under {} had non-finite entries or all-zero rows",
                              failed, heads * Index(methods.size()), storage_name(aopts.storage)));
    return;
  }
  // What the times and speed-ups hold for, beside them (issue "Costs on the machine the user runs").
  fmt::print("time_ms, speedup: {} compute + output, the fastest of {} calls after {} warm-up, on {}, against "
             "attnlab's exact attention on the same; not a GPU's, nor against another library's exact attention\n",
             dtype_name(dtype_of<T>()), o.repeats, o.warmup, cost_device());
  if (csv) fmt::print("wrote {}\n", csv->path());
}

}  // namespace

void add_compare(CLI::App& app) {
  auto o = std::make_shared<CompareOptions>();
  auto* sub = app.add_subcommand("compare", "run methods against exact attention and report the error metrics");
  sub->add_option("--method", o->methods, "method spec (repeatable), name[:key=value,...]");
  sub->add_flag("--all", o->all, "every registered method at its defaults");
  auto* qo = add_qkv_files(sub, o->q, o->k, o->v, "queries .npy (with --k and --v)");
  auto* no = sub->add_option("--n", o->n, "generated problem: number of queries")->check(CLI::Range(1, 1 << 20))
                 ->capture_default_str();
  auto* nko = sub->add_option("--nk", o->n_k, "generated problem: number of keys (default n)")
                  ->check(CLI::Range(1, 1 << 20));
  auto* dO = sub->add_option("--d", o->d, "generated problem: head dimension")->check(CLI::Range(1, 4096))
                 ->capture_default_str();
  auto* dvo = sub->add_option("--dv", o->d_v, "generated problem: value dimension (default d)")
                  ->check(CLI::Range(1, 4096));
  auto* so = sub->add_option("--source", o->source.kind, "generated problem: gaussian, clustered or lowrank")
                 ->check(CLI::IsMember({"gaussian", "clustered", "lowrank"}))
                 ->capture_default_str();
  auto* to = sub->add_option("--temperature", o->source.temperature, "generated problem: logits divided by T")
                 ->check(positive_finite())
                 ->capture_default_str();
  auto* co = sub->add_option("--centres", o->source.centres, "clustered source: number of centres")
                 ->check(CLI::Range(1, 1 << 20))
                 ->capture_default_str();
  auto* ro = sub->add_option("--rank", o->source.rank, "lowrank source: rank of Q and K")
                 ->check(CLI::Range(1, 4096))
                 ->capture_default_str();
  for (auto* gen : {no, nko, dO, dvo, so, to, co, ro}) gen->excludes(qo);
  sub->add_option("--seed", o->seed, "seed of the generated problem and of the methods' randomness")
      ->capture_default_str();
  sub->add_flag("--causal", o->causal, "causal mask");
  sub->add_option("--scale", o->scale, "logit scale (default 1/sqrt(d))")->check(positive_finite());
  sub->add_option("--dtype", o->dtype, "compute type: auto (Q's file, or f64 when generated), f32, f64")
      ->check(CLI::IsMember({"auto", "f32", "f64"}))
      ->capture_default_str();
  sub->add_option("--csv", o->csv, "write the metrics as tidy CSV here");
  sub->add_option("--matrix-metrics", o->matrix_metrics,
                  "metrics of the attention matrices (Frobenius, spectral, KL, TV): auto (n ≤ --matrix-limit), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  sub->add_option("--matrix-limit", o->matrix_limit, "largest n for which auto computes matrix metrics")
      ->capture_default_str();
  sub->add_option("--repeats", o->repeats,
                  "timing: timed calls per method (and of exact attention), after the warm-up; "
                  "time_s is the fastest, the CSV also has the median")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--warmup", o->warmup, "timing: untimed calls before the timed ones")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  add_precision_options(sub, o->p,
                        ": each method's error against exact attention and against its own float32 run, and its "
                        "failures, as rows");
  sub->callback([o] {
    std::vector<std::unique_ptr<Method<double>>> protos;  // bad specs fail before any work
    std::vector<const Method<double>*> methods;
    for (const auto& s : o->methods) {
      protos.push_back(make_method<double>(s, o->seed));
      methods.push_back(protos.back().get());
    }
    const std::string dtype = precision_dtype(o->p, o->dtype, methods);
    std::optional<QkvFiles> files;
    if (!o->q.empty()) files = load_qkv(o->q, o->k, o->v, dtype, "--dtype f32|f64");
    if (files && o->p.precision.empty() && dtype == "auto" && files->q.float16()) {
      // float16 files: compared as they are stored, in emulated float16, as apply computes them (--precision fp32
      // or --dtype compares natively)
      CompareOptions half = *o;
      half.p.precision = "fp16";
      precision_dtype(half.p, "auto", methods);  // the methods' storage, before any work
      run<float>(half, files);
      return;
    }
    require_reduced_for_policy(o->p);
    DType dt = DType::f64;
    if (dtype == "f32") dt = DType::f32;
    else if (dtype == "auto" && files) dt = files->q.dtype();
    if (dt == DType::f32) run<float>(*o, files);
    else run<double>(*o, files);
  });
}

}  // namespace attnlab::cli
