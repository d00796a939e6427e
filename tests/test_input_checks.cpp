// Checks made before any work, from the parameters and the problem's size alone: a budget beyond the sequence is
// refused — by compute() and, earlier, by check_method_fits() — with the parameter, its value and n in the message;
// budgets that saturate (a window, a chunk, ProbSparse's factor) and random features are accepted; and the memory a
// method will need is estimated (exact:impl=materialized's P, svd's dense path) and refused by the memory guard.
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/exact.hpp"
#include "test_util.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

// An argument that counts how often it is formatted (as 7).
struct CountedArg {
  int* formatted;
};
template <>
struct fmt::formatter<CountedArg> : fmt::formatter<int> {
  auto format(const CountedArg& c, fmt::format_context& ctx) const {
    ++*c.formatted;
    return fmt::formatter<int>::format(7, ctx);
  }
};

namespace attnlab {
namespace {

using test::randn;

using test::error_of;

ProblemSize size(Index n_q, Index n_k, Index d = 16, Index d_v = 8) { return {n_q, n_k, d, d_v, 8}; }

// The user's report: linformer:k=1000 on n = 256 ran while Nyström refused landmarks > n.
TEST(InputChecks, BudgetsBeyondTheSequenceAreRefusedNamingParameterValueAndN) {
  const MatrixR<double> q = randn<double>(256, 16, 1), k = randn<double>(256, 16, 2);
  const struct {
    const char* spec;
    const char* words;
  } cases[] = {{"linformer:k=1000", "linformer: k = 1000 exceeds the sequence (n_k = 256)"},
               {"linformer:k=257,projection=pool", "k = 257"},
               {"linformer:k=300,projection=uniform", "k = 300"},
               {"nystrom:landmarks=300", "landmarks = 300"},
               {"svd:rank=257", "rank = 257"},
               {"cur:columns=400", "columns = 400"},
               {"vq:codes=512", "codes = 512"}};
  for (const auto& c : cases) {
    auto m = make_method<double>(c.spec);
    const std::string at_compute = error_of([&] { m->compute(q, k); });
    EXPECT_NE(at_compute.find(c.words), std::string::npos) << c.spec << ": " << at_compute;
    EXPECT_NE(at_compute.find("256"), std::string::npos) << c.spec << " names n: " << at_compute;
    // The same refusal before any work, from the sizes alone.
    const std::string before = error_of([&] { check_method_fits(*m, size(256, 256)); });
    EXPECT_NE(before.find(c.words), std::string::npos) << c.spec << ": " << before;
    EXPECT_EQ(at_compute, before) << c.spec << ": one message per limit";
  }
  // At the sequence's length the budget is accepted (Linformer's identity projection is exact attention there).
  for (const char* spec : {"linformer:k=256", "linformer:k=256,projection=pool", "nystrom:landmarks=256,pinv=svd"}) {
    auto m = make_method<double>(spec);
    EXPECT_NO_THROW(check_method_fits(*m, size(256, 256))) << spec;
    EXPECT_NO_THROW(m->compute(q, k)) << spec;
  }
  // n_q < n_k: Nyström's landmarks are bounded by the shorter side, Linformer's k by the keys.
  auto nys = make_method<double>("nystrom:landmarks=100");
  EXPECT_NE(error_of([&] { check_method_fits(*nys, size(64, 256)); }).find("min(n_q, n_k) = 64"), std::string::npos);
  auto lin = make_method<double>("linformer:k=100");
  EXPECT_NO_THROW(check_method_fits(*lin, size(64, 256)));
  EXPECT_NE(error_of([&] { check_method_fits(*lin, size(256, 64)); }).find("n_k = 64"), std::string::npos);
  // VQ with both sides quantized needs codes ≤ n_q as well.
  auto vq = make_method<double>("vq:codes=100,quantize=both");
  EXPECT_NE(error_of([&] { check_method_fits(*vq, size(64, 256)); }).find("n_q, the queries = 64"),
            std::string::npos);
}

// Every limit declared with a parameter (ParamSpec::limits: within_keys, within_queries, within_min_n, under its
// `when` values) refuses one past its bound with one message, the same before any work and from compute().
TEST(InputChecks, EveryDeclaredLimitHasOneMessageBeforeAnyWorkAndAtCompute) {
  int limits = 0;
  for (const MethodDescriptor& d : registered_methods())
    for (const ParamSpec& p : d.params)
      for (const SizeLimit& l : p.limits) {
        // The bound 48 on the limited side, 64 on the other.
        const bool keys = l.bound == SizeLimit::Bound::Keys;
        const Index n_q = keys ? 64 : 48, n_k = keys ? 48 : 64;
        std::string spec = fmt::format("{}:{}=49", d.name, p.name);
        for (const auto& [key, value] : l.when) spec += "," + key + "=" + value;
        auto m = make_method<double>(spec);
        const MatrixR<double> q = randn<double>(n_q, 16, 1), k = randn<double>(n_k, 16, 2);
        const std::string before = error_of([&] { check_method_fits(*m, size(n_q, n_k)); });
        const std::string at_compute = error_of([&] { m->compute(q, k); });
        EXPECT_EQ(before, fmt::format("{}: {} = 49 exceeds the sequence ({} = 48); give {} ≤ 48", d.name, p.name,
                                      l.what, p.name))
            << spec;
        EXPECT_EQ(at_compute, before) << spec;
        ++limits;
      }
  EXPECT_GE(limits, 6) << "linformer's k, nystrom's landmarks, svd's rank, cur's columns, vq's codes (keys, queries)";
}

// require(cond, format, args...) and check_memory(bytes, format, args...) format only when they throw (faiss's
// FAISS_THROW_IF_NOT_FMT), and then the message fmt::format would have written; require(cond, "text") is the plain one.
TEST(InputChecks, FormattingChecksFormatOnlyOnFailure) {
  int formatted = 0;
  const CountedArg arg{&formatted};
  EXPECT_NO_THROW(require(true, "k = {} exceeds n = {}", arg, 3));
  EXPECT_EQ(formatted, 0);
  EXPECT_EQ(error_of([&] { require(false, "k = {} exceeds n = {}", arg, 3); }), "k = 7 exceeds n = 3");
  EXPECT_EQ(formatted, 1);
  EXPECT_EQ(error_of([&] { require(false, "no {} here"); }), "no {} here");
  EXPECT_EQ(error_of([&] { require(false, std::string("a {} string")); }), "a {} string");

  set_memory_limit(std::uint64_t(1) << 30);
  EXPECT_NO_THROW(check_memory(1024, "reading {}", arg));
  EXPECT_EQ(formatted, 1);
  const std::string msg = error_of([&] { check_memory(std::uint64_t(1) << 31, "reading {}", arg); });
  set_memory_limit(0);
  EXPECT_EQ(msg, "reading 7 needs 2.0 GiB, more than the memory limit of 1.0 GiB (--max-memory)");
  EXPECT_EQ(formatted, 2);
}

// Budgets that bound a neighbourhood or a share saturate at the whole sequence (exact attention: the module's tests
// use them as the exact limit), and random features may outnumber the positions: neither is refused.
TEST(InputChecks, SaturatingBudgetsAndRandomFeaturesAreAccepted) {
  const MatrixR<double> q = randn<double>(64, 8, 3), k = randn<double>(64, 8, 4), v = randn<double>(64, 4, 5);
  for (const char* spec : {"local:window=1000", "sparse:window=1000", "scatterbrain:window=1000",
                           "reformer:chunk=1000", "probsparse:factor=1000", "performer:features=512"}) {
    auto m = make_method<double>(spec);
    EXPECT_NO_THROW(check_method_fits(*m, size(64, 64, 8, 4))) << spec;
    EXPECT_NO_THROW({
      m->compute(q, k);
      m->output(v);
    }) << spec;
  }
}

// The memory a method needs, known before any work: exact:impl=materialized holds P (n_q·n_k values); the streaming
// path does not; svd's dense path holds P in T, in float64 and the SVD's copy.
TEST(InputChecks, MemoryIsEstimatedAndRefusedBeforeAnyWork) {
  const ProblemSize s{100000, 100000, 8, 8, 8};
  EXPECT_EQ(make_method<double>("exact:impl=materialized")->memory_estimate(s), 100000ull * 100000 * 8);
  EXPECT_EQ(make_method<double>("exact")->memory_estimate(s), 0u);
  const ProblemSize f32{100000, 100000, 8, 8, 4};
  EXPECT_EQ(make_method<float>("exact:impl=materialized")->memory_estimate(f32), 100000ull * 100000 * 4);
  // The typed method answers what the spec's does: the options struct declares it once.
  ExactOptions materialized_options;
  materialized_options.impl = ExactImpl::Materialized;
  EXPECT_EQ(ExactMethod<double>(materialized_options).memory_estimate(s), 100000ull * 100000 * 8);
  // svd: dense up to dense_limit (n_k ≤ 512 by default) or when asked; matrix-free (linear) above.
  const auto svd = make_method<double>("svd:rank=8");
  EXPECT_GE(svd->memory_estimate({512, 512, 8, 8, 8}), 512ull * 512 * 24);
  EXPECT_LT(svd->memory_estimate({4096, 4096, 8, 8, 8}), 4096ull * 4096);
  EXPECT_GE(make_method<double>("svd:rank=8,solver=dense")->memory_estimate({4096, 4096, 8, 8, 8}),
            4096ull * 4096 * 24);

  // The guard refuses the 74.5 GiB matrix from the sizes alone (under a limit, so that it holds on any machine).
  set_memory_limit(std::uint64_t(1) << 30);
  auto materialized = make_method<double>("exact:impl=materialized");
  const std::string msg = error_of([&] { check_method_fits(*materialized, size(100000, 100000, 8, 8)); });
  EXPECT_NE(msg.find("exact:impl=materialized"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n_q = 100000, n_k = 100000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 74.5 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--max-memory"), std::string::npos) << msg;
  auto streaming = make_method<double>("exact");
  EXPECT_NO_THROW(check_method_fits(*streaming, size(100000, 100000, 8, 8)));
  set_memory_limit(0);
  // Without a limit: the machine's available memory; 8 TiB fits nowhere.
  const std::string avail = error_of([&] { check_method_fits(*materialized, size(1 << 20, 1 << 20, 8, 8)); });
  EXPECT_NE(avail.find("needs 8.0 TiB"), std::string::npos) << avail;
}

}  // namespace
}  // namespace attnlab
