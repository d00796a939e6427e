// The method families whose error is measured against a budget (landmarks, features, k, codes, window, ...):
// shared by the `error_vs_budget` experiment, `attnlab report` and the Python module, so all sweep the same specs.
#pragma once

#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/types.hpp"

#include <string>
#include <vector>

namespace attnlab {

struct BudgetFamily {
  std::string label, spec;  // spec prefix (may hold fixed options)
  std::vector<Index> budgets;
  /// An efficient method one would deploy; false for the analysis baselines (the Eckart–Young floor by SVD,
  /// classical CUR), which form or sweep all of P.
  bool deployable = true;
  /// Whether `error_vs_budget` times it: false for the SVD floor, a reference rather than a method to run (a dense
  /// SVD of all of P whatever the rank, the slowest call of the sweep), which the error-against-cost figure omits.
  bool measure_cost = true;
  /// The budget parameter: the method's own (its descriptor names it, see registry.hpp).
  std::string param() const {
    const std::string name = spec.substr(0, spec.find(':'));
    const std::string& p = find_method(name).budget;
    require(!p.empty(), "budget family " + label + ": method " + name + " names no budget parameter");
    return p;
  }
  /// The spec at one budget: prefix + "param=budget".
  std::string spec_at(Index budget) const {
    return spec + (spec.find(':') == std::string::npos ? ":" : ",") + param() + "=" + std::to_string(budget);
  }
};

inline std::vector<BudgetFamily> budget_families() {
  const std::vector<Index> ranks = {8, 16, 32, 64, 128};
  return {
      {"svd", "svd", ranks, false, false},
      {"nystrom", "nystrom", ranks},
      {"nystrom_svd", "nystrom:pinv=svd", ranks},
      {"linformer_pool", "linformer:projection=pool", ranks},
      {"linformer_gaussian", "linformer:projection=gaussian", ranks},
      {"cur", "cur", ranks, false},
      {"performer", "performer", {16, 32, 64, 128, 256}},
      {"vq", "vq", ranks},
      {"local", "local", {4, 8, 16, 32, 64}},
      {"reformer", "reformer:rounds=2", {8, 16, 32, 64, 128}},
      {"probsparse", "probsparse", {1, 2, 5, 10, 20}},
      {"scatterbrain", "scatterbrain:features=64", {4, 8, 16, 32, 64}},
  };
}

}  // namespace attnlab
