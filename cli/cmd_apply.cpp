// `attnlab apply`: run one method on the user's Q, K, V (.npy, (n, d) or (h, n, d)), write the output and,
// with --matrix, the attention matrix the method implies. Heads are processed one at a time and written as
// they finish, so memory holds one head's work.
#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/core/registry.hpp"
#include "commands.hpp"
#include "inputs.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include <limits>
#include <memory>
#include <optional>

namespace attnlab::cli {
namespace {

struct ApplyOptions {
  std::string method = "exact";
  std::string q, k, v, out, matrix;
  bool causal = false;
  double scale = std::numeric_limits<double>::quiet_NaN();
  std::optional<std::uint64_t> seed;
  std::string dtype = "auto";
  PrecisionOptions p;
};

template <typename T>
void run(const ApplyOptions& o, const QkvFiles& f) {
  auto method = make_method<T>(o.method, o.seed);
  AttentionOptions opts;
  opts.scale = o.scale;
  opts.causal = o.causal;
  opts.storage = parse_storage(o.p.precision.empty() ? "native" : o.p.precision);
  opts.policy = parse_policy(o.p.policy);
  const bool reduced = opts.storage != Storage::native;
  // The emulation covers the output (and the backward), not P̃: the matrix would be the native float32 one, under a
  // name that says otherwise.
  if (reduced && !o.matrix.empty())
    throw Error(fmt::format("--matrix: not under {} storage (the emulation rounds the output, not P̃, which would be "
                            "float32's); write the matrix in a run without --precision{}",
                            storage_name(opts.storage), o.p.precision == "fp16" && f.q.float16()
                                                            ? " (float16 files: --precision fp32)" : ""));
  const Index h = f.heads(), n_q = f.q.rows(), n_k = f.k.rows(), d_v = f.v.cols();
  // What the method will allocate, refused before any work when it cannot fit (exact:impl=materialized's P, ...).
  check_method_fits(*method, {n_q, n_k, f.q.cols(), d_v, sizeof(T)});
  set_work(fmt::format("apply {} on {} head{} of {}", method->spec(), h, h == 1 ? "" : "s",
                       describe_inputs(n_q, n_k, f.q.cols(), d_v, dtype_of<T>())));
  const auto shape = [&](Index rows, Index cols) {
    return f.batched() ? std::vector<Index>{h, rows, cols} : std::vector<Index>{rows, cols};
  };
  std::optional<NpyWriter<T>> matrix_out;
  if (!o.matrix.empty()) {
    check_memory(matrix_bytes(n_q, n_k, sizeof(T)),
                 "--matrix: the {}×{} {} attention matrix", n_q, n_k, dtype_name(dtype_of<T>()));
    matrix_out.emplace(o.matrix, shape(n_q, n_k));
  }
  NpyWriter<T> out(o.out, shape(n_q, d_v));
  MatrixR<T> qs, ks, vs;
  std::uint64_t nonfinite = 0, zero_rows = 0, rows = 0, zero_v_heads = 0;
  std::vector<std::string> overflowed, issues;
  std::string first_nan;  // the first intermediate stored with a NaN (the log's order): where a 0/0 or inf − inf arose
  for (Index i = 0; i < h; ++i) {
    method->compute(head_view<T>(f.q, i, qs), head_view<T>(f.k, i, ks), opts);
    // Natively a fit that did not succeed is an error; under a reduced storage it is part of the finding (Nyström's
    // pseudo-inverse of a landmark kernel the format overflowed), said on stderr with the output's counts.
    if (method->info() != Status::Success) {
      if (!reduced) throw Error(fmt::format("{} (head {}): {}", method->spec(), i, status_name(method->info())));
      issues.push_back(fmt::format("head {}: {}", i, status_name(method->info())));
    }
    const ConstRef<T> v_h = head_view<T>(f.v, i, vs);
    const MatrixR<T> o_h = method->output(v_h);
    if (reduced) {
      zero_v_heads += (v_h.array() == T(0)).all();
      // Under a reduced storage a non-finite or zero output is the finding: written, and said on stderr.
      const auto c = method->output_check();
      nonfinite += c.nonfinite;
      zero_rows += c.zero_rows;
      rows += c.rows;
      for (const auto& e : method->rounding()) {
        if (e.tally.overflow > 0 && std::find(overflowed.begin(), overflowed.end(), e.what) == overflowed.end())
          overflowed.push_back(e.what);
        if (first_nan.empty() && e.tally.nan > 0) first_nan = e.what;
      }
    } else {
      require_finite_output(o_h, "the output of {} (head {})", method->spec(), i);
    }
    out.write(o_h.data(), std::size_t(o_h.size()));
    if (matrix_out) {
      const MatrixR<T> p = method->matrix();
      require_finite_output(p, "the attention matrix of {} (head {})", method->spec(), i);
      matrix_out->write(p.data(), std::size_t(p.size()));
    }
  }
  out.close();
  if (matrix_out) matrix_out->close();
  if (reduced) {
    // A head whose V is all zero has rows of zeros by right: not counted (Method::output), and said.
    const std::string zero_v = zero_v_heads == 0 ? std::string()
                                                 : fmt::format(" (not counting the {} head(s) whose V is all zero)",
                                                               zero_v_heads);
    fmt::print(stderr,
               "apply: {} under {} storage ({}): {} non-finite output entries, {} of {} output rows all zero{}; "
               "overflowed: {}{}\n", method->spec(), storage_name(opts.storage), policy_name(opts.policy), nonfinite,
               zero_rows, rows, zero_v, overflowed.empty() ? std::string("nothing") : fmt::format("{}",
               fmt::join(overflowed, ", ")), first_nan.empty() ? "" : "; NaN first stored in: " + first_nan);
    if (!issues.empty()) fmt::print(stderr, "apply: the fit did not succeed ({})\n", fmt::join(issues, "; "));
    if (o.p.fail_on_nonfinite && (nonfinite > 0 || zero_rows > 0))
      throw Error(fmt::format("--fail-on-nonfinite: the output of {} under {} has {} non-finite entries and {} "
                              "all-zero rows (written to {})", method->spec(), storage_name(opts.storage), nonfinite,
                              zero_rows, o.out));
  }
}

}  // namespace

void add_apply(CLI::App& app) {
  auto o = std::make_shared<ApplyOptions>();
  auto* sub = app.add_subcommand("apply", "run a method on Q, K, V .npy files and write its output");
  sub->add_option("--method", o->method, "method spec, name[:key=value,...] (see `attnlab methods`)")
      ->capture_default_str();
  sub->add_option("--q", o->q, "queries, (n_q, d) or (h, n_q, d) .npy")->required();
  sub->add_option("--k", o->k, "keys, (n_k, d) or (h, n_k, d) .npy")->required();
  sub->add_option("--v", o->v, "values, (n_k, d_v) or (h, n_k, d_v) .npy")->required();
  sub->add_option("--out", o->out, "output .npy, (n_q, d_v) or (h, n_q, d_v)")->required();
  sub->add_option("--matrix", o->matrix, "also write the implied attention matrix, (n_q, n_k) or (h, n_q, n_k)");
  sub->add_flag("--causal", o->causal, "causal mask (queries aligned with the last keys when n_q < n_k)");
  sub->add_option("--scale", o->scale, "logit scale (default 1/sqrt(d))")->check(positive_finite());
  sub->add_option("--seed", o->seed, "seed for methods with randomness (when the spec gives none)");
  sub->add_option("--dtype", o->dtype, "compute type: auto (that of Q's file), f32, f64")
      ->check(CLI::IsMember({"auto", "f32", "f64"}))
      ->capture_default_str();
  add_precision_options(sub, o->p, "; float16 files ('<f2') default to fp16");
  sub->callback([o] {
    const auto proto = make_method<double>(o->method, o->seed);  // a bad spec fails before any file is read
    const std::string dtype = precision_dtype(o->p, o->dtype, {proto.get()});
    const QkvFiles f = load_qkv(o->q, o->k, o->v, dtype, "--dtype f32|f64");
    if (o->p.precision.empty() && dtype == "auto" && f.q.float16()) {
      // float16 files: computed as they are stored, in emulated float16 (--precision fp32 or --dtype computes natively)
      ApplyOptions half = *o;
      half.p.precision = "fp16";
      precision_dtype(half.p, "auto", {proto.get()});  // the method's storage, before any work
      run<float>(half, f);
      return;
    }
    require_reduced_for_policy(o->p);
    if (resolve_dtype(dtype, f.q) == DType::f32) run<float>(*o, f);
    else run<double>(*o, f);
  });
}

}  // namespace attnlab::cli
