// The memory guard: sizes parse, quadratic allocations above the limit are refused with a clear message.
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/core/memory.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

struct LimitGuard {
  explicit LimitGuard(std::uint64_t b) { set_memory_limit(b); }
  ~LimitGuard() { set_memory_limit(0); }
};

TEST(Memory, ParsesSizes) {
  EXPECT_EQ(parse_bytes("1000"), 1000u);
  EXPECT_EQ(parse_bytes("512M"), 512ull << 20);
  EXPECT_EQ(parse_bytes("4G"), 4ull << 30);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_bytes("64kb"), 64ull << 10);
  for (const char* bad : {"", "G", "12Q", "-5M", "0", "nan", "1e30T"}) EXPECT_THROW(parse_bytes(bad), Error) << bad;
}

TEST(Memory, SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(matrix_bytes(1ull << 40, 1ull << 40, 8), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(matrix_bytes(1000, 1000, 4), 4000000u);
  EXPECT_GT(available_memory(), 0u);
}

TEST(Memory, RefusesQuadraticAllocationsAboveTheLimit) {
  const MatrixR<float> q = test::randn<float>(600, 8, 1), k = test::randn<float>(600, 8, 2),
                       v = test::randn<float>(600, 8, 3);
  LimitGuard g(1 << 20);  // 1 MiB < 600·600·4 bytes
  try {
    exact_matrix<float>(q, k, {});
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("600×600 float32 attention matrix needs 1.4 MiB"), std::string::npos)
        << e.what();
  }
  const ExactOperator<float> op(q, k, {});
  EXPECT_THROW(materialize(op), Error);
  // The streaming path needs no quadratic memory and goes through under the same limit.
  EXPECT_TRUE(exact_output<float>(q, k, v, {}).allFinite());
  EXPECT_THROW(check_memory(std::numeric_limits<std::uint64_t>::max(), "x"), Error);
}

TEST(Memory, MachineLimitRefusesAbsurdSizes) {
  set_memory_limit(0);
  try {
    check_memory(matrix_bytes(1 << 20, 1 << 20, 8), "the 1048576×1048576 float64 attention matrix");
    ADD_FAILURE() << "8 TiB accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is available"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnlab
