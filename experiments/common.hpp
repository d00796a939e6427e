// Helpers shared by the experiments: generated problems, rows of the standard error metrics.
#pragma once

#include "attnlab/core/error.hpp"
#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/analysis/metrics.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/io/sources.hpp"
#include "sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
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

/// The identifying columns of a point's rows (method, spec, metric and value are filled per row); `where` gives the
/// source and, for a model head, its sequence, layer and head (head_row() in model_data.hpp).
inline Row row_key(Row where, Index n, Index d, std::uint64_t seed, std::string variant = "", std::int64_t step = -1) {
  Row r = std::move(where);
  r.n = n;
  r.d = d;
  r.seed = seed;
  r.variant = std::move(variant);
  r.step = step;
  return r;
}

/// The rows of a generated source: only the source column says where they come from.
inline Row source_row(const std::string& source) {
  Row r;
  r.source = source;
  return r;
}

inline Row row_key(const std::string& source, Index n, Index d, std::uint64_t seed, std::string variant = "",
                   std::int64_t step = -1) {
  return row_key(source_row(source), n, d, seed, std::move(variant), step);
}

/// The rows every method comparison writes: the library's evaluation (analysis/evaluate.hpp) of the method built
/// from `spec` (seeded by the point's seed) against exact attention, through its one serializer.
inline void method_rows(std::vector<Row>& rows, const Row& key, const std::string& spec, const Qkv<double>&,
                        const Reference<double>& exact, bool spectral) {
  auto m = make_method<double>(spec, key.seed);
  EvaluateOptions eo;
  eo.spectral = spectral;
  const Evaluation e = attnlab::evaluate<double>(*m, exact, eo);
  for (const auto& [metric, value] : evaluation_rows(e)) {
    Row r = key;
    r.method = e.method;
    r.spec = e.spec;
    r.metric = metric;
    r.value = value;
    rows.push_back(r);
  }
}

/// One grid point per seed 0, ..., seeds − 1 of a generated problem: id "`id` seed=S" (the points' ids are the
/// results' point column, which a re-run resumes by), rows run(S).
template <typename Run>
void add_seed_points(std::vector<Point>& pts, Index seeds, const std::string& id, Run run) {
  for (Index s = 0; s < seeds; ++s)
    pts.push_back({fmt::format("{} seed={}", id, s), [=] { return run(std::uint64_t(s)); }});
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace attnlab::experiments
