// The one exception type attnlab throws for bad input, unsupported requests and resource limits.
// Messages are single lines that name the problem (and the file, where there is one), so the command
// can print them as they are and exit non-zero.
#pragma once

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

/// Code version baked in at build time ("0.1.0+<git sha>"), written into every result file.
const char* code_version();

}  // namespace attnlab
