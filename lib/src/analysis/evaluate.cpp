// A method against exact attention on one head (see evaluate.hpp).
#include "attnlab/analysis/evaluate.hpp"

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <type_traits>

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

template <typename T>
const SpectralNormResult& Reference<T>::spectral_norm() const {
  std::call_once(spectral_once_, [this] { spectral_ = attnlab::spectral_norm<T>(op_); });
  return spectral_;
}

std::optional<double> Evaluation::value(const std::string& metric) const {
  for (const auto* list : {&output_errors, &matrix_errors, &diagnostics})
    for (const auto& [name, v] : *list)
      if (name == metric) return v;
  return std::nullopt;
}

bool Evaluation::failed() const {
  for (const char* name : {"output_nonfinite", "output_zero_rows"})
    if (const auto x = value(name); x && *x > 0) return true;
  return false;
}

template <typename T>
std::vector<std::pair<std::string, double>> reduced_storage_diagnostics(const Method<T>& m) {
  std::vector<std::pair<std::string, double>> rows;
  if (m.options().storage == Storage::native) return rows;
  for (const auto& e : m.rounding()) {
    rows.emplace_back("overflow[" + e.what + "]", double(e.tally.overflow));
    rows.emplace_back("underflow[" + e.what + "]", double(e.tally.underflow));
    rows.emplace_back("nan[" + e.what + "]", double(e.tally.nan));
  }
  const OutputCheck c = m.output_check();
  rows.emplace_back("output_nonfinite", double(c.nonfinite));
  rows.emplace_back("output_zero_rows", double(c.zero_rows));
  return rows;
}

double Evaluation::speedup() const {
  return cost && exact_cost ? attnlab::speedup(exact_cost->min_s, cost->min_s)
                            : std::numeric_limits<double>::quiet_NaN();
}

template <typename T>
Evaluation evaluate(Method<T>& m, const Reference<T>& ref, const EvaluateOptions& opts) {
  Evaluation e;
  e.method = m.name();
  e.storage = opts.storage;
  e.policy = opts.policy;
  const bool reduced = opts.storage != Storage::native;
  MatrixR<T> own;  // reduced: the same method (same spec and seed: the same draws) in T, for its rounding error
  if (reduced) {
    m.compute(ref.q(), ref.k(), ref.options());
    own = m.output(ref.v());
    require_finite_output(own, "the output of {} in {}", m.spec(), dtype_name(dtype_of<T>()));
  }
  AttentionOptions a = ref.options();
  a.storage = opts.storage;
  a.policy = opts.policy;
  const auto t0 = std::chrono::steady_clock::now();
  m.compute(ref.q(), ref.k(), a);
  const MatrixR<T> out = m.output(ref.v());
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.spec = m.spec();
  if (!reduced) require_finite_output(out, "the output of {}", e.spec);
  for (const auto& [name, value] : m.diagnostics())
    if (!std::isnan(value)) e.diagnostics.emplace_back(name, value);
  if (reduced) {
    // The failure is the finding (issue "Reduced precision"): counted, and no error of a non-finite output.
    for (const auto& row : reduced_storage_diagnostics(m)) e.diagnostics.push_back(row);
    if (all_finite(out)) {
      e.output_errors = named_metrics(output_errors<T>(ref.output(), out));
      e.output_errors.emplace_back("round_rel_fro", output_errors<T>(own, out).rel_fro);
    }
    return e;
  }
  e.output_errors = named_metrics(output_errors<T>(ref.output(), out));
  if (opts.matrix_errors) {
    MatrixErrorOptions mo;
    mo.spectral = opts.spectral;
    if (opts.spectral) mo.exact_spectral = ref.spectral_norm();
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
  // Under emulation no time: it would be the emulation's, not the format's.
  if (e.storage == Storage::native) rows.emplace_back("time_s", e.time_s());
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
    if (opts.attention.storage != Storage::native) {
      require(std::is_same_v<T, float>, "compare: {} storage is emulated over float32 accumulation; give float32 "
              "inputs", storage_name(opts.attention.storage));
      m->check_storage_support(opts.attention.storage, opts.attention.policy);
    }
  }
  // The reference is native (exact attention in T); the methods run in opts.attention's storage and policy.
  AttentionOptions native = opts.attention;
  native.storage = Storage::native;
  const bool reduced = opts.attention.storage != Storage::native;
  Reference<T> ref(q, k, v, native);
  EvaluateOptions eo;
  eo.matrix_errors = opts.matrix_metrics && !reduced;
  eo.spectral = opts.spectral;
  eo.storage = opts.attention.storage;
  eo.policy = opts.attention.policy;
  if (!reduced) {
    // Exact attention timed by the same harness as the methods (warm-up, then repeats), so that no row pays the
    // process's first-call costs and the speed-ups compare like with like. Not under emulation: its time is the
    // emulation's, not the format's.
    ref.measure(opts.cost);
    eo.cost = opts.cost;
  }
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
  template std::vector<std::pair<std::string, double>> reduced_storage_diagnostics<T>(const Method<T>&);          \
  template Evaluation evaluate<T>(Method<T>&, const Reference<T>&, const EvaluateOptions&);                      \
  template std::vector<Evaluation> compare_methods<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&, \
                                                      const std::vector<std::unique_ptr<Method<T>>>&,             \
                                                      const CompareOptions&,                                      \
                                                      const std::function<void(const Evaluation&)>&);
ATTNLAB_EVALUATE(float)
ATTNLAB_EVALUATE(double)
#undef ATTNLAB_EVALUATE

}  // namespace attnlab
