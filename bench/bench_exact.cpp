// Exact attention against a GEMM of the same size (scale·QKᵀ, n×d by d×n), measured in one run so that
// the ratios survive a noisy machine. Run: build/bin/attnlab_bench --benchmark_out=bench.json
#include "attnlab/operators/exact.hpp"
#include "attnlab/core/random.hpp"

#include <benchmark/benchmark.h>

namespace {

using attnlab::Index;
using attnlab::MatrixR;

/// A benchmark's problem: n and d its arguments (sizes()), Q, K, V (n × d) drawn from N(0, 1) with seed 1.
template <typename T>
struct Problem {
  Index n, d;
  MatrixR<T> q, k, v;
  explicit Problem(const benchmark::State& state) : n(state.range(0)), d(state.range(1)) {
    attnlab::Rng rng(1);
    q = attnlab::gaussian_matrix<T>(n, d, rng);
    k = attnlab::gaussian_matrix<T>(n, d, rng);
    v = attnlab::gaussian_matrix<T>(n, d, rng);
  }
  /// The operations of `products` n × d by d × n products (QKᵀ, PV): 2n²d each.
  double flops(int products) const { return 2.0 * products * n * n * d; }
};

void set_counters(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetComplexityN(state.range(0));
}

template <typename T>
void BM_Gemm(benchmark::State& state) {
  const Problem<T> p(state);
  MatrixR<T> s(p.n, p.n);
  for (auto _ : state) {
    s.noalias() = p.q * p.k.transpose();
    benchmark::DoNotOptimize(s.data());
  }
  set_counters(state, p.flops(1));
}

template <typename T>
void BM_ExactStreaming(benchmark::State& state) {
  const Problem<T> p(state);
  for (auto _ : state) benchmark::DoNotOptimize(attnlab::exact_output<T>(p.q, p.k, p.v, {}).data());
  set_counters(state, p.flops(2));  // QKᵀ and PV
}

template <typename T>
void BM_ExactMaterialized(benchmark::State& state) {
  const Problem<T> p(state);
  for (auto _ : state) {
    const MatrixR<T> o = attnlab::exact_matrix<T>(p.q, p.k, {}) * p.v;
    benchmark::DoNotOptimize(o.data());
  }
  set_counters(state, p.flops(2));
}

template <typename T>
void BM_ExactOperatorApply(benchmark::State& state) {
  const Problem<T> p(state);
  attnlab::ExactOperator<T> op(p.q, p.k, {});
  op.row_lse();
  const MatrixR<T> x = p.v.leftCols(1);
  for (auto _ : state) benchmark::DoNotOptimize(op.apply(x).data());
  set_counters(state, p.flops(1));
}

void sizes(benchmark::internal::Benchmark* b) {
  b->ArgsProduct({{512, 1024, 2048, 4096}, {64}})->ArgNames({"n", "d"})->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Gemm<float>)->Apply(sizes)->Complexity(benchmark::oNSquared);
BENCHMARK(BM_ExactStreaming<float>)->Apply(sizes)->Complexity(benchmark::oNSquared);
BENCHMARK(BM_ExactMaterialized<float>)->Apply(sizes)->Complexity(benchmark::oNSquared);
BENCHMARK(BM_ExactOperatorApply<float>)->Apply(sizes)->Complexity(benchmark::oNSquared);
BENCHMARK(BM_Gemm<double>)->Apply(sizes)->Complexity(benchmark::oNSquared);
BENCHMARK(BM_ExactStreaming<double>)->Apply(sizes)->Complexity(benchmark::oNSquared);
BENCHMARK(BM_ExactMaterialized<double>)->Apply(sizes)->Complexity(benchmark::oNSquared);

}  // namespace

BENCHMARK_MAIN();
