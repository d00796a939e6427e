#include "inputs.hpp"

#include "attnlab/error.hpp"
#include "attnlab/tidy_csv.hpp"
#include "commands.hpp"

#include <fmt/format.h>

#include <cmath>

namespace attnlab::cli {
namespace {
std::string g_command_line;

std::string shape_of(const NpyArray& a) {
  return a.ndim() == 3 ? fmt::format("(h={}, n={}, d={})", a.heads(), a.rows(), a.cols())
                       : fmt::format("(n={}, d={})", a.rows(), a.cols());
}
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

QkvFiles load_qkv(const std::string& q, const std::string& k, const std::string& v) {
  QkvFiles f{NpyArray::read(q), NpyArray::read(k), NpyArray::read(v)};
  if (f.q.ndim() != f.k.ndim() || f.q.ndim() != f.v.ndim())
    throw Error(fmt::format("Q {} is {}, K {} is {}, V {} is {}: give all three as (n, d) or all as (h, n, d)", q,
                            shape_of(f.q), k, shape_of(f.k), v, shape_of(f.v)));
  if (f.q.heads() != f.k.heads() || f.q.heads() != f.v.heads())
    throw Error(fmt::format("head counts differ: Q {} has {}, K {} has {}, V {} has {}", q, f.q.heads(), k,
                            f.k.heads(), v, f.v.heads()));
  if (f.q.cols() != f.k.cols())
    throw Error(fmt::format("Q {} has d = {} but K {} has d = {}; they must match", q, f.q.cols(), k, f.k.cols()));
  if (f.k.rows() != f.v.rows())
    throw Error(fmt::format("K {} has n_k = {} rows but V {} has {}; they must match", k, f.k.rows(), v, f.v.rows()));
  f.q.check_finite();
  f.k.check_finite();
  f.v.check_finite();
  return f;
}

DType resolve_dtype(const std::string& flag, const NpyArray& q) {
  if (flag == "f32") return DType::f32;
  if (flag == "f64") return DType::f64;
  return q.dtype();
}

}  // namespace attnlab::cli
