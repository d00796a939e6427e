// The method families whose error is measured against a budget (landmarks, features, k, codes, window, ...):
// shared by the `error_vs_budget` experiment, `attnlab report` and the Python module, so all sweep the same specs.
// Each is declared with its method's budget parameter (core/spec.hpp's Study: `p.integer("landmarks", ...)
// .budget(Study("nystrom", {8, 16, 32, 64, 128}).simplicity(3).listed(1))`); this reads them from the registry.
#pragma once

#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/types.hpp"

#include <algorithm>
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
  /// How much machinery the family adds (lower: simpler; Study::rank): the report's tie-break.
  int simplicity = Study::kLast;
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

/// Every registered method's declared families, in their declared places in the listing (Study::position; the
/// CSVs' order and the figures' colours).
inline std::vector<BudgetFamily> budget_families() {
  std::vector<std::pair<int, BudgetFamily>> placed;
  for (const MethodDescriptor& d : registered_methods())
    for (const ParamSpec& p : d.params)
      for (const Study& s : p.studies) {
        for (const auto& [at, f] : placed)
          require(f.label != s.label && at != s.position, "budget families {} and {} share a label or a place ({})",
                  f.label, s.label, at);
        BudgetFamily f{s.label, s.fixed.empty() ? d.name : d.name + ":" + s.fixed,
                       std::vector<Index>(s.budgets.begin(), s.budgets.end()), s.deployable, s.measure_cost, s.rank};
        placed.emplace_back(s.position, std::move(f));
      }
  std::stable_sort(placed.begin(), placed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<BudgetFamily> out;
  for (auto& [at, f] : placed) out.push_back(std::move(f));
  return out;
}

}  // namespace attnlab
