// The cost harness (see cost.hpp).
#include "attnlab/analysis/cost.hpp"

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/reproducible.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

namespace attnlab {
namespace {

/// VmRSS or VmHWM of this process, bytes (0 when unknown: not Linux).
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

/// Peak resident memory one call adds: free heap handed back to the system (so that the call's allocations raise
/// the resident set), the peak reset (Linux: 5 > /proc/self/clear_refs resets VmHWM), the call, the peak read.
/// Only ever around an untimed call.
std::uint64_t peak_memory_of(const std::function<void()>& call) {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  const std::uint64_t before = proc_status("VmRSS:");
  std::ofstream("/proc/self/clear_refs") << "5";
  call();
  const std::uint64_t hwm = proc_status("VmHWM:");
  return hwm > before ? hwm - before : 0;
}

/// Minor page faults of this process so far.
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double seconds_of(const std::function<void()>& call) {
  const auto t0 = std::chrono::steady_clock::now();
  call();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Cost measure(const std::function<void()>& call, const CostOptions& opts, const std::function<void()>& fresh_call) {
  require(opts.repeats >= 1, "cost: repeats must be at least 1 (got {})", opts.repeats);
  require(opts.warmup >= 0, "cost: warmup must be at least 0 (got {})", opts.warmup);
  Cost c;
  try {
    // Memory first, on its own call: the warm-up then brings back whatever the trim released, untimed.
    if (opts.memory) c.peak_bytes = peak_memory_of(fresh_call ? fresh_call : call);
    for (int i = 0; i < opts.warmup; ++i) call();
    std::vector<double> t;
    t.reserve(std::size_t(opts.repeats));
    const long faults0 = minor_faults();
    for (int i = 0; i < opts.repeats; ++i) t.push_back(seconds_of(call));
    c.faults_per_call = double(minor_faults() - faults0) / opts.repeats;
    std::sort(t.begin(), t.end());
    c.repeats = opts.repeats;
    c.min_s = t.front();
    c.max_s = t.back();
    const std::size_t mid = t.size() / 2;
    c.median_s = t.size() % 2 ? t[mid] : 0.5 * (t[mid - 1] + t[mid]);
  } catch (const Interrupted&) {
    throw;  // Ctrl-C stops the measurement; it is not a refusal
  } catch (const Error& e) {
    c = Cost{};
    c.refused = true;  // e.g. the memory guard: this size does not fit
    c.reason = e.what();
  }
  return c;
}

template <typename T>
void run_method_once(Method<T>& m, const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                     const AttentionOptions& opts) {
  m.compute(q, k, opts);
  const MatrixR<T> out = m.output(v);
  // Keep the output observable so that the call cannot be optimized away.
  if (out.size() > 0) {
    volatile T sink = out(0, 0);
    (void)sink;
  }
}

template <typename T>
Cost measure_method(Method<T>& m, const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                    const AttentionOptions& attention, const CostOptions& opts) {
  const std::string spec = m.spec();
  const std::function<void()> fresh = [&] {
    auto f = make_method<T>(spec);
    run_method_once<T>(*f, q, k, v, attention);
  };
  return measure([&] { run_method_once<T>(m, q, k, v, attention); }, opts, fresh);
}

template <typename T>
Cost measure_method(const std::string& spec, const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                    std::uint64_t seed, const AttentionOptions& attention, const CostOptions& opts) {
  std::unique_ptr<Method<T>> m;
  try {
    m = make_method<T>(spec, seed);
  } catch (const Error& e) {
    Cost c;
    c.refused = true;
    c.reason = e.what();
    return c;
  }
  return measure_method<T>(*m, q, k, v, attention, opts);
}

std::string cost_context() {
#if defined(__AVX512F__)
  const char* isa = "AVX-512";
#elif defined(__AVX2__)
  const char* isa = "AVX2";
#else
  const char* isa = "baseline";
#endif
  return fmt::format("threads={} products={} isa={}", omp_get_max_threads(), product_backend(), isa);
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) break;
      std::string name = line.substr(colon + 1);
      const auto first = name.find_first_not_of(" \t");
      return first == std::string::npos ? "unknown CPU" : name.substr(first);
    }
  return "unknown CPU";
}

std::string cost_device() { return fmt::format("this machine's CPU ({}; {})", cpu_name(), cost_context()); }

template void run_method_once<float>(Method<float>&, const ConstRef<float>&, const ConstRef<float>&,
                                     const ConstRef<float>&, const AttentionOptions&);
template void run_method_once<double>(Method<double>&, const ConstRef<double>&, const ConstRef<double>&,
                                      const ConstRef<double>&, const AttentionOptions&);
template Cost measure_method<float>(Method<float>&, const ConstRef<float>&, const ConstRef<float>&,
                                    const ConstRef<float>&, const AttentionOptions&, const CostOptions&);
template Cost measure_method<double>(Method<double>&, const ConstRef<double>&, const ConstRef<double>&,
                                     const ConstRef<double>&, const AttentionOptions&, const CostOptions&);
template Cost measure_method<float>(const std::string&, const ConstRef<float>&, const ConstRef<float>&,
                                    const ConstRef<float>&, std::uint64_t, const AttentionOptions&,
                                    const CostOptions&);
template Cost measure_method<double>(const std::string&, const ConstRef<double>&, const ConstRef<double>&,
                                     const ConstRef<double>&, std::uint64_t, const AttentionOptions&,
                                     const CostOptions&);

}  // namespace attnlab
