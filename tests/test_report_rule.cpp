// The report's recommendation rule (report/report.hpp: recommend()) on made-up candidates, so that each clause is
// checked whatever the machine's timings: the target, the timing noise around the fastest (by either point's noise),
// the order error → simplicity → budget among the equally fast, and beating exact beyond both timings' noise.
// tests/scripts/test_report.py checks the same rule against a real report's CSV.
#include "report.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace attnlab::report {
namespace {

TEST(ReportRule, NothingUnderTheTargetKeepsExact) {
  const std::vector<Candidate> c = {{"local", 8, 0.5, 1e-3, 0.1}, {"vq", 64, 0.31, 2e-3, 0.1}};
  const Recommendation r = recommend(c, 0.3, 1.0, 0.1);
  EXPECT_EQ(r.pick, -1);
  EXPECT_FALSE(r.beats_exact);
}

TEST(ReportRule, ASlowerPointWithinItsOwnNoiseIsEquallyFast) {
  // vq is the fastest under the target; nystrom is 30% slower with a 10% noise (not equally fast); linformer_pool is
  // 40% slower but its own timing spreads 50%: within the noise of the fastest, and the most accurate, so it wins.
  // (Walking the points in time order and stopping at nystrom, as the report once did, picked vq.)
  const std::vector<Candidate> c = {{"vq", 64, 0.20, 1.0e-3, 0.10},
                                    {"nystrom", 32, 0.15, 1.3e-3, 0.10},
                                    {"linformer_pool", 32, 0.10, 1.4e-3, 0.50},
                                    {"local", 8, 0.40, 0.5e-3, 0.10}};  // the fastest of all, but over the target
  const Recommendation r = recommend(c, 0.3, 10e-3, 0.1);
  EXPECT_EQ(r.pick, 2);
  EXPECT_TRUE(r.beats_exact);
}

TEST(ReportRule, TiesGoToTheLowerErrorThenTheSimplerFamilyThenTheSmallerBudget) {
  std::vector<Candidate> c = {{"vq", 16, 0.1, 1.00e-3, 0.2}, {"local", 16, 0.1, 1.05e-3, 0.2}};
  EXPECT_EQ(recommend(c, 0.3, 1.0, 0.1).pick, 1) << "equal error: the simpler family (local before vq)";
  c.push_back({"local", 8, 0.1, 1.10e-3, 0.2});
  EXPECT_EQ(recommend(c, 0.3, 1.0, 0.1).pick, 2) << "equal error and family: the smaller budget";
  c.push_back({"vq", 32, 0.05, 1.15e-3, 0.2});
  EXPECT_EQ(recommend(c, 0.3, 1.0, 0.1).pick, 3) << "a lower error within the noise beats simplicity";
  c.push_back({"linear", 1, 0.01, 1.5e-3, 0.2});
  EXPECT_EQ(recommend(c, 0.3, 1.0, 0.1).pick, 3) << "a point beyond the noise of the fastest is not equally fast";
}

TEST(ReportRule, RecommendedOnlyWhenFasterThanExactBeyondBothNoises) {
  const std::vector<Candidate> c = {{"nystrom", 32, 0.1, 1.0e-3, 0.2}};
  EXPECT_TRUE(recommend(c, 0.3, 1.21e-3, 0.1).beats_exact);   // 1.0 · 1.2 < 1.21
  EXPECT_FALSE(recommend(c, 0.3, 1.19e-3, 0.1).beats_exact);  // within the candidate's own 20%
  EXPECT_FALSE(recommend(c, 0.3, 1.21e-3, 0.3).beats_exact);  // within exact's 30%
  EXPECT_EQ(recommend(c, 0.3, 1.19e-3, 0.1).pick, 0) << "kept exact, but the fit is still reported";
}

TEST(ReportRule, CandidatesWithoutATimingAreNotCandidates) {
  const std::vector<Candidate> c = {{"local", 8, 0.01, NAN, 0.1}, {"vq", 64, 0.2, 2e-3, 0.1}};
  EXPECT_EQ(recommend(c, 0.3, 1.0, 0.1).pick, 1);
}

}  // namespace
}  // namespace attnlab::report
