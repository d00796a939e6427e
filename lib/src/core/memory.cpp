// Memory guard: a limit on single quadratic allocations, from the user or /proc/meminfo.
#include "attnlab/core/memory.hpp"

#include "attnlab/core/error.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace attnlab {
namespace {
std::atomic<std::uint64_t> g_limit{0};
}

void set_memory_limit(std::uint64_t bytes) { g_limit = bytes; }
std::uint64_t memory_limit() { return g_limit; }

std::uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

std::uint64_t matrix_bytes(std::uint64_t rows, std::uint64_t cols, std::uint64_t elem) {
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  if (rows != 0 && cols > max / rows) return max;
  const std::uint64_t n = rows * cols;
  if (elem != 0 && n > max / elem) return max;
  return n * elem;
}

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

bool fits_in_memory(std::uint64_t bytes) {
  const std::uint64_t user = g_limit;
  if (user != 0) return bytes <= user;
  const std::uint64_t avail = available_memory();
  return avail == 0 || bytes <= avail;
}

void check_memory(std::uint64_t bytes, const std::string& what) {
  const std::uint64_t user = g_limit;
  if (user != 0) {
    if (bytes > user)
      throw Error(fmt::format("{} needs {}, more than the memory limit of {} (--max-memory)", what,
                              format_bytes(bytes), format_bytes(user)));
    return;
  }
  const std::uint64_t avail = available_memory();
  if (avail != 0 && bytes > avail)
    throw Error(fmt::format("{} needs {}, but only {} of memory is available", what, format_bytes(bytes),
                            format_bytes(avail)));
}

std::uint64_t parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (...) {
    throw Error(fmt::format("cannot read '{}' as a memory size (e.g. 512M, 4G)", text));
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw Error(fmt::format("unknown unit '{}' in memory size '{}' (use K, M, G or T)", unit, text));
  const double bytes = v * mult;
  if (!std::isfinite(bytes) || bytes < 1 || bytes > 1.8e19)
    throw Error(fmt::format("memory size '{}' is out of range", text));
  return std::uint64_t(bytes);
}

}  // namespace attnlab
