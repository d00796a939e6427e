// Every registered method's backward pass at its defaults, beside the machine's GEMM yardstick in the same run
// (issue "Training through an approximation"):
//   backward/NAME/DTYPE/n:N   Method::backward(V, dO) after compute() and output() — what autograd's backward
//                             calls (the forward's choices, O and ℓ are kept by the method);
//   step/NAME/DTYPE/n:N       compute() + output() + backward(): the attention's share of one training step;
//   gemm/DTYPE/n:N            S = QKᵀ (n×d by d×n): the rate this build reaches on the attention's GEMM.
// Exact attention's backward reports GFLOP/s counting 10·n²·d flops (FlashAttention-2's count: S = QKᵀ again, dV =
// PᵀdO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀQ), to be set against the GEMM's rate. n ∈ {1024, 4096, 16384} (the dense
// analysis baselines to 4096), d = 64, float32 and float64; dO of N(0, 1). Run (tools/bench.sh does):
//   build/bin/attnlab_bench_backward --benchmark_out=results/bench/backward.json --benchmark_out_format=json
#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/reproducible.hpp"
#include "attnlab/analysis/cost.hpp"
#include "yardstick.hpp"

#include <benchmark/benchmark.h>

#include <string>

namespace {

using attnlab::Index;
using attnlab::MatrixR;
using attnlab::bench::kD;
using attnlab::bench::Problem;

constexpr std::int64_t kMaxN = 16384;  // the comparison length; the backward of exact is 10·n²·d

template <typename T>
struct BackwardProblem : Problem<T> {
  MatrixR<T> d_out;
  explicit BackwardProblem(Index n) : Problem<T>(n) {
    attnlab::Rng rng(2);
    d_out = attnlab::gaussian_matrix<T>(n, kD, rng);
  }
};

/// `step`: false times the backward alone (compute and output once, outside the timed loop), true the whole step.
template <typename T>
void backward(benchmark::State& state, const std::string& spec, bool step) {
  const Index n = state.range(0);
  const BackwardProblem<T> p(n);
  const auto m = attnlab::bench::warmed_up<T>(state, spec, p, [&](const attnlab::Method<T>& w) {
    benchmark::DoNotOptimize(w.backward(p.v, p.d_out).dq.data());
  });
  if (!m) return;
  for (auto _ : state) {
    if (step) {
      m->compute(p.q, p.k);
      benchmark::DoNotOptimize(m->output(p.v).data());
    }
    const attnlab::Gradients<T> g = m->backward(p.v, p.d_out);
    benchmark::DoNotOptimize(g.dk.data());
  }
  state.SetComplexityN(n);
  if (spec == "exact")  // 10n²d for the backward, 4n²d more for the step's forward
    state.counters["GFLOP/s"] = benchmark::Counter((step ? 14.0 : 10.0) * double(n) * double(n) * kD * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

template <typename T>
void register_all(const char* dtype) {
  using attnlab::bench::lengths;
  benchmark::RegisterBenchmark((std::string("gemm/") + dtype).c_str(), attnlab::bench::gemm<T>)
      ->ArgsProduct({lengths(true, false, kMaxN)})->ArgNames({"n"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (const auto& d : attnlab::registered_methods()) {
    if (!d.backward) continue;  // refused (svd): nothing to time
    const bool quadratic = attnlab::bench::kQuadratic.count(d.name) > 0;
    const auto ns = lengths(quadratic, attnlab::bench::kDense.count(d.name) > 0, kMaxN);
    for (const bool step : {false, true})
      benchmark::RegisterBenchmark(((step ? "step/" : "backward/") + d.name + "/" + dtype).c_str(), backward<T>,
                                   d.name, step)
          ->ArgsProduct({ns})->ArgNames({"n"})->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  return attnlab::bench::run_suite(argc, argv, [] {
    register_all<float>("f32");
    register_all<double>("f64");
  });
}
