// Every registered method at its defaults (compute() + output(), what a user's forward pass costs), registered from
// the method registry, beside the machine's yardstick measured in the same run: a GEMM of the attention's shape
// (n×d by d×n) and exact streaming attention. n ∈ {1024, 4096, 16384, 65536} (quadratic ones up to
// ATTNLAB_BENCH_MAX_QUADRATIC_N, default 16384), d = 64, float32 and float64. Ratios taken from one run survive a
// noisy machine; absolute times do not. Run (tools/bench.sh does): build/bin/attnlab_bench_methods
//   --benchmark_out=results/bench/attnlab.json --benchmark_out_format=json
#include "attnlab/analysis/cost.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/components/kmeans.hpp"
#include "attnlab/components/codebook_attention.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/reproducible.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

namespace {

using attnlab::Index;
using attnlab::MatrixR;

constexpr Index kD = 64;

template <typename T>
struct Problem {
  MatrixR<T> q, k, v;
  explicit Problem(Index n) {
    attnlab::Rng rng(1);
    q = attnlab::gaussian_matrix<T>(n, kD, rng);
    k = attnlab::gaussian_matrix<T>(n, kD, rng);
    v = attnlab::gaussian_matrix<T>(n, kD, rng);
  }
};

/// Methods whose cost is quadratic in n at their defaults (they form or sweep all of P); the analysis baselines
/// (the Eckart–Young floor by SVD, classical CUR) are dense and run to n = 4096 only.
const std::set<std::string> kQuadratic = {"exact", "svd", "cur"};
const std::set<std::string> kDense = {"svd", "cur"};

template <typename T>
void method(benchmark::State& state, const std::string& spec) {
  const Index n = state.range(0);
  const Problem<T> p(n);
  auto m = attnlab::make_method<T>(spec);
  try {
    m->compute(p.q, p.k);
    benchmark::DoNotOptimize(m->output(p.v).data());
  } catch (const attnlab::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  // The timed body is the cost harness's call (attnlab/cost.hpp: run_method_once), so that this suite, the
  // experiments, the report, compare and the module time the same thing; Google Benchmark adds its own warm-up
  // and repetitions around it.
  for (auto _ : state) attnlab::run_method_once<T>(*m, p.q, p.k, p.v, {});
  state.SetComplexityN(n);
  if (spec.rfind("exact", 0) == 0)  // 4n²d: QKᵀ and PV
    state.counters["GFLOP/s"] = benchmark::Counter(4.0 * double(n) * double(n) * kD * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

template <typename T>
void vq_attend(benchmark::State& state) {
  const Index n = state.range(0);
  const Problem<T> p(n);
  attnlab::Rng rng(0);
  const attnlab::KMeansResult<T> km = attnlab::kmeans<T>(p.k, 64, 20, rng);
  for (auto _ : state) {
    const auto op = attnlab::codebook_attention<T>(p.q, p.k, km.centroids, {});
    const MatrixR<T> o = op->apply(p.v);
    benchmark::DoNotOptimize(o.data());
  }
  state.SetComplexityN(n);
}

/// The yardstick: S = QKᵀ (n×d by d×n), by the build's own product (Eigen's kernels, or OpenBLAS in an
/// ATTNLAB_USE_BLAS build), one row block per OpenMP thread (the threads split the work as attnlab's kernels do) —
/// the rate this machine and this build reach on the attention's GEMM. One product per thread and call: each product
/// allocates its packing buffers, and with glibc's default allocator many small-block products paid those buffers'
/// page faults on every call (9× at f64 n = 4096), measuring the allocator instead of the GEMM.
template <typename T>
void gemm(benchmark::State& state) {
  const Index n = state.range(0);
  const Problem<T> p(n);
  MatrixR<T> s(n, n);
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

std::vector<std::int64_t> lengths(bool quadratic, bool dense = false) {
  const char* env = std::getenv("ATTNLAB_BENCH_MAX_QUADRATIC_N");
  const std::int64_t cap = dense ? 4096 : quadratic ? (env ? std::atoll(env) : 16384) : 65536;
  std::vector<std::int64_t> out;
  for (std::int64_t n : {1024, 4096, 16384, 65536})
    if (n <= cap) out.push_back(n);
  return out;
}

template <typename T>
void register_all(const char* dtype) {
  benchmark::RegisterBenchmark((std::string("gemm/") + dtype).c_str(), gemm<T>)
      ->ArgsProduct({lengths(true)})->ArgNames({"n"})->Unit(benchmark::kMillisecond)->UseRealTime()
      ->Complexity(benchmark::oNSquared);
  for (const auto& d : attnlab::registered_methods()) {
    const bool quadratic = kQuadratic.count(d.name) > 0;
    benchmark::RegisterBenchmark((d.name + "/" + dtype).c_str(), method<T>, d.name)
        ->ArgsProduct({lengths(quadratic, kDense.count(d.name) > 0)})->ArgNames({"n"})
        ->Unit(benchmark::kMillisecond)->UseRealTime()->Complexity(quadratic ? benchmark::oNSquared : benchmark::oN);
  }
  // Transformer-VQ's attention apart from its training: the codebook fitted once (k-means, 64 codes) outside the
  // timed call, as a trained model holds it; the call quantizes the keys and attends.
  benchmark::RegisterBenchmark((std::string("vq_attend/") + dtype).c_str(), vq_attend<T>)
      ->ArgsProduct({lengths(false)})->ArgNames({"n"})->Unit(benchmark::kMillisecond)->UseRealTime()
      ->Complexity(benchmark::oN);
}

}  // namespace

int main(int argc, char** argv) {
  attnlab::pin_eigen_blocking();
  // Which build made these timings: its instruction set and what computes its products (plot_bench.py reads them).
  benchmark::AddCustomContext("attnlab_arch", ATTNLAB_BENCH_ARCH);
  benchmark::AddCustomContext("attnlab_products", attnlab::product_backend());
  benchmark::AddCustomContext("attnlab_cost_context", attnlab::cost_context());
  // The allocator configuration the timings were taken under (tools/bench.sh runs the default build with and
  // without it; users run without).
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  benchmark::AddCustomContext("glibc_tunables", tunables ? tunables : "");
  register_all<float>("f32");
  register_all<double>("f64");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
