// The method families whose error is measured against a budget (landmarks, features, k, codes, window, ...):
// shared by `error_vs_budget` and `attnlab report`, so both sweep the same specs.
#pragma once

#include "attnlab/types.hpp"

#include <string>
#include <vector>

namespace attnlab::experiments {

struct BudgetFamily {
  std::string label, spec, param;  // spec prefix (may hold fixed options), the budget parameter
  std::vector<Index> budgets;
  /// An efficient method one would deploy; false for the analysis baselines (the Eckart–Young floor by SVD,
  /// classical CUR), which form or sweep all of P.
  bool deployable = true;
  /// The spec at one budget: prefix + "param=budget".
  std::string spec_at(Index budget) const {
    return spec + (spec.find(':') == std::string::npos ? ":" : ",") + param + "=" + std::to_string(budget);
  }
};

inline std::vector<BudgetFamily> budget_families() {
  const std::vector<Index> ranks = {8, 16, 32, 64, 128};
  return {
      {"svd", "svd", "rank", ranks, false},
      {"nystrom", "nystrom", "landmarks", ranks},
      {"nystrom_svd", "nystrom:pinv=svd", "landmarks", ranks},
      {"linformer_pool", "linformer:projection=pool", "k", ranks},
      {"linformer_gaussian", "linformer:projection=gaussian", "k", ranks},
      {"cur", "cur", "columns", ranks, false},
      {"performer", "performer", "features", {16, 32, 64, 128, 256}},
      {"vq", "vq", "codes", ranks},
      {"local", "local", "window", {4, 8, 16, 32, 64}},
      {"reformer", "reformer:rounds=2", "chunk", {8, 16, 32, 64, 128}},
      {"probsparse", "probsparse", "factor", {1, 2, 5, 10, 20}},
      {"scatterbrain", "scatterbrain:features=64", "window", {4, 8, 16, 32, 64}},
  };
}

}  // namespace attnlab::experiments
