// Error type, code version, status names and the shape checks every entry point shares.
#include "attnlab/core/error.hpp"

#include "attnlab/core/options.hpp"
#include "attnlab/core/types.hpp"

#include <fmt/format.h>

namespace attnlab {

Error::Error(const std::string& message) : std::runtime_error(message) {}

void detail::throw_formatted(fmt::string_view format, fmt::format_args args) {
  throw Error(fmt::vformat(format, args));
}

const char* status_name(Status s) {
  switch (s) {
    case Status::Success: return "success";
    case Status::NotComputed: return "not computed";
    case Status::NoConvergence: return "no convergence";
    case Status::NumericalIssue: return "numerical issue";
  }
  return "unknown";
}

void validate_qk(Index n_q, Index d_q, Index n_k, Index d_k, const AttentionOptions& opts) {
  require(n_q > 0 && n_k > 0, "empty problem: Q has {} rows and K has {}", n_q, n_k);
  require(d_q > 0, "Q and K need at least one feature column");
  require(d_q == d_k,
          "Q has d = {} features but K has d = {}; they must match", d_q, d_k);
  const double s = opts.resolved_scale(d_q);
  require(std::isfinite(s) && s > 0, "scale must be finite and positive, got {}", s);
  if (opts.causal)
    require(n_k >= n_q, "a causal mask with {} queries and {} keys leaves queries without keys: "
                        "causal alignment needs n_k >= n_q (queries align with the last keys)",
                        n_q, n_k);
}

void validate_v(Index n_k, Index v_rows) {
  require(v_rows == n_k, "K has n_k = {} rows but V has {}; they must match", n_k, v_rows);
}

}  // namespace attnlab
