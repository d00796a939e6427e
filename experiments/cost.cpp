// Time and peak memory of one method call (see cost.hpp).
#include "cost.hpp"

#include "attnlab/error.hpp"
#include "attnlab/registry.hpp"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <fstream>

namespace attnlab::experiments {
namespace {

/// VmRSS or VmHWM of this process, bytes (0 when unknown).
std::uint64_t proc_status(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string key, rest;
  std::uint64_t kb = 0;
  while (in >> key) {
    if (key == field) {
      in >> kb;
      return kb * 1024;
    }
    std::getline(in, rest);
  }
  return 0;
}

/// Return free heap memory to the system (so that new allocations raise the resident set), then reset the peak.
void reset_peak() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

}  // namespace

Cost measure_call(const std::function<void()>& f) {
  Cost c;
  const std::uint64_t before = proc_status("VmRSS:");
  reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const Error&) {
    c.refused = true;  // e.g. the memory guard: this size does not fit
    return c;
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::uint64_t hwm = proc_status("VmHWM:");
  c.peak_bytes = hwm > before ? hwm - before : 0;
  return c;
}

Cost measure_cost(const std::string& spec, const MatrixR<float>& q, const MatrixR<float>& k, const MatrixR<float>& v,
                  std::uint64_t seed, Index repeats, const AttentionOptions& opts) {
  auto m = make_method<float>(spec, seed);
  Cost c;
  c.seconds = 1e300;
  for (Index rep = 0; rep < std::max<Index>(1, repeats); ++rep) {
    const Cost one = measure_call([&] {
      m->compute(q, k, opts);
      const MatrixR<float> out = m->output(v);
    });
    if (one.refused) return one;
    c.seconds = std::min(c.seconds, one.seconds);
    c.peak_bytes = std::max(c.peak_bytes, one.peak_bytes);
  }
  return c;
}

}  // namespace attnlab::experiments
