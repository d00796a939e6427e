// The cost harness (attnlab/cost.hpp): what it runs, what it records, and that the methods it times reuse their
// buffers in steady state instead of mapping fresh ones on every call. No timing is asserted (timings are noise);
// call counts, refusals, memory and page-fault counts are.
#include "attnlab/analysis/cost.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/registry.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace attnlab {
namespace {

TEST(Cost, RunsTheMemoryCallTheWarmUpAndTheRepeats) {
  int calls = 0, fresh = 0;
  CostOptions o;
  o.warmup = 2;
  o.repeats = 5;
  const Cost c = measure([&] { ++calls; }, o, [&] { ++fresh; });
  EXPECT_EQ(fresh, 1);            // memory: one separate call
  EXPECT_EQ(calls, 2 + 5);        // warm-up + timed
  EXPECT_EQ(c.repeats, 5);
  EXPECT_FALSE(c.refused);
  EXPECT_LE(c.min_s, c.median_s);
  EXPECT_LE(c.median_s, c.max_s);
  EXPECT_GE(c.spread(), 0.0);

  calls = 0;
  o.memory = false;
  o.warmup = 0;
  o.repeats = 1;
  measure([&] { ++calls; }, o);
  EXPECT_EQ(calls, 1);
}

TEST(Cost, ARefusedCallIsRecordedWithItsReason) {
  const Cost c = measure([] { throw Error("needs 74.5 GiB"); });
  EXPECT_TRUE(c.refused);
  EXPECT_NE(c.reason.find("74.5 GiB"), std::string::npos);
  EXPECT_EQ(c.repeats, 0);
  const Cost bad = measure_method<float>("no_such_method", MatrixR<float>(4, 2), MatrixR<float>(4, 2),
                                         MatrixR<float>(4, 2), 0);
  EXPECT_TRUE(bad.refused);
}

TEST(Cost, RefusesBadOptions) {
  CostOptions o;
  o.repeats = 0;
  EXPECT_THROW(measure([] {}, o), Error);
  o.repeats = 1;
  o.warmup = -1;
  EXPECT_THROW(measure([] {}, o), Error);
}

TEST(Cost, MemoryIsWhatTheSeparateCallTouches) {
  // A call that allocates and touches 64 MiB: the peak rises by (nearly) that much; the timed calls allocate nothing.
  const std::size_t bytes = std::size_t(64) << 20;
  CostOptions o;
  o.repeats = 2;
  const Cost c = measure([] {}, o, [&] {
    std::vector<char> buf(bytes);
    std::memset(buf.data(), 1, buf.size());
    volatile char sink = buf[bytes / 2];
    (void)sink;
  });
  EXPECT_GE(c.peak_bytes, bytes / 2);
  EXPECT_LE(c.peak_bytes, bytes * 2);
}

// In steady state — the same method run again and again on the same shapes, as a layer runs — a method keeps its
// working buffers: no page faults beyond its output. With glibc's default allocator (as users run it), a method that
// allocated its large buffers per call paid them back as page faults on every call once the arenas trimmed them:
// measured before the buffers were kept, at n = 4096 in this order (exact first, as the benchmark runs): exact 624
// faults per call, Performer 4224 (10x its arithmetic). Each ctest case runs in its own process, so the allocator's
// history here is this test's. (Under a fixed 128 KiB mmap threshold even Eigen's own GEMM blocking buffers fault:
// that configuration measures the allocator, not attnlab.)
TEST(Cost, ExactAndKernelMethodsFaultNoFreshBuffersInSteadyState) {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's allocator quarantines freed blocks and maps fresh ones: the faults would be its, not ours.
  GTEST_SKIP() << "page faults under AddressSanitizer measure its allocator (tools/test.sh --sanitize)";
#endif
  const Index n = 4096, d = 64, dv = 4;  // a narrow V: the output (the one allocation a call must make) is 64 KiB
  Rng rng(1);
  const MatrixR<float> q = gaussian_matrix<float>(n, d, rng), k = gaussian_matrix<float>(n, d, rng),
                       v = gaussian_matrix<float>(n, dv, rng);
  CostOptions o;
  o.repeats = 4;
  o.memory = false;
  for (const char* spec : {"exact", "performer", "linear", "taylor"}) {
    const Cost c = measure_method<float>(spec, q, k, v, 0, {}, o);
    ASSERT_FALSE(c.refused) << spec << ": " << c.reason;
    // One 2048 × 256 float feature block is 512 pages; 64 pages leave room for small allocations only.
    EXPECT_LT(c.faults_per_call, 64) << spec << " maps fresh buffers on every call";
  }
}

TEST(Cost, SpeedupIsExactOverMethod) { EXPECT_DOUBLE_EQ(speedup(2.0, 0.5), 4.0); }

TEST(Cost, ContextNamesThreadsProductsAndIsa) {
  const std::string c = cost_context();
  EXPECT_NE(c.find("threads="), std::string::npos);
  EXPECT_NE(c.find("products="), std::string::npos);
  EXPECT_NE(c.find("isa="), std::string::npos);
}

}  // namespace
}  // namespace attnlab
