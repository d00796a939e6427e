// evaluate(): the one path from (method, reference) to numbers, and its one serializer — against the metrics computed
// directly from the definitions, for a method whose P̃ is known in closed form and for exact attention itself.
#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/operators/exact.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace attnlab
