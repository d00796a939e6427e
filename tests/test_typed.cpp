// The typed classes and options structs (attnlab/methods/*.hpp) against the registry: the same defaults, the same
// spec both ways, the same outputs, the same errors.
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/methods/all.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/registry.hpp"

#include <gtest/gtest.h>

#include <string>
#include <tuple>

namespace attnlab {
namespace {

// Every registered method's options struct (attnlab/methods/all.hpp: the registry's own list).
using AllOptions = RegisteredMethodOptions;

template <typename F>
void each_options(F&& f) {
  std::apply([&](auto... o) { (f(o), ...); }, AllOptions{});
}

/// Building the typed method M from `options`, whose `param` the caller set out of range, is refused with the
/// registry's message, which names the parameter.
template <typename M, typename O>
void expect_refused(const O& options, const std::string& param) {
  try {
    M m(options);
    FAIL() << "out-of-range " << param << " accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(param), std::string::npos) << e.what();
  }
}

TEST(Typed, EveryOptionsStructIsItsMethodsOneDeclaration) {
  std::size_t count = 0;
  each_options([&](auto o) {
    using O = decltype(o);
    ++count;
    const MethodDescriptor& d = O::descriptor();
    EXPECT_EQ(d.name, O::kName);
    // The registry's parameter list is the struct's declaration: names, defaults (the initializers), ranges, help.
    const auto specs = O::parameter_specs();
    ASSERT_EQ(specs.size(), d.params.size()) << O::kName;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(specs[i].name, d.params[i].name) << O::kName;
      EXPECT_EQ(specs[i].default_value, d.params[i].default_value) << O::kName << "." << specs[i].name;
      EXPECT_EQ(specs[i].describe_type(), d.params[i].describe_type()) << O::kName << "." << specs[i].name;
      EXPECT_FALSE(specs[i].help.empty()) << O::kName << "." << specs[i].name;
    }
    // The struct's defaults written as a spec are the canonical spec of the bare name, and read back unchanged.
    EXPECT_EQ(o.spec(), make_method<double>(O::kName)->spec()) << O::kName;
    EXPECT_EQ(O::from(o.params()).spec(), o.spec()) << O::kName;
    // Every choice of every choice parameter survives the round trip spec → struct → spec, and builds the method.
    for (const ParamSpec& p : specs)
      for (const std::string& c : p.choices) {
        const std::string spec = std::string(O::kName) + ":" + p.name + "=" + c;
        const auto m = make_method<double>(spec);
        const O read = O::from(m->params());
        EXPECT_EQ(read.spec(), m->spec()) << spec;
        EXPECT_NE(m->spec().find(p.name + "=" + c), std::string::npos) << spec;
      }
  });
  EXPECT_EQ(count, registered_methods().size());
}

TEST(Typed, SpecParserFillsTheStructAndTheStructWritesTheSpec) {
  const auto p = make_method<double>("nystrom:landmarks=17,pinv=newton,iters=9,select=random,seed=5")->params();
  const NystromOptions o = NystromOptions::from(p);
  EXPECT_EQ(o.landmarks, 17);
  EXPECT_EQ(o.pinv, PinvMethod::NewtonSchulz);
  EXPECT_EQ(o.iters, 9);
  EXPECT_EQ(o.select, LandmarkSelect::Random);
  EXPECT_EQ(o.seed, 5u);
  EXPECT_EQ(o.spec(), "nystrom:landmarks=17,pinv=newton,iters=9,select=random,seed=5");
  VqOptions v;
  v.temperature = 0.25;
  v.assign = VqAssign::Soft;
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
  NystromMethod<double> nys(no);
  nys.compute(q, k);
  auto ref = make_method<double>("nystrom:landmarks=12");
  ref->compute(q, k);
  EXPECT_EQ(nys.spec(), ref->spec());
  EXPECT_EQ(nys.name(), "nystrom");
  EXPECT_EQ((nys.output(v) - ref->output(v)).norm(), 0.0);
  EXPECT_EQ(nys.rank_bound(), 12);
  EXPECT_EQ(nys.diagnostics(), ref->diagnostics());
  EXPECT_EQ((nys.matrix() - ref->matrix()).norm(), 0.0);
  EXPECT_EQ(nys.settings().landmarks, 12);
  EXPECT_FALSE(nys.supports_causal());
  AttentionOptions causal;
  causal.causal = true;
  EXPECT_THROW(nys.compute(q, k, causal), Error);  // refused, as by the spec

  LocalOptions lo;
  lo.window = 4;
  LocalMethod<float> local(lo);
  const MatrixR<float> qf = q.cast<float>(), kf = k.cast<float>(), vf = v.cast<float>();
  local.compute(qf, kf, causal);
  auto lref = make_method<float>("local:window=4");
  lref->compute(qf, kf, causal);
  EXPECT_EQ((local.output(vf) - lref->output(vf)).norm(), 0.0f);

  // Exact's typed class against the exact kernel.
  ExactMethod<double> exact;
  exact.compute(q, k);
  EXPECT_LT((exact.output(v) - exact_output<double>(q, k, v, {})).cwiseAbs().maxCoeff(), 1e-14);

  // Out-of-range options are refused with the registry's message.
  NystromOptions bad;
  bad.landmarks = 0;
  expect_refused<NystromMethod<double>>(bad, "landmarks");
  PerformerOptions po;
  po.features = 0;
  expect_refused<PerformerMethod<double>>(po, "features");
}

}  // namespace
}  // namespace attnlab

namespace attnlab {
namespace {

TEST(Typed, TheStructIsCheckedAsTheSpecIs) {
  // The same message whichever way a value arrives.
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  NystromOptions o;
  o.landmarks = 0;
  EXPECT_EQ(message([&] { NystromMethod<double> m(o); }), message([] { make_method<double>("nystrom:landmarks=0"); }));
  o = {};
  o.pinv = static_cast<PinvMethod>(99);  // not an enumerator the declaration names
  EXPECT_NE(message([&] { NystromMethod<double> m(o); }).find("pinv"), std::string::npos);
  o = {};
  o.seed = std::uint64_t(1) << 63;  // beyond the seed's declared range (the spec's integers are signed 64-bit)
  EXPECT_NE(message([&] { NystromMethod<double> m(o); }).find("seed"), std::string::npos);
  // A number has one spelling, whichever way it arrives: the spec's ".25" and the struct's 0.25.
  VqOptions v;
  v.temperature = 0.25;
  EXPECT_EQ(make_method<double>("vq:temperature=.25")->spec(), VqMethod<double>(v).spec());
}

}  // namespace
}  // namespace attnlab
