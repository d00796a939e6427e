// The low-rank methods' shared checks (attnlab/methods/base/lowrank_method.hpp): a budget that counts rows and
// columns taken from P cannot exceed min(n_q, n_k).
#include "attnlab/methods/base/lowrank_method.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace attnlab {

SizeCheck budget_within_min_n(const std::string& method, const std::string& param) {
  return [method, param](const Params& p, const ProblemSize& s) {
    require_budget_within(method, param, p.integer(param), std::min(s.n_q, s.n_k), "min(n_q, n_k)");
  };
}

void require_within_min_n(const std::string& method, const std::string& param, Index value, Index n_q, Index n_k) {
  require(value <= std::min(n_q, n_k),
          "{}: {} = {} exceeds min(n_q, n_k) = {}", method, param, value, std::min(n_q, n_k));
}

}  // namespace attnlab
