// Helpers shared by the experiments: generated problems, rows of the standard error metrics.
#pragma once

#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/metrics.hpp"
#include "attnlab/registry.hpp"
#include "attnlab/sources.hpp"
#include "sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <vector>

namespace attnlab::experiments {

/// A generated problem of the experiments' square shape (n queries and keys, d everywhere; d_v = d unless given).
inline Qkv<double> generated(const std::string& source, Index n, Index d, std::uint64_t seed, double temperature = 1.0,
                             Index d_v = -1) {
  SourceOptions so;
  so.kind = source;
  so.temperature = temperature;
  return generate_problem<double>(so, n, n, d, d_v < 0 ? d : d_v, seed);
}

/// Exact attention on a problem, what every method is measured against: P as an operator, and O = P·V.
struct Reference {
  explicit Reference(const Qkv<double>& p, const AttentionOptions& opts = {})
      : op(p.q, p.k, opts), out(exact_output<double>(p.q, p.k, p.v, opts)) {}
  ExactOperator<double> op;
  MatrixR<double> out;
};

/// The identifying columns of a point's rows (method, spec, metric and value are filled per row).
inline Row row_key(const std::string& source, Index n, Index d, std::uint64_t seed, std::string variant = "",
                   std::int64_t step = -1) {
  Row r;
  r.source = source;
  r.n = n;
  r.d = d;
  r.seed = seed;
  r.variant = std::move(variant);
  r.step = step;
  return r;
}

/// The rows every method comparison writes: output errors, matrix errors (spectral optional), time, diagnostics.
inline void method_rows(std::vector<Row>& rows, const Row& key, const std::string& spec, const Qkv<double>& p,
                        const Reference& exact, bool spectral, const AttentionOptions& opts = {}) {
  auto m = make_method<double>(spec, key.seed);
  const auto t0 = std::chrono::steady_clock::now();
  m->compute(p.q, p.k, opts);
  const MatrixR<double> out = m->output(p.v);
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto add = [&](const std::string& metric, double value) {
    Row r = key;
    r.method = m->name();
    r.spec = m->spec();
    r.metric = metric;
    r.value = value;
    rows.push_back(r);
  };
  for (const auto& [name, value] : named_metrics(output_errors<double>(exact.out, out))) add(name, value);
  MatrixErrorOptions mo;
  mo.spectral = spectral;
  for (const auto& [name, value] : named_metrics(matrix_errors<double>(exact.op, m->op(), mo))) add(name, value);
  add("time_s", t);
  for (const auto& [name, value] : m->diagnostics()) add(name, value);
}

/// −Σ_ij P_ij log P_ij (nats; 0 log 0 = 0) over a block of rows of P: divided by the rows, the mean row entropy.
inline double entropy_sum(const MatrixR<double>& p) { return -(p.array() * p.array().max(1e-300).log()).sum(); }

/// P's mean row entropy (nats) and ‖P‖_F², read `block` rows at a time (P is never formed whole).
struct RowStats {
  double mean_entropy = 0, fro2 = 0;
};
inline RowStats row_stats(const AttentionOperator<double>& p, Index block = 128) {
  RowStats s;
  const Index n = p.rows();
  for (Index i = 0; i < n; i += block) {
    const MatrixR<double> rows = p.row_block(i, std::min(block, n - i));
    s.mean_entropy += entropy_sum(rows);
    s.fro2 += rows.squaredNorm();
  }
  s.mean_entropy /= double(n);
  return s;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace attnlab::experiments
