// A method against exact attention on one head (see evaluate.hpp).
#include "attnlab/analysis/evaluate.hpp"

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>

namespace attnlab {

template <typename T>
void require_finite_output(const MatrixR<T>& m, const std::string& what) {
  if (!all_finite(m)) throw Error(fmt::format("{} has non-finite values: a numerical failure", what));
}

template <typename T>
Reference<T>::Reference(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const AttentionOptions& opts)
    : opts_(opts), op_(q, k, opts), v_(v), out_(exact_output<T>(q, k, v, opts)) {
  require_finite_output(out_, "exact attention's output (the reference)");
}

template <typename T>
void Reference<T>::measure(const CostOptions& c) {
  const Cost cost = measure_method<T>("exact", q(), k(), v_, 0, opts_, c);
  if (cost.refused) throw Error(cost.reason);
  cost_ = cost;
}

std::optional<double> Evaluation::value(const std::string& metric) const {
  for (const auto* list : {&output_errors, &matrix_errors, &diagnostics})
    for (const auto& [name, v] : *list)
      if (name == metric) return v;
  return std::nullopt;
}

double Evaluation::speedup() const {
  return cost && exact_cost ? attnlab::speedup(exact_cost->min_s, cost->min_s)
                            : std::numeric_limits<double>::quiet_NaN();
}

template <typename T>
Evaluation evaluate(Method<T>& m, const Reference<T>& ref, const EvaluateOptions& opts) {
  Evaluation e;
  e.method = m.name();
  const auto t0 = std::chrono::steady_clock::now();
  m.compute(ref.q(), ref.k(), ref.options());
  const MatrixR<T> out = m.output(ref.v());
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.spec = m.spec();
  require_finite_output(out, "the output of {}", e.spec);
  e.output_errors = named_metrics(output_errors<T>(ref.output(), out));
  for (const auto& [name, value] : m.diagnostics())
    if (!std::isnan(value)) e.diagnostics.emplace_back(name, value);
  if (opts.matrix_errors) {
    MatrixErrorOptions mo;
    mo.spectral = opts.spectral;
    e.matrix_errors = named_metrics(matrix_errors<T>(ref.op(), m.op(), mo));
  }
  if (opts.cost) {
    // Timed last: the harness recomputes the method (same spec, same seed: the same state) in steady state.
    const Cost c = measure_method<T>(m, ref.q(), ref.k(), ref.v(), ref.options(), *opts.cost);
    if (c.refused) throw Error(c.reason);
    e.cost = c;
    e.exact_cost = ref.cost();
  }
  return e;
}

std::vector<std::pair<std::string, double>> evaluation_rows(const Evaluation& e) {
  std::vector<std::pair<std::string, double>> rows = e.output_errors;
  rows.emplace_back("time_s", e.time_s());
  if (e.cost) {
    rows.emplace_back("time_median_s", e.cost->median_s);
    if (e.exact_cost) {
      rows.emplace_back("exact_time_s", e.exact_cost->min_s);
      rows.emplace_back("speedup", e.speedup());
    }
  }
  rows.insert(rows.end(), e.diagnostics.begin(), e.diagnostics.end());
  rows.insert(rows.end(), e.matrix_errors.begin(), e.matrix_errors.end());
  return rows;
}

template <typename T>
std::vector<Evaluation> compare_methods(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                        const std::vector<std::unique_ptr<Method<T>>>& methods,
                                        const CompareOptions& opts,
                                        const std::function<void(const Evaluation&)>& on_row) {
  // Every refusal before any work: a causal mask a method cannot honour, a budget beyond the sequence, memory.
  for (const auto& m : methods) {
    if (opts.attention.causal && !m->supports_causal())
      throw Error(fmt::format("method '{}' cannot honour a causal mask", m->name()));
    check_method_fits<T>(*m, {q.rows(), k.rows(), q.cols(), v.cols(), sizeof(T)});
  }
  Reference<T> ref(q, k, v, opts.attention);
  // Exact attention timed by the same harness as the methods (warm-up, then repeats), so that no row pays the
  // process's first-call costs and the speed-ups compare like with like.
  ref.measure(opts.cost);
  EvaluateOptions eo;
  eo.matrix_errors = opts.matrix_metrics;
  eo.spectral = opts.spectral;
  eo.cost = opts.cost;
  std::vector<Evaluation> rows;
  for (const auto& m : methods) {
    throw_if_cancelled();
    rows.push_back(evaluate<T>(*m, ref, eo));
    if (on_row) on_row(rows.back());
  }
  return rows;
}

#define ATTNLAB_EVALUATE(T)                                                                                        \
  template void require_finite_output<T>(const MatrixR<T>&, const std::string&);                                  \
  template class Reference<T>;                                                                                     \
  template Evaluation evaluate<T>(Method<T>&, const Reference<T>&, const EvaluateOptions&);                      \
  template std::vector<Evaluation> compare_methods<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&, \
                                                      const std::vector<std::unique_ptr<Method<T>>>&,             \
                                                      const CompareOptions&,                                      \
                                                      const std::function<void(const Evaluation&)>&);
ATTNLAB_EVALUATE(float)
ATTNLAB_EVALUATE(double)
#undef ATTNLAB_EVALUATE

}  // namespace attnlab
