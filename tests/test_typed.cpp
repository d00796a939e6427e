// The typed classes and options structs (attnlab/methods/*.hpp) against the registry: the same defaults, the same
// spec both ways, the same outputs, the same errors.
#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/methods/all.hpp"
#include "attnlab/random.hpp"
#include "attnlab/registry.hpp"
#include "method_list.hpp"

#include <gtest/gtest.h>

#include <tuple>

namespace attnlab {
namespace {

// Every method of attnlab/methods/all.hpp (the build's list of it, as the registry reads it).
template <typename T>
struct Tail;
template <typename H, typename... R>
struct Tail<std::tuple<H, R...>> {
  using type = std::tuple<R...>;
};
#define ATTNLAB_OPTIONS_OF(Name) , Name##Options
using AllOptions = Tail<std::tuple<void ATTNLAB_METHODS(ATTNLAB_OPTIONS_OF)>>::type;
#undef ATTNLAB_OPTIONS_OF

template <typename F, std::size_t... I>
void each_options(F&& f, std::index_sequence<I...>) {
  (f(std::tuple_element_t<I, AllOptions>{}), ...);
}
template <typename F>
void each_options(F&& f) {
  each_options(f, std::make_index_sequence<std::tuple_size_v<AllOptions>>{});
}

TEST(Typed, EveryRegisteredMethodHasOptionsWithTheRegistrysDefaults) {
  std::vector<std::string> names;
  each_options([&](auto o) {
    names.push_back(decltype(o)::kName);
    // The struct's defaults are the descriptor's: its spec is the canonical spec of the bare name.
    EXPECT_EQ(o.spec(), make_method<double>(decltype(o)::kName)->spec()) << decltype(o)::kName;
  });
  std::vector<std::string> registered;
  for (const auto& d : registered_methods()) registered.push_back(d.name);
  EXPECT_EQ(names, registered) << "a registered method without its options struct (or the order changed)";
}

TEST(Typed, SpecParserFillsTheStructAndTheStructWritesTheSpec) {
  const auto p = make_method<double>("nystrom:landmarks=17,pinv=newton,iters=9,select=random,seed=5")->params();
  const NystromOptions o = NystromOptions::from(p);
  EXPECT_EQ(o.landmarks, 17);
  EXPECT_EQ(o.pinv, "newton");
  EXPECT_EQ(o.iters, 9);
  EXPECT_EQ(o.select, "random");
  EXPECT_EQ(o.seed, 5u);
  EXPECT_EQ(o.spec(), "nystrom:landmarks=17,pinv=newton,iters=9,select=random,seed=5");
  VqOptions v;
  v.temperature = 0.25;
  v.assign = "soft";
  EXPECT_EQ(VqOptions::from(make_method<double>(v.spec())->params()).spec(), v.spec());
  CurOptions c;
  c.rcond = 1e-7;
  EXPECT_DOUBLE_EQ(CurOptions::from(make_method<double>(c.spec())->params()).rcond, 1e-7);
}

TEST(Typed, SameOutputAsTheSpecAndTheSameErrors) {
  Rng rng(3);
  const MatrixR<double> q = gaussian_matrix<double>(96, 8, rng), k = gaussian_matrix<double>(96, 8, rng),
                        v = gaussian_matrix<double>(96, 5, rng);
  NystromOptions no;
  no.landmarks = 12;
  Nystrom<double> nys(no);
  nys.compute(q, k);
  auto ref = make_method<double>("nystrom:landmarks=12");
  ref->compute(q, k);
  EXPECT_EQ(nys.spec(), ref->spec());
  EXPECT_EQ(nys.name(), "nystrom");
  EXPECT_EQ((nys.output(v) - ref->output(v)).norm(), 0.0);
  EXPECT_EQ(nys.rank_bound(), 12);
  EXPECT_EQ(nys.diagnostics(), ref->diagnostics());
  EXPECT_EQ((nys.matrix() - ref->matrix()).norm(), 0.0);
  EXPECT_EQ(nys.options().landmarks, 12);
  EXPECT_FALSE(nys.supports_causal());
  AttentionOptions causal;
  causal.causal = true;
  EXPECT_THROW(nys.compute(q, k, causal), Error);  // refused, as by the spec

  LocalOptions lo;
  lo.window = 4;
  Local<float> local(lo);
  const MatrixR<float> qf = q.cast<float>(), kf = k.cast<float>(), vf = v.cast<float>();
  local.compute(qf, kf, causal);
  auto lref = make_method<float>("local:window=4");
  lref->compute(qf, kf, causal);
  EXPECT_EQ((local.output(vf) - lref->output(vf)).norm(), 0.0f);

  // Exact's typed class against the exact kernel.
  Exact<double> exact;
  exact.compute(q, k);
  EXPECT_LT((exact.output(v) - exact_output<double>(q, k, v, {})).cwiseAbs().maxCoeff(), 1e-14);

  // Out-of-range options are refused with the registry's message.
  NystromOptions bad;
  bad.landmarks = 0;
  try {
    Nystrom<double> n(bad);
    FAIL() << "landmarks = 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("landmarks"), std::string::npos) << e.what();
  }
  PerformerOptions po;
  po.kernel = "cosine";
  EXPECT_THROW(Performer<double>{po}, Error);
}

}  // namespace
}  // namespace attnlab
