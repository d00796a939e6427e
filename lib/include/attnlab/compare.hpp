// Methods against exact attention on one head: the errors of each method's output (and of its P̃ when asked) and
// what it cost, one row per method. Shared by `attnlab compare`, the Python module's compare() and the report.
#pragma once

#include "attnlab/cost.hpp"
#include "attnlab/method.hpp"
#include "attnlab/options.hpp"
#include "attnlab/types.hpp"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

struct CompareOptions {
  AttentionOptions attention;  ///< causal mask, scale (NaN: 1/√d)
  bool matrix_metrics = true;  ///< also the errors of P̃ against P (Frobenius, KL, TV; matrix-free, O(n²) time)
  bool spectral = true;        ///< with matrix_metrics: also the spectral norms (block Krylov)
  /// How each method and exact attention are timed (warm-up, repeats; memory off by default here: compare reports
  /// errors first, and the memory call would cost one more run of every method).
  CostOptions cost = [] {
    CostOptions c;
    c.memory = false;
    return c;
  }();
};

struct CompareRow {
  std::string method, spec;
  Cost cost;                ///< compute() + output() by the cost harness (cost.hpp)
  Cost exact_cost;          ///< exact streaming attention on the same head, by the same harness, in the same call
  double time_s() const { return cost.min_s; }
  double exact_time_s() const { return exact_cost.min_s; }
  /// exact time / method time (> 1: faster than exact), minima of both.
  double speedup() const { return attnlab::speedup(exact_cost.min_s, cost.min_s); }
  /// out_rel_fro, out_max_abs, out_mean_cosine, out_min_cosine, the method's diagnostics, then the P_* metrics.
  std::vector<std::pair<std::string, double>> metrics;
};

/// Throws Error("WHAT has non-finite values: a numerical failure") unless every entry of m is finite: a method's
/// numerical failure is an error, never a silent NaN in an output or a results file.
template <typename T>
void require_finite_output(const MatrixR<T>& m, const std::string& what);

/// Runs every method on (Q, K, V) against exact streaming attention; on_row (if given) sees each row as soon as it
/// is computed (progress). Throws Error for a method that cannot honour the causal mask, shape mismatches, and an
/// output that is not finite.
template <typename T>
std::vector<CompareRow> compare_methods(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                        const std::vector<std::unique_ptr<Method<T>>>& methods,
                                        const CompareOptions& opts,
                                        const std::function<void(const CompareRow&)>& on_row = {});

}  // namespace attnlab
