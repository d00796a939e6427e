// evaluate(): the one path from (method, reference) to numbers, and its one serializer — against the metrics computed
// directly from the definitions, for a method whose P̃ is known in closed form and for exact attention itself.
#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/operators/exact.hpp"
#include "test_util.hpp"

#include <Eigen/SVD>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace attnlab {
namespace {

using test::randn;

std::vector<std::string> names(const std::vector<std::pair<std::string, double>>& rows) {
  std::vector<std::string> v;
  for (const auto& r : rows) v.push_back(r.first);
  return v;
}

/// The causal mask, at the default scale.
AttentionOptions causal_mask() {
  AttentionOptions o;
  o.causal = true;
  return o;
}

TEST(Evaluate, ErrorsMatchTheDefinitions) {
  const Index n = 96, d = 8;
  const MatrixR<double> q = randn<double>(n, d, 1), k = randn<double>(n, d, 2), v = randn<double>(n, 5, 3);
  const Reference<double> ref(q, k, v);
  auto m = make_method<double>("local:window=5");
  const Evaluation e = evaluate<double>(*m, ref);
  // Independently: the dense matrices and outputs.
  const MatrixR<double> p = exact_matrix<double>(q, k, {});
  const MatrixR<double> pt = m->matrix();
  const MatrixR<double> o = p * v, ot = pt * v;
  EXPECT_NEAR(*e.value("out_rel_fro"), (o - ot).norm() / o.norm(), 1e-12);
  EXPECT_NEAR(*e.value("out_max_abs"), (o - ot).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_NEAR(*e.value("P_rel_fro"), (p - pt).norm() / p.norm(), 1e-12);
  EXPECT_NEAR(*e.value("P_max_abs"), (p - pt).cwiseAbs().maxCoeff(), 1e-12);
  double tv = 0;
  for (Index i = 0; i < n; ++i) tv += 0.5 * (p.row(i) - pt.row(i)).cwiseAbs().sum();
  EXPECT_NEAR(*e.value("P_mean_tv"), tv / double(n), 1e-12);
  // The method's diagnostics come through, and the spec is the canonical one.
  EXPECT_NEAR(*e.value("keys_per_query"), double((pt.array() != 0.0).count()) / double(n), 1e-12);
  EXPECT_EQ(e.spec, m->spec());
  EXPECT_EQ(e.method, "local");
  EXPECT_FALSE(e.value("no_such_metric").has_value());
}

TEST(Evaluate, ExactAgainstItselfIsExactAndTheRowsHaveOneOrder) {
  const MatrixR<float> q = randn<float>(64, 8, 4), k = randn<float>(80, 8, 5), v = randn<float>(80, 3, 6);
  const Reference<float> ref(q, k, v, causal_mask());
  auto exact = make_method<float>("exact");
  EvaluateOptions eo;
  eo.spectral = false;
  const Evaluation e = evaluate<float>(*exact, ref, eo);
  EXPECT_LE(*e.value("out_rel_fro"), 1e-6);
  EXPECT_LE(*e.value("P_rel_fro"), 1e-6);
  EXPECT_FALSE(e.value("P_rel_spectral").has_value());  // not asked for
  // Without a harness cost: the output errors, the evaluated call's time, the P̃ errors.
  const auto rows = evaluation_rows(e);
  const std::vector<std::string> want = {"out_rel_fro", "out_max_abs", "out_mean_cosine", "out_min_cosine",
                                         "time_s",      "P_rel_fro",   "P_max_abs",       "P_mean_kl",
                                         "P_mean_tv"};
  EXPECT_EQ(names(rows), want);
  EXPECT_EQ(rows[4].second, e.seconds);
  EXPECT_TRUE(std::isnan(e.speedup()));
}

TEST(Evaluate, CompareIsEvaluateWithTheHarnessCost) {
  const MatrixR<double> q = randn<double>(64, 8, 7), k = randn<double>(64, 8, 8), v = randn<double>(64, 4, 9);
  std::vector<std::unique_ptr<Method<double>>> methods;
  methods.push_back(make_method<double>("nystrom:landmarks=8"));
  methods.push_back(make_method<double>("performer:features=16,seed=3"));
  CompareOptions co;
  co.spectral = false;
  co.cost.repeats = 2;
  co.cost.warmup = 0;
  std::size_t seen = 0;
  const auto rows = compare_methods<double>(q, k, v, methods, co, [&](const Evaluation&) { ++seen; });
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(seen, 2u);
  const Reference<double> ref(q, k, v);
  EvaluateOptions eo;
  eo.spectral = false;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto again = make_method<double>(methods[i]->spec());
    const Evaluation e = evaluate<double>(*again, ref, eo);
    // The same errors and diagnostics, bit for bit (same spec, same seed, same inputs).
    EXPECT_EQ(rows[i].output_errors, e.output_errors) << e.spec;
    EXPECT_EQ(rows[i].matrix_errors, e.matrix_errors) << e.spec;
    EXPECT_EQ(rows[i].diagnostics, e.diagnostics) << e.spec;
    ASSERT_TRUE(rows[i].cost && rows[i].exact_cost);
    EXPECT_DOUBLE_EQ(rows[i].speedup(), rows[i].exact_cost->min_s / rows[i].cost->min_s);
    // The serializer puts the harness's times after the output errors.
    const auto n = names(evaluation_rows(rows[i]));
    ASSERT_GE(n.size(), 8u);
    EXPECT_EQ(std::vector<std::string>(n.begin() + 4, n.begin() + 8),
              (std::vector<std::string>{"time_s", "time_median_s", "exact_time_s", "speedup"}));
  }
}

TEST(Evaluate, TheReferenceKeepsItsSpectralNormAndTheErrorsAreThoseComputedAlone) {
  // n = 96 > 64: the block Krylov path, not the dense SVD.
  const MatrixR<double> q = randn<double>(96, 8, 11), k = randn<double>(96, 8, 12), v = randn<double>(96, 4, 13);
  const Reference<double> ref(q, k, v);
  const SpectralNormResult& kept = ref.spectral_norm();
  const SpectralNormResult alone = spectral_norm<double>(ref.op());
  // the same solve: the value, its iterations, residual and convergence
  EXPECT_EQ(kept.value, alone.value);
  EXPECT_EQ(kept.iterations, alone.iterations);
  EXPECT_EQ(kept.residual, alone.residual);
  EXPECT_EQ(kept.converged, alone.converged);
  EXPECT_GE(kept.value, 1.0 - 1e-12);  // P·1 = 1: ‖P‖₂ ≥ 1
  for (const char* spec : {"nystrom:landmarks=8", "local:window=9"}) {
    auto m = make_method<double>(spec);
    const Evaluation e = evaluate<double>(*m, ref);  // uses the kept ‖P‖₂
    // matrix_errors on its own (‖P‖₂ computed inside), the same bits
    const MatrixErrors me = matrix_errors<double>(ref.op(), m->op());
    ASSERT_TRUE(e.value("P_rel_spectral").has_value()) << spec;
    EXPECT_EQ(*e.value("P_rel_spectral"), *me.rel_spectral) << spec;
    EXPECT_EQ(e.value("P_spectral_residual").has_value(), me.spectral_residual.has_value()) << spec;
    if (me.spectral_residual) EXPECT_EQ(*e.value("P_spectral_residual"), *me.spectral_residual) << spec;
    // and against the dense matrices
    const MatrixR<double> p = exact_matrix<double>(q, k, {}), pt = m->matrix();
    Eigen::JacobiSVD<Eigen::MatrixXd> sp(p), sd(p - pt);
    EXPECT_NEAR(*e.value("P_rel_spectral"), sd.singularValues()(0) / sp.singularValues()(0), 1e-8) << spec;
  }
}

TEST(Evaluate, RefusesWhatCannotBeEvaluated) {
  const MatrixR<double> q = randn<double>(32, 4, 10), k = randn<double>(32, 4, 11), v = randn<double>(32, 2, 12);
  const Reference<double> ref(q, k, v, causal_mask());
  auto ny = make_method<double>("nystrom:landmarks=4");
  EXPECT_THROW(evaluate<double>(*ny, ref), Error);  // a causal mask Nyström cannot honour
  // An overflowing reference is the inputs' fault, said before any method runs.
  MatrixR<double> big = q;
  big(0, 0) = std::numeric_limits<double>::infinity();
  EXPECT_THROW(Reference<double>(big, k, v), Error);
}

// Under bf16/fp16 (issue "Reduced precision"): the reference stays native, each method runs emulated, its rounding
// error is against its own native run, a failing output is a row with its counts (not an exception, not an error
// of a non-finite output), and nothing is timed.
TEST(Evaluate, CompareUnderReducedStorageReportsFailuresAsRows) {
  const Index n = 256, d = 32;
  // Large positive logits: elu+1 linear attention's fp16 normaliser φ(q)ᵀΣφ(k) overflows (x/inf = 0 rows), as the
  // GPU measured it; careful keeps the normaliser in float32.
  MatrixR<float> q = randn<float>(n, d, 21), k = randn<float>(n, d, 22);
  q.array() = q.array().abs() * 8.0f;
  k.array() = k.array().abs() * 8.0f;
  const MatrixR<float> v = randn<float>(n, 16, 23);
  const std::vector<std::string> specs = {"linear", "exact:impl=materialized"};
  std::vector<std::unique_ptr<Method<float>>> methods;
  for (const auto& s : specs) methods.push_back(make_method<float>(s));
  for (const Policy policy : {Policy::eager, Policy::careful}) {
    CompareOptions co;
    co.attention.storage = Storage::fp16;
    co.attention.policy = policy;
    const auto rows = compare_methods<float>(q, k, v, methods, co);
    ASSERT_EQ(rows.size(), 2u);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Evaluation& r = rows[i];
      EXPECT_EQ(r.storage, Storage::fp16);
      EXPECT_FALSE(r.cost);
      EXPECT_TRUE(r.matrix_errors.empty());
      const auto n_rows = names(evaluation_rows(r));
      EXPECT_EQ(std::count(n_rows.begin(), n_rows.end(), "time_s"), 0) << r.spec;
      EXPECT_EQ(std::count(n_rows.begin(), n_rows.end(), "output_zero_rows"), 1) << r.spec;
      // Independently: the method natively and emulated, through Method itself.
      auto m = make_method<float>(specs[i]);
      AttentionOptions a;
      const MatrixR<float> own = m->compute(q, k, a).output(v);
      a.storage = Storage::fp16;
      a.policy = policy;
      const MatrixR<float> emu = m->compute(q, k, a).output(v);
      const OutputCheck c = m->output_check();
      EXPECT_EQ(*r.value("output_zero_rows"), double(c.zero_rows)) << r.spec;
      EXPECT_EQ(*r.value("output_nonfinite"), double(c.nonfinite)) << r.spec;
      EXPECT_EQ(r.failed(), c.zero_rows + c.nonfinite > 0) << r.spec;
      if (!all_finite(emu)) {  // no error of a non-finite output: its counts say it
        EXPECT_FALSE(r.value("out_rel_fro")) << r.spec;
        EXPECT_FALSE(r.value("round_rel_fro")) << r.spec;
        EXPECT_GT(c.nonfinite, 0u) << r.spec;
        continue;
      }
      ASSERT_TRUE(r.value("out_rel_fro") && r.value("round_rel_fro")) << r.spec;
      const double round = (emu.cast<double>() - own.cast<double>()).norm() / own.cast<double>().norm();
      const MatrixR<float> exact = exact_output<float>(q, k, v, {});
      const double total = (emu.cast<double>() - exact.cast<double>()).norm() / exact.cast<double>().norm();
      EXPECT_NEAR(*r.value("round_rel_fro"), round, 1e-6 * round) << r.spec;
      EXPECT_NEAR(*r.value("out_rel_fro"), total, 1e-6 * total) << r.spec;
    }
    // Eager linear attention returns zero rows without a NaN; careful does not; exact attention never fails.
    EXPECT_EQ(rows[0].failed(), policy == Policy::eager);
    if (policy == Policy::eager) {
      EXPECT_GT(*rows[0].value("output_zero_rows"), 0.0);
      EXPECT_GT(*rows[0].value("overflow[normalisers φ(q)ᵀΣφ(k)]"), 0.0);
    }
    EXPECT_FALSE(rows[1].failed());
    EXPECT_GT(*rows[1].value("round_rel_fro"), 0.0);  // the format did round something
  }
  // Emulation is over float32: double inputs are refused before any work, as is a method the storage lacks.
  std::vector<std::unique_ptr<Method<double>>> m64;
  m64.push_back(make_method<double>("linear"));
  CompareOptions co;
  co.attention.storage = Storage::bf16;
  EXPECT_THROW(compare_methods<double>(q.cast<double>(), k.cast<double>(), v.cast<double>(), m64, co), Error);
}

}  // namespace
}  // namespace attnlab
