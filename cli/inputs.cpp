#include "inputs.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/core/precision.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/io/tidy_csv.hpp"
#include "commands.hpp"

#include <fmt/format.h>

#include <cmath>

namespace attnlab::cli {
namespace {
std::string g_command_line;
std::string g_work;

}  // namespace

void set_command_line(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) g_command_line += (i ? " " : "") + csv_field(argv[i]);
}
const std::string& command_line() { return g_command_line; }

CLI::Validator positive_finite() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double x = 0;
        std::size_t pos = 0;
        try {
          x = std::stod(s, &pos);
        } catch (...) {
          return "'" + s + "' is not a number";
        }
        if (pos != s.size() || !std::isfinite(x) || x <= 0) return "'" + s + "' must be a finite number > 0";
        return "";
      },
      "POSITIVE");
}

CLI::Option* add_qkv_files(CLI::App* sub, std::string& q, std::string& k, std::string& v, const std::string& q_help) {
  auto* qo = sub->add_option("--q", q, q_help);
  auto* ko = sub->add_option("--k", k, "keys .npy");
  auto* vo = sub->add_option("--v", v, "values .npy");
  qo->needs(ko, vo);
  ko->needs(qo, vo);
  vo->needs(qo, ko);
  return qo;
}

void add_precision_options(CLI::App* sub, PrecisionOptions& o, const std::string& what) {
  sub->add_option("--precision", o.precision,
                  "emulated storage precision: fp64 or fp32 (native, in that type), bf16 or fp16 (the method's tensors "
                  "stored in the format over float32 accumulation; see `attnlab methods` for which)" + what)
      ->check(CLI::IsMember({"fp64", "fp32", "bf16", "fp16"}));
  sub->add_option("--policy", o.policy,
                  "with --precision bf16|fp16: eager (every intermediate stored in the format) or careful "
                  "(accumulators, normalisers, softmax statistics and states in float32)")
      ->check(CLI::IsMember({"eager", "careful"}))
      ->capture_default_str();
  sub->add_flag("--fail-on-nonfinite", o.fail_on_nonfinite,
                "with --precision bf16|fp16: exit non-zero when an output has non-finite entries or all-zero rows (it "
                "is written either way, and said on stderr)");
}

void require_reduced_for_policy(const PrecisionOptions& o) {
  if (o.precision == "bf16" || o.precision == "fp16") return;
  const std::string run =
      o.precision.empty() ? "without --precision (and float16 files)" : "--precision " + o.precision;
  require(o.policy == "eager", "--policy {}: only under --precision bf16 or fp16; {} rounds nothing", o.policy, run);
  if (o.fail_on_nonfinite)
    throw Error(fmt::format("--fail-on-nonfinite: only under --precision bf16 or fp16 ({} a non-finite output is an "
                            "error already)", run));
}

std::string precision_dtype(const PrecisionOptions& o, const std::string& dtype,
                            const std::vector<const Method<double>*>& methods) {
  if (o.precision.empty()) return dtype;
  require_reduced_for_policy(o);  // an explicit fp32/fp64: before any file is read
  const std::string want = o.precision == "fp64" ? "f64" : "f32";
  if (dtype != "auto" && dtype != want)
    throw Error(fmt::format("--dtype {} contradicts --precision {}, which computes in {}; give one of them", dtype,
                            o.precision, want));
  for (const Method<double>* m : methods) m->check_storage_support(parse_storage(o.precision), parse_policy(o.policy));
  return want;
}

void set_work(std::string what) { g_work = std::move(what); }
const std::string& work() { return g_work; }

std::uint64_t input_bytes(Index n_q, Index n_k, Index d, Index d_v, DType dtype) {
  const std::uint64_t e = dtype == DType::f32 ? 4 : 8;
  return add_bytes(add_bytes(matrix_bytes(n_q, d, e), matrix_bytes(n_k, d, e)), matrix_bytes(n_k, d_v, e));
}

std::string describe_inputs(Index n_q, Index n_k, Index d, Index d_v, DType dtype, bool bytes) {
  return fmt::format("Q {}×{}, K {}×{}, V {}×{} {}{}", n_q, d, n_k, d, n_k, d_v, dtype_name(dtype),
                     bytes ? " (" + format_bytes(input_bytes(n_q, n_k, d, d_v, dtype)) + ")" : "");
}

QkvFiles load_qkv(const std::string& q, const std::string& k, const std::string& v, const std::string& dtype_flag,
                  const std::string& dtype_option) {
  QkvFiles f{NpyArray::read(q), NpyArray::read(k), NpyArray::read(v)};
  check_qkv_arrays(f.q, f.k, &f.v, "", dtype_flag == "f32" || dtype_flag == "f64",
                   dtype_option.empty() ? ""
                                        : fmt::format(", or choose the compute dtype with {} (every file is then cast "
                                                      "to it)", dtype_option));
  if (dtype_flag == "f32")  // a float64 file computed in float32 (--dtype f32, or --precision fp32 / bf16 / fp16)
    for (const NpyArray* a : {&f.q, &f.k, &f.v})
      a->check_fits_float32(", the type it is computed in here (--dtype f32, or --precision fp32, bf16 or fp16: "
                            "their accumulation); compute it in float64 with --dtype f64 or --precision fp64");
  return f;
}

DType resolve_dtype(const std::string& flag, const NpyArray& q) {
  if (flag == "f32") return DType::f32;
  if (flag == "f64") return DType::f64;
  return q.dtype();
}

}  // namespace attnlab::cli
