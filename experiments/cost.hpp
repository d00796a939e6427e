// What a method costs as a user runs it: wall-clock time of compute() + output() in float32 (the minimum of a few
// repetitions) and the peak memory it allocates. Shared by `scaling` (cost against n) and `error_vs_budget`
// (error against cost, with each method's Pareto frontier).
#pragma once

#include "attnlab/options.hpp"
#include "attnlab/types.hpp"

#include <cstdint>
#include <functional>
#include <string>

namespace attnlab::experiments {

struct Cost {
  double seconds = 0;          // best of the repetitions
  std::uint64_t peak_bytes = 0;  // peak resident set above the resident set before the call (a lower bound)
  bool refused = false;        // the memory guard refused the size
};

/// Time and peak memory (as below) of one call of `f`; `refused` when it throws attnlab::Error.
Cost measure_call(const std::function<void()>& f);

/// Runs `spec` on (q, k, v) `repeats` times. Memory: the process's peak resident set is reset before each call
/// (Linux: writing 5 to /proc/self/clear_refs resets VmHWM, after malloc_trim returns free heap to the system) and
/// read after it, so the figure counts what the method allocated (inputs excluded); allocations that glibc serves
/// from memory still resident are not seen, so it is a lower bound, exact for the large mmap-served buffers that
/// dominate at large n.
Cost measure_cost(const std::string& spec, const MatrixR<float>& q, const MatrixR<float>& k, const MatrixR<float>& v,
                  std::uint64_t seed, Index repeats, const AttentionOptions& opts = {});

}  // namespace attnlab::experiments
