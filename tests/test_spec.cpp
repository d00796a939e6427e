// Spec strings and the factory: valid specs resolve with defaults; every kind of bad spec is refused with
// a message that lists what is valid.
#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/spec.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

#include <regex>

namespace attnlab {
namespace {

using test::error_of;

TEST(Spec, ParsesNameAndValues) {
  const Spec s = parse_spec(" nystrom:landmarks=64, iters=6 ");
  EXPECT_EQ(s.name, "nystrom");
  ASSERT_EQ(s.values.size(), 2u);
  EXPECT_EQ(s.values[1].first, "iters");
  EXPECT_EQ(s.values[1].second, "6");
  EXPECT_EQ(parse_spec("exact").values.size(), 0u);
}

TEST(Spec, RefusesBadSyntax) {
  // "Exact" is well-formed: whether it names a method is the registry's to say (with a did-you-mean, below).
  for (const char* bad : {"", ":a=1", "exact:", "exact:tile", "exact:tile=", "exact:=3", "exact:a=1,a=2",
                          "exact:a=1,,b=2", "ex act", "exact:ti le=3", "exact;tile=8"})
    EXPECT_FALSE(error_of([&] { parse_spec(bad); }).empty()) << "accepted '" << bad << "'";
}

TEST(Spec, ResolvesTypesRangesAndChoices) {
  const std::vector<ParamSpec> ps = {ParamSpec::integer("m", 64, 1, 4096, ""), ParamSpec::real("t", 0.5, 0, 10, ""),
                                     ParamSpec::boolean("ortho", true, ""),
                                     ParamSpec::choice("kernel", {"positive", "trig"}, "")};
  const Params d = resolve_params("x", ps, parse_spec("x"));
  EXPECT_EQ(d.integer("m"), 64);
  EXPECT_DOUBLE_EQ(d.real("t"), 0.5);
  EXPECT_TRUE(d.boolean("ortho"));
  EXPECT_EQ(d.choice("kernel"), "positive");
  EXPECT_EQ(d.to_string(), "m=64,t=0.5,ortho=true,kernel=positive");
  const Params p = resolve_params("x", ps, parse_spec("x:kernel=trig,ortho=no,m=8"));
  EXPECT_EQ(p.to_string(), "m=8,t=0.5,ortho=false,kernel=trig");

  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:q=1")); }).find("valid: m, t, ortho, kernel"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:m=0")); }).find("integer in [1, 4096]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:m=2.5")); }).find("integer"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:m=99999999999999999999")); }).find("bad value"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:t=nan")); }).find("number in [0, 10]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:t=11")); }).find("bad value"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:ortho=maybe")); }).find("true|false"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve_params("x", ps, parse_spec("x:kernel=cos")); }).find("one of positive|trig"),
            std::string::npos);
}

TEST(Factory, BuildsEveryRegisteredMethodAndRefusesUnknownOnes) {
  for (const auto& d : registered_methods()) {
    auto f = make_method<float>(d.name);
    auto g = make_method<double>(d.name, 7);
    EXPECT_EQ(f->name(), d.name);
    // The canonical spec replays the same method.
    EXPECT_EQ(make_method<double>(g->spec())->spec(), g->spec());
    if (g->params().has("seed")) {
      EXPECT_EQ(g->params().integer("seed"), 7);
    }
  }
  const std::string msg = error_of([] { make_method<double>("attentionformer"); });
  EXPECT_NE(msg.find("no method 'attentionformer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exact, linear"), std::string::npos) << "nothing close: lists the valid names: " << msg;
  EXPECT_NE(error_of([] { make_method<float>("exact:tile=4"); }).find("integer in [8, 8192]"), std::string::npos);
  EXPECT_NE(error_of([] { make_method<float>("exact:impl=fast"); }).find("one of streaming|materialized"),
            std::string::npos);
}

// A mistyped name or key says what was probably meant: another case, a typo, a longer or shorter name.
TEST(Factory, SuggestsTheCloseNames) {
  EXPECT_EQ(error_of([] { make_method<double>("Nystrom"); }), "no method 'Nystrom'; did you mean nystrom?");
  EXPECT_EQ(error_of([] { make_method<float>("EXACT:tile=8"); }), "no method 'EXACT'; did you mean exact?");
  EXPECT_EQ(error_of([] { make_method<double>("nystromformer"); }), "no method 'nystromformer'; did you mean nystrom?");
  EXPECT_EQ(error_of([] { make_method<double>("perfomer"); }), "no method 'perfomer'; did you mean performer?");
  EXPECT_EQ(error_of([] { make_method<double>("nystrom:landmark=8"); }),
            "method 'nystrom' has no parameter 'landmark'; did you mean landmarks? valid: landmarks, pinv, iters, "
            "select, seed");
  EXPECT_NE(error_of([] { make_method<double>("nystrom:Landmarks=8"); }).find("did you mean landmarks?"),
            std::string::npos);
  // Nothing close: the valid names only.
  EXPECT_EQ(error_of([] { make_method<double>("exact:window=8"); }),
            "method 'exact' has no parameter 'window'; valid: impl, tile");
  EXPECT_EQ(close_matches("lin", {"linear", "linformer", "local"}), (std::vector<std::string>{"linear", "linformer"}));
  EXPECT_TRUE(close_matches("zzz", {"linear", "local"}).empty());
  EXPECT_EQ(did_you_mean("sparce", {"sparse", "svd"}), "did you mean sparse?");
}

// Ranges print as the integers they are: the seed's upper end is 2⁶³ − 1, not 9.223372036854776e+18.
TEST(Spec, IntegerRangesPrintExactly) {
  EXPECT_EQ(ParamSpec::seed().describe_type(), "integer in [0, 9223372036854775807]");
  EXPECT_EQ(ParamSpec::integer("w", 16, -1, 1 << 24, "").describe_type(), "integer in [-1, 16777216]");
  EXPECT_EQ(make_method<double>("nystrom:seed=9223372036854775807")->params().integer("seed"),
            9223372036854775807LL);
  EXPECT_NE(error_of([] { make_method<double>("nystrom:seed=9223372036854775808"); }).find("bad value"),
            std::string::npos);
}

// What `attnlab methods` prints cites what a user can find: the papers (authors, year, equation or section), never
// the project's internal seed documents ("seed 003 eqs. (3)-(4)").
TEST(Factory, DescriptorsCiteThePapers) {
  for (const auto& d : registered_methods()) {
    EXPECT_EQ(d.reference.find("seed 0"), std::string::npos) << d.name << ": " << d.reference;
    EXPECT_TRUE(std::regex_search(d.reference, std::regex("(19|20)[0-9][0-9]"))) << d.name << " cites no year: "
                                                                                  << d.reference;
    for (const auto& p : d.params) {
      EXPECT_EQ(p.help.find("seed 0"), std::string::npos) << d.name << "." << p.name << ": " << p.help;
      EXPECT_EQ(p.describe_type().find("e+"), std::string::npos) << d.name << "." << p.name;
    }
  }
}

TEST(Factory, DescriptorsNameOneBudgetParameterAndTheirCausalSupport) {
  for (const auto& d : registered_methods()) {
    int marked = 0;
    for (const auto& p : d.params)
      if (p.is_budget) {
        ++marked;
        EXPECT_EQ(p.name, d.budget) << d.name;
      }
    EXPECT_EQ(marked, d.budget.empty() ? 0 : 1) << d.name << ": the budget is one of its parameters";
    // The README's causal column: "refused: why" exactly for the methods that refuse a mask.
    EXPECT_EQ(d.causal_note.rfind("refused: ", 0) == 0, !d.causal) << d.name << ": " << d.causal_note;
  }
  EXPECT_EQ(find_method("nystrom").budget, "landmarks");
  EXPECT_EQ(find_method("linformer").budget, "k");
  EXPECT_EQ(find_method("performer").budget, "features");
  EXPECT_EQ(find_method("exact").budget, "");
  EXPECT_FALSE(find_method("nystrom").causal);
  EXPECT_TRUE(find_method("vq").causal);  // with assign=hard; the method narrows it by parameter

  EXPECT_EQ(Causal::yes().note, "yes");
  EXPECT_EQ(Causal::yes("prefix sums").note, "yes: prefix sums");
  EXPECT_EQ(Causal::refused("mixes every position").note, "refused: mixes every position");
  const std::string two = error_of([] {
    detail::describe("m", "summary", "eq. (1)", Causal::yes(),
                     {ParamSpec::integer("a", 1, 0, 2, "a").budget(), ParamSpec::integer("b", 1, 0, 2, "b").budget()});
  });
  EXPECT_NE(two.find("two budget parameters, a and b"), std::string::npos) << two;
}

}  // namespace
}  // namespace attnlab
