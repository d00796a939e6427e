// Error and spectrum analysis with the operator API, never forming an n×n matrix: the exact attention matrix P and a
// method's P̃ as operators, their difference as an operator, its spectral norm and top singular values by block
// Krylov, and the matrix error metrics computed block of rows by block of rows.
//   build/bin/example_analyse_operator [n]        (a generated clustered problem, d = 64)
#include <attnlab/core/error.hpp>
#include <attnlab/operators/exact.hpp>
#include <attnlab/analysis/metrics.hpp>
#include <attnlab/operators/difference.hpp>
#include <attnlab/core/registry.hpp>
#include <attnlab/io/sources.hpp>
#include <attnlab/components/spectrum.hpp>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  try {
    const attnlab::Index n = argc > 1 ? std::atol(argv[1]) : 4096;
    attnlab::SourceOptions source;
    source.kind = "clustered";
    const auto p = attnlab::generate_problem<double>(source, n, n, 64, 64, /*seed=*/0);

    const attnlab::ExactOperator<double> exact(p.q, p.k, {});  // P: keeps Q, K and the row log-sum-exp
    auto method = attnlab::make_method<double>("nystrom:landmarks=64");
    method->compute(p.q, p.k);
    const attnlab::AttentionOperator<double>& approx = method->op();  // P̃, factored
    const attnlab::DifferenceOperator<double> diff(exact, approx);    // P − P̃

    const attnlab::TopSingular top = attnlab::top_singular<double>(exact, 8);
    const attnlab::TopSingular err = attnlab::top_singular<double>(diff, 1);
    const attnlab::MatrixErrors m = attnlab::matrix_errors<double>(exact, approx);
    std::printf("n = %ld: top singular values of P:", long(n));
    for (int i = 0; i < top.values.size(); ++i) std::printf(" %.4g", top.values(i));
    std::printf("\n‖P − P̃‖₂ = %.4g (residual %.1e), relative %.4g; ‖P − P̃‖_F/‖P‖_F = %.4g\n", err.values(0),
                err.residuals(0), err.values(0) / top.values(0), m.rel_fro);
    return 0;
  } catch (const attnlab::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
