// Seeded randomness: reproducible streams and correct moments.
#include "attnlab/core/random.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

TEST(Random, SameSeedSameStreamOtherSeedOtherStream) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    const auto x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    EXPECT_NE(x, c.next_u64());
  }
}

TEST(Random, NormalMomentsAndUniformRange) {
  Rng r(1);
  const int n = 200000;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = r.normal();
    s += x;
    s2 += x * x;
    s4 += x * x * x * x;
  }
  // Standard errors: mean 1/√n ≈ 0.0022, var √(2/n) ≈ 0.0032, fourth moment √(96/n) ≈ 0.022.
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.015);
  EXPECT_NEAR(s4 / n, 3.0, 0.1);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) {
    const double u = r.uniform();
    ASSERT_TRUE(u >= 0 && u < 1);
    ++counts[r.below(7)];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);  // ±5 standard deviations
}

}  // namespace
}  // namespace attnlab
