// What a method costs as a model runs it: the one cost harness behind every figure of time and memory (the
// benchmark, the experiments' cost rows, the report, `compare` and the Python module).
//
// Time: after `warmup` untimed calls, `repeats` timed calls in steady state — the same method object run again and
// again on the same shapes, as a layer runs in a model — each call compute() + output(). The minimum (the figure
// quoted: the least disturbed by the machine), the median and the largest are kept, so that a reader sees the
// spread. Memory: one separate, untimed call on a fresh method object, after free heap has been handed back to the
// system, reading the rise of the peak resident set; the timed calls are never perturbed by it (releasing memory
// before a timed call makes it pay page faults that a running model would not).
#pragma once

#include "attnlab/core/method.hpp"
#include "attnlab/core/options.hpp"
#include "attnlab/core/types.hpp"

#include <cstdint>
#include <functional>
#include <string>

namespace attnlab {

struct CostOptions {
  int warmup = 1;       ///< untimed calls before the timed ones (first-touch page faults, caches, lazily built state)
  int repeats = 5;      ///< timed calls
  bool memory = true;   ///< also measure the peak memory, in one separate untimed call
};

struct Cost {
  bool refused = false;      ///< the call threw attnlab::Error (e.g. the memory guard); `reason` says why
  std::string reason;
  int repeats = 0;           ///< timed calls behind the figures below
  double min_s = 0;          ///< fastest timed call (the figure quoted)
  double median_s = 0;       ///< median timed call
  double max_s = 0;          ///< slowest timed call
  /// Peak resident memory the call added (bytes; 0 when not measured). A lower bound: allocations glibc serves from
  /// memory that is already resident are not seen; exact for the large mmap-served buffers that dominate at large n.
  std::uint64_t peak_bytes = 0;
  /// Minor page faults per timed call (the whole process; Linux getrusage): memory the call maps afresh each time.
  /// In steady state a method that reuses its buffers faults little; one that allocates large buffers per call and
  /// hands them back pays a fault per 4 KiB page every call (the cost glibc's default allocator gives such buffers).
  double faults_per_call = 0;
  /// (median − min)/min: how far a typical call is from the quoted minimum; 0 with one repetition.
  double spread() const { return min_s > 0 ? (median_s - min_s) / min_s : 0.0; }
};

/// Times `call` as above (warm-up, repeats; min, median, max). `fresh_call`, when given, is run once, untimed,
/// for the memory figure (a call on a new object, so that state reused across calls is counted); without it the
/// memory is measured on `call` itself. A call that throws attnlab::Error gives a refused Cost.
Cost measure(const std::function<void()>& call, const CostOptions& opts = {},
             const std::function<void()>& fresh_call = {});

/// One call as the harness times it: m.compute(q, k, opts), then m.output(v) (the output discarded).
template <typename T>
void run_method_once(Method<T>& m, const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                     const AttentionOptions& opts);

/// The cost of the method `spec` (built with `seed`) on (q, k, v): timed on one method object, memory on another.
template <typename T>
Cost measure_method(const std::string& spec, const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                    std::uint64_t seed, const AttentionOptions& attention = {}, const CostOptions& opts = {});

/// The cost of an existing method object (timed on it; memory on a fresh object made from its spec).
template <typename T>
Cost measure_method(Method<T>& m, const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                    const AttentionOptions& attention = {}, const CostOptions& opts = {});

/// What the figures were taken on, recorded beside them: "threads=2 products=Eigen's own kernels isa=x86-64-v3".
std::string cost_context();

/// The machine's processor as the OS names it ("AMD EPYC 9B14"; /proc/cpuinfo's model name), "unknown CPU" when it
/// does not say.
std::string cpu_name();

/// The device every cost this machine measures holds for, for the sentence that quotes one (issue "Costs on the
/// machine the user runs"): "this machine's CPU (AMD EPYC 9B14; threads=2 products=... isa=...)".
std::string cost_device();

/// Speed-up of a method over exact attention, the one convention everywhere: exact time / method time (> 1: faster).
inline double speedup(double exact_seconds, double method_seconds) { return exact_seconds / method_seconds; }

}  // namespace attnlab
