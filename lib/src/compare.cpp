// Methods against exact attention on one head (see compare.hpp).
#include "attnlab/compare.hpp"

#include "attnlab/cancel.hpp"
#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/metrics.hpp"
#include "attnlab/registry.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace attnlab {
template <typename T>
std::vector<CompareRow> compare_methods(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                        const std::vector<std::unique_ptr<Method<T>>>& methods,
                                        const CompareOptions& opts,
                                        const std::function<void(const CompareRow&)>& on_row) {
  // Every refusal before any work: a causal mask a method cannot honour, a budget beyond the sequence, memory.
  for (const auto& m : methods) {
    if (opts.attention.causal && !m->supports_causal())
      throw Error(fmt::format("method '{}' cannot honour a causal mask", m->name()));
    check_method_fits<T>(*m, {q.rows(), k.rows(), q.cols(), v.cols(), sizeof(T)});
  }
  const MatrixR<T> exact_out = exact_output<T>(q, k, v, opts.attention);
  // Exact attention first: inputs that overflow it (1e300) are the inputs' fault, not the first method's.
  require_finite_output(exact_out, "exact attention's output (the reference)");
  // Exact attention timed by the same harness as the methods (warm-up, then repeats), so that no row pays the
  // process's first-call costs and the speed-ups compare like with like.
  const Cost exact_cost = measure_method<T>("exact", q, k, v, 0, opts.attention, opts.cost);
  if (exact_cost.refused) throw Error(exact_cost.reason);
  std::optional<ExactOperator<T>> exact_op;
  if (opts.matrix_metrics) exact_op.emplace(q, k, opts.attention);
  MatrixErrorOptions mopts;
  mopts.spectral = opts.spectral;

  std::vector<CompareRow> rows;
  for (const auto& m : methods) {
    throw_if_cancelled();
    CompareRow row;
    row.method = m->name();
    row.spec = m->spec();
    m->compute(q, k, opts.attention);
    const MatrixR<T> out = m->output(v);
    row.exact_cost = exact_cost;
    require_finite_output(out, fmt::format("the output of {}", row.spec));
    row.metrics = named_metrics(output_errors<T>(exact_out, out));
    for (const auto& [name, value] : m->diagnostics())
      if (!std::isnan(value)) row.metrics.emplace_back(name, value);
    if (exact_op)
      for (const auto& nv : named_metrics(matrix_errors<T>(*exact_op, m->op(), mopts))) row.metrics.push_back(nv);
    // Timed last: the harness recomputes the method (same spec, same seed: the same state) in steady state.
    row.cost = measure_method<T>(*m, q, k, v, opts.attention, opts.cost);
    if (row.cost.refused) throw Error(row.cost.reason);
    if (on_row) on_row(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

template <typename T>
void require_finite_output(const MatrixR<T>& m, const std::string& what) {
  if (!all_finite(m)) throw Error(fmt::format("{} has non-finite values: a numerical failure", what));
}

template void require_finite_output<float>(const MatrixR<float>&, const std::string&);
template void require_finite_output<double>(const MatrixR<double>&, const std::string&);
template std::vector<CompareRow> compare_methods<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                        const ConstRef<float>&,
                                                        const std::vector<std::unique_ptr<Method<float>>>&,
                                                        const CompareOptions&,
                                                        const std::function<void(const CompareRow&)>&);
template std::vector<CompareRow> compare_methods<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                         const ConstRef<double>&,
                                                         const std::vector<std::unique_ptr<Method<double>>>&,
                                                         const CompareOptions&,
                                                         const std::function<void(const CompareRow&)>&);

}  // namespace attnlab
