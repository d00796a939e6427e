// One method on your own arrays: reads Q, K, V (.npy, (n, d) float32 or float64; the first head of (h, n, d)),
// runs the method named by a spec string, writes the output, and prints how far it is from exact attention.
//   build/bin/example_apply_npy Q.npy K.npy V.npy nystrom:landmarks=32 O.npy
#include <attnlab/core/error.hpp>
#include <attnlab/operators/exact.hpp>
#include <attnlab/analysis/metrics.hpp>
#include <attnlab/io/npy.hpp>
#include <attnlab/core/registry.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s Q.npy K.npy V.npy SPEC OUT.npy\n", argv[0]);
    return 2;
  }
  try {
    using attnlab::MatrixR;
    const auto q = attnlab::NpyArray::read(argv[1]).head_as<double>(0);
    const auto k = attnlab::NpyArray::read(argv[2]).head_as<double>(0);
    const auto v = attnlab::NpyArray::read(argv[3]).head_as<double>(0);
    auto method = attnlab::make_method<double>(argv[4]);  // refuses unknown names and parameters
    method->compute(q, k);                                // non-causal, scale 1/√d
    const MatrixR<double> out = method->output(v);
    attnlab::write_npy<double>(argv[5], out);
    const MatrixR<double> exact = attnlab::exact_output<double>(q, k, v, {});
    const auto err = attnlab::output_errors<double>(exact, out);
    std::printf("%s: ‖O − Õ‖_F/‖O‖_F = %.3e, mean cosine %.6f; wrote %s\n", method->spec().c_str(), err.rel_fro,
                err.mean_cosine, argv[5]);
    return 0;
  } catch (const attnlab::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
