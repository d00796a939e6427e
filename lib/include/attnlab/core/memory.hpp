// The memory guard: before forming anything quadratic, estimate its size and refuse with a clear message
// when it will not fit — in the machine's available memory, or in a limit the user set.
#pragma once

#include <fmt/core.h>

#include <cstdint>
#include <string>

namespace attnlab {

/// Sets a limit on any single quadratic allocation (0: none but the machine's available memory).
void set_memory_limit(std::uint64_t bytes);
std::uint64_t memory_limit();
/// MemAvailable from /proc/meminfo (bytes); 0 if unknown.
std::uint64_t available_memory();
/// Throws Error("<what> needs X but only Y ...") when `bytes` exceeds the limit.
void check_memory(std::uint64_t bytes, const std::string& what);
/// Whether check_memory(bytes, ...) passes.
bool fits_in_memory(std::uint64_t bytes);
/// The same, formatting what = fmt::format(format, args...) only when it refuses.
template <typename A, typename... Args>
void check_memory(std::uint64_t bytes, fmt::format_string<A, Args...> format, A&& a, Args&&... args) {
  if (!fits_in_memory(bytes)) check_memory(bytes, fmt::format(format, a, args...));
}
/// Bytes of a rows×cols matrix of `elem` bytes, saturating instead of overflowing.
std::uint64_t matrix_bytes(std::uint64_t rows, std::uint64_t cols, std::uint64_t elem);
/// a + b, saturating instead of overflowing (sums of matrix_bytes).
inline std::uint64_t add_bytes(std::uint64_t a, std::uint64_t b) {
  return a > ~std::uint64_t(0) - b ? ~std::uint64_t(0) : a + b;
}
/// "1.5 GiB", "512 MiB", ...
std::string format_bytes(std::uint64_t bytes);
/// Parses "512M", "4G", "1.5GiB", "1000000" (bytes); throws Error on anything else.
std::uint64_t parse_bytes(const std::string& text);

}  // namespace attnlab
