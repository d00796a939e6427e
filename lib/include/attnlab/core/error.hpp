// The one exception type attnlab throws for bad input, unsupported requests and resource limits.
// Messages are single lines that name the problem (and the file, where there is one), so the command
// can print them as they are and exit non-zero.
#pragma once

#include <fmt/core.h>

#include <stdexcept>
#include <string>

namespace attnlab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
};

/// Throws Error(message) when cond is false.
inline void require(bool cond, const std::string& message) {
  if (!cond) throw Error(message);
}

namespace detail {
/// Throws Error(fmt::vformat(format, args)): the failure path of the formatting require, out of line.
[[noreturn]] void throw_formatted(fmt::string_view format, fmt::format_args args);
}  // namespace detail

/// Throws Error(fmt::format(format, args...)) when cond is false, and formats nothing when it holds (faiss's
/// FAISS_THROW_IF_NOT_FMT): `require(k <= n, "k = {} exceeds n = {}", k, n)`. At least one argument after the
/// format, so that `require(cond, "text")` is always the overload above.
template <typename A, typename... Args>
inline void require(bool cond, fmt::format_string<A, Args...> format, A&& a, Args&&... args) {
  if (!cond) detail::throw_formatted(format, fmt::make_format_args(a, args...));
}

/// Code version baked in at build time ("0.1.0+<git sha>"), written into every result file.
const char* code_version();

}  // namespace attnlab
