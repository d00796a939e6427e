// What the method suites (bench_methods.cpp: forward; bench_backward.cpp: backward and training step) share: the
// problem (Q, K, V of N(0, 1), d = 64, seed 1) and the machine's yardstick measured in the same run, a GEMM of the
// attention's shape. Ratios taken from one run survive a noisy machine; absolute times do not.
#pragma once

#include "attnlab/analysis/cost.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/reproducible.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace attnlab::bench {

constexpr Index kD = 64;

/// Methods whose cost is quadratic in n at their defaults (they form or sweep all of P); the analysis baselines
/// (the Eckart–Young floor by SVD, classical CUR) are dense and run to n = 4096 only.
inline const std::set<std::string> kQuadratic = {"exact", "svd", "cur"};
inline const std::set<std::string> kDense = {"svd", "cur"};

template <typename T>
struct Problem {
  MatrixR<T> q, k, v;
  explicit Problem(Index n) {
    Rng rng(1);
    q = gaussian_matrix<T>(n, kD, rng);
    k = gaussian_matrix<T>(n, kD, rng);
    v = gaussian_matrix<T>(n, kD, rng);
  }
};

/// The yardstick: S = QKᵀ (n×d by d×n), by the build's own product (Eigen's kernels, or OpenBLAS in an
/// ATTNLAB_USE_BLAS build), one row block per OpenMP thread (the threads split the work as attnlab's kernels do) —
/// the rate this machine and this build reach on the attention's GEMM. One product per thread and call: each product
/// allocates its packing buffers, and with glibc's default allocator many small-block products paid those buffers'
/// page faults on every call (9× at f64 n = 4096), measuring the allocator instead of the GEMM.
template <typename T>
void gemm(benchmark::State& state) {
  const Index n = state.range(0);
  const Problem<T> p(n);
  // Touched before the timed loop: the first call would otherwise pay the page faults of the n × n result (in a VM,
  // most of the time at n ≥ 4096), measuring the kernel's memory mapping instead of the GEMM.
  MatrixR<T> s = MatrixR<T>::Zero(n, n);
  for (auto _ : state) {
#pragma omp parallel
    {
      const Index threads = omp_get_num_threads(), t = omp_get_thread_num();
      const Index r0 = n * t / threads, r1 = n * (t + 1) / threads;
      if (r1 > r0) s.middleRows(r0, r1 - r0).noalias() = p.q.middleRows(r0, r1 - r0) * p.k.transpose();
    }
    benchmark::DoNotOptimize(s.data());
  }
  state.SetComplexityN(n);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * kD * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

/// The lengths a suite runs: 1024 … 65536, quadratic methods up to ATTNLAB_BENCH_MAX_QUADRATIC_N (default 16384),
/// the dense analysis baselines (SVD, CUR) to 4096, and nothing above `cap`.
inline std::vector<std::int64_t> lengths(bool quadratic, bool dense = false, std::int64_t cap = 65536) {
  const char* env = std::getenv("ATTNLAB_BENCH_MAX_QUADRATIC_N");
  const std::int64_t limit = dense ? 4096 : quadratic ? (env ? std::atoll(env) : 16384) : cap;
  std::vector<std::int64_t> out;
  for (std::int64_t n : {1024, 4096, 16384, 65536})
    if (n <= limit && n <= cap) out.push_back(n);
  return out;
}

/// The method `spec` fitted on the problem and run once before the timed loop (its output, then `also(method)` for
/// what else the suite times, e.g. a backward): the first call's allocations and checks stay out of the timings. Null,
/// with the benchmark skipped under the method's own message, when it refuses the problem (a budget over n, more
/// memory than the machine has).
template <typename T, class P, class Also>
std::unique_ptr<Method<T>> warmed_up(benchmark::State& state, const std::string& spec, const P& p, const Also& also) {
  auto m = make_method<T>(spec);
  try {
    m->compute(p.q, p.k);
    benchmark::DoNotOptimize(m->output(p.v).data());
    also(*m);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return nullptr;
  }
  return m;
}

/// A suite's main() (Eigen's blocking is pinned by the library before it: core/reproducible.hpp): the run's context
/// recorded (which build made these timings — its instruction set and what computes its products, read by
/// plot_bench.py — and the allocator configuration they were taken under: tools/bench.sh runs the default build with
/// and without GLIBC_TUNABLES; users run without), the suite's benchmarks registered by `register_all`, then Google
/// Benchmark's own main loop.
template <class Register>
int run_suite(int argc, char** argv, Register register_all) {
  benchmark::AddCustomContext("attnlab_arch", ATTNLAB_BENCH_ARCH);
  benchmark::AddCustomContext("attnlab_products", product_backend());
  benchmark::AddCustomContext("attnlab_cost_context", cost_context());
  benchmark::AddCustomContext("attnlab_cpu", cpu_name());  // the device every figure of the run is quoted for
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  benchmark::AddCustomContext("glibc_tunables", tunables ? tunables : "");
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace attnlab::bench
