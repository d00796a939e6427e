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
#include "yardstick.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>

namespace {

using attnlab::Index;
using attnlab::MatrixR;
using attnlab::bench::gemm;
using attnlab::bench::kDense;
using attnlab::bench::kQuadratic;
using attnlab::bench::kD;
using attnlab::bench::lengths;
using attnlab::bench::Problem;

template <typename T>
void method(benchmark::State& state, const std::string& spec) {
  const Index n = state.range(0);
  const Problem<T> p(n);
  const auto m = attnlab::bench::warmed_up<T>(state, spec, p, [](const attnlab::Method<T>&) {});
  if (!m) return;
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
  return attnlab::bench::run_suite(argc, argv, [] {
    register_all<float>("f32");
    register_all<double>("f64");
  });
}
