// A method against exact attention on one head: the one path from (method, reference) to numbers, used by `attnlab
// compare`, the experiments, the report and the Python module.
//   Reference<T> ref(q, k, v, opts);         // exact attention: O = P·V (streaming), P as an operator
//   Evaluation e = evaluate(method, ref);    // the method's output and P̃ errors, diagnostics, time
//   for (auto& [metric, value] : evaluation_rows(e)) ...   // one serializer: the tidy rows, in one order
#pragma once

#include "attnlab/analysis/cost.hpp"
#include "attnlab/analysis/metrics.hpp"
#include "attnlab/core/method.hpp"
#include "attnlab/core/options.hpp"
#include "attnlab/core/types.hpp"
#include "attnlab/operators/exact.hpp"

#include <fmt/core.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

/// Throws Error("WHAT has non-finite values: a numerical failure") unless every entry of m is finite: a method's
/// numerical failure is an error, never a silent NaN in an output or a results file.
template <typename T>
void require_finite_output(const MatrixR<T>& m, const std::string& what);
/// The same, formatting what = fmt::format(format, args...) only when it throws.
template <typename T, typename A, typename... Args>
void require_finite_output(const MatrixR<T>& m, fmt::format_string<A, Args...> format, A&& a, Args&&... args) {
  if (!all_finite(m)) require_finite_output(m, fmt::format(format, a, args...));
}

/// Exact attention on one head, what every method is measured against: the inputs (copies, O(n·d)), O = P·V by the
/// streaming kernel (checked finite: inputs that overflow exact attention are the inputs' fault, not a method's), and
/// P as an operator (matrix-free: Q, K and the row log-sum-exp) for the matrix errors.
template <typename T>
class Reference {
 public:
  Reference(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const AttentionOptions& opts = {});
  const MatrixR<T>& q() const { return op_.queries(); }
  const MatrixR<T>& k() const { return op_.keys(); }
  const MatrixR<T>& v() const { return v_; }
  const AttentionOptions& options() const { return opts_; }
  const MatrixR<T>& output() const { return out_; }
  const ExactOperator<T>& op() const { return op_; }
  /// Exact attention timed by the cost harness (compare's speed-ups), when set_cost() has been called.
  const std::optional<Cost>& cost() const { return cost_; }
  /// Times exact streaming attention by the same harness as the methods (warm-up, then repeats).
  void measure(const CostOptions& c);
  /// ‖P‖₂, spectral_norm(op()), computed on the first call (once, whichever thread calls) and kept: the
  /// denominator of every method's P_rel_spectral against this reference.
  const SpectralNormResult& spectral_norm() const;

 private:
  AttentionOptions opts_;
  ExactOperator<T> op_;
  MatrixR<T> v_, out_;
  std::optional<Cost> cost_;
  mutable std::once_flag spectral_once_;
  mutable SpectralNormResult spectral_;
};

extern template class Reference<float>;
extern template class Reference<double>;

struct EvaluateOptions {
  bool matrix_errors = true;  ///< the errors of P̃ against P (Frobenius, max, KL, TV; matrix-free, O(n²) time)
  bool spectral = true;       ///< with matrix_errors: also the spectral norms (block Krylov)
  /// Time the method by the cost harness (cost.hpp) after the errors. Unset: time_s is the wall time of the
  /// evaluated compute() + output() (one call, with its first-call costs: the experiments' rough figure).
  std::optional<CostOptions> cost;
  /// The method's storage and policy (the reference stays native, in T). Under bf16/fp16 the method also runs once
  /// natively in T, for its rounding error (round_rel_fro); a non-finite output is then the finding, not an error
  /// (its output errors are left out, its counts are diagnostics: reduced_storage_diagnostics); matrix errors and
  /// the timing are skipped (P̃ of the emulation is not formed, and the emulation's time is not the format's).
  Storage storage = Storage::native;
  Policy policy = Policy::eager;
};

/// What evaluate() found.
struct Evaluation {
  std::string method, spec;
  /// out_rel_fro, out_max_abs, out_mean_cosine, out_min_cosine (metrics.hpp: named_metrics).
  std::vector<std::pair<std::string, double>> output_errors;
  /// P_rel_fro, P_max_abs, then P_rel_spectral, P_mean_kl, P_mean_tv where computed (empty when not asked).
  std::vector<std::pair<std::string, double>> matrix_errors;
  /// The method's own numbers (Nyström's pinv_residual, ...), NaN ones dropped.
  std::vector<std::pair<std::string, double>> diagnostics;
  double seconds = 0;       ///< wall time of the evaluated compute() + output()
  std::optional<Cost> cost;        ///< the harness's timing, when asked
  std::optional<Cost> exact_cost;  ///< the reference's, when it was measured
  Storage storage = Storage::native;  ///< the method's storage (bf16, fp16: emulated; see EvaluateOptions)
  Policy policy = Policy::eager;
  /// Under a reduced storage: whether the output had non-finite entries or all-zero rows (the failure the
  /// diagnostics count).
  bool failed() const;
  /// A metric by name among the errors and diagnostics (nullopt when not computed).
  std::optional<double> value(const std::string& metric) const;
  /// The figure quoted as the method's time: the harness's minimum when measured, else the evaluated call's.
  double time_s() const { return cost ? cost->min_s : seconds; }
  /// exact time / method time (> 1: faster), minima of both; NaN without both costs.
  double speedup() const;
};

/// Under a reduced storage, what the method's last call did, as (name, value): per intermediate the entries that
/// overflowed, underflowed to zero or became NaN when stored (overflow[WHAT], underflow[WHAT], nan[WHAT]), then
/// output_nonfinite and output_zero_rows (Method::output_check). Empty for a native storage. The names the Python
/// module's Method.diagnostics, `compare`'s CSV and its table use.
template <typename T>
std::vector<std::pair<std::string, double>> reduced_storage_diagnostics(const Method<T>& m);

/// Computes `m` on the reference's Q, K (with its options), its output for V (checked finite), the errors against
/// the reference, its diagnostics and, when asked, its cost. Throws Error for a causal mask the method cannot honour
/// and for a non-finite output.
template <typename T>
Evaluation evaluate(Method<T>& m, const Reference<T>& ref, const EvaluateOptions& opts = {});

/// The one serializer: the evaluation as (metric, value) rows, in one order — the output errors (and, under a
/// reduced storage, round_rel_fro), the time (time_s, not under a reduced storage;
/// with a harness cost also time_median_s, exact_time_s when the reference was measured, speedup), the diagnostics,
/// the P̃ errors.
std::vector<std::pair<std::string, double>> evaluation_rows(const Evaluation& e);

struct CompareOptions {
  AttentionOptions attention;  ///< causal mask, scale (NaN: 1/√d)
  bool matrix_metrics = true;  ///< also the errors of P̃ against P
  bool spectral = true;        ///< with matrix_metrics: also the spectral norms (block Krylov)
  /// How each method and exact attention are timed (warm-up, repeats; memory off by default here: compare reports
  /// errors first, and the memory call would cost one more run of every method).
  CostOptions cost = [] {
    CostOptions c;
    c.memory = false;
    return c;
  }();
};

/// Every method evaluated on (Q, K, V) against exact streaming attention, each timed by the cost harness beside exact
/// attention's own timing; every refusal (a causal mask a method cannot honour, a budget beyond the sequence, memory)
/// before any work. on_row (if given) sees each evaluation as soon as it is made (progress).
template <typename T>
std::vector<Evaluation> compare_methods(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                        const std::vector<std::unique_ptr<Method<T>>>& methods,
                                        const CompareOptions& opts,
                                        const std::function<void(const Evaluation&)>& on_row = {});

}  // namespace attnlab
