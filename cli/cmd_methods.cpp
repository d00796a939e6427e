// `attnlab methods [NAME...]`: the registered methods (or those named) with their parameters, defaults, causal
// support and backward pass.
#include "attnlab/analysis/budget_families.hpp"
#include "attnlab/core/registry.hpp"
#include "commands.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace attnlab::cli {
namespace {

std::string cell(std::string s) {
  std::string o;
  for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
  return o;
}

/// The budget families the studies sweep (error_vs_budget, the report, the drop-in and fine-tuning studies), as
/// CSV, read from the registry: each method's declaration with its budget parameter (core/spec.hpp's Study).
/// A spec may fix several options ("a=1,b=2"): quoted.
std::string families_csv() {
  std::string t = "label,spec,param,budgets,simplicity,deployable,timed\n";
  for (const BudgetFamily& f : budget_families())
    t += fmt::format("{},\"{}\",{},{},{},{},{}\n", f.label, f.spec, f.param(), fmt::join(f.budgets, " "),
                     f.simplicity == Study::kLast ? std::string("last") : std::to_string(f.simplicity),
                     f.deployable ? "true" : "false", f.measure_cost ? "true" : "false");
  return t;
}

}  // namespace

std::string methods_markdown() {
  std::string t =
      "| spec (defaults; choices after the default) | what | causal mask | backward | budget | implements |\n"
      "|---|---|---|---|---|---|\n";
  for (const auto& d : registered_methods()) {
    std::string spec = d.name;
    char sep = ':';
    for (const auto& p : d.params) {
      if (p.name == "seed") continue;  // every randomized method takes one
      std::string value = p.default_value;
      for (const auto& c : p.choices)
        if (c != p.default_value) value += "|" + c;
      if (p.type == ParamSpec::Type::Path) value += "|PATH" + p.suffix;  // codebook=window|PATH.npy
      spec += sep + p.name + "=" + value;
      sep = ',';
    }
    t += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n", cell(spec), cell(d.summary), cell(d.causal_note),
                     cell(d.backward_note), d.budget.empty() ? "–" : "`" + d.budget + "`", cell(d.reference));
  }
  return t;
}

void add_methods(CLI::App& app) {
  auto* sub = app.add_subcommand("methods", "list the registered methods (or those named), their parameters and "
                                            "defaults");
  auto names = std::make_shared<std::vector<std::string>>();
  sub->add_option("name", *names, "methods to describe (default: every registered method)");
  auto names_only = std::make_shared<bool>(false);
  sub->add_flag("--names", *names_only, "print the names only, one per line");
  auto markdown = std::make_shared<bool>(false);
  sub->add_flag("--markdown", *markdown, "print the README's methods table (a test checks README.md against it)");
  auto families = std::make_shared<bool>(false);
  sub->add_flag("--families", *families,
                "print the budget families the studies sweep (label, spec, budget parameter, grid, simplicity rank: "
                "the report's tie-break, lower is simpler; deployable, timed) as CSV");
  sub->callback([names, names_only, markdown, families] {
    if (*markdown) {
      fmt::print("{}", methods_markdown());
      return;
    }
    if (*families) {
      fmt::print("{}", families_csv());
      return;
    }
    // The methods asked for, each looked up first: an unknown name is refused (with a did-you-mean) before any output.
    std::vector<const MethodDescriptor*> chosen;
    for (const auto& n : *names) chosen.push_back(&find_method(n));
    if (names->empty())
      for (const auto& d : registered_methods()) chosen.push_back(&d);
    for (const MethodDescriptor* dp : chosen) {
      const MethodDescriptor& d = *dp;
      if (*names_only) {
        fmt::print("{}\n", d.name);
        continue;
      }
      fmt::print("{}  —  {}\n", d.name, d.summary);
      fmt::print("    causal: {}\n", d.causal_note);
      fmt::print("    backward: {}\n", d.backward_note);
      fmt::print("    bf16/fp16 storage: {}{}\n",
                 d.storage.eager && d.storage.careful ? "eager, careful: "
                 : d.storage.careful                  ? "careful: "
                                                      : "",
                 d.storage.note);
      fmt::print("    bf16/fp16 backward: {}\n", d.storage.backward_note);
      if (!d.budget.empty()) fmt::print("    budget: {}\n", d.budget);
      for (const auto& p : d.params)
        for (const Study& s : p.studies)
          fmt::print("    studied as: {} ({}{} = {}; simplicity {})\n", s.label, s.fixed.empty() ? "" : s.fixed + ", ",
                     p.name, fmt::join(s.budgets, ", "),
                     s.rank == Study::kLast ? std::string("last") : std::to_string(s.rank));
      for (const auto& p : d.params)
        for (const SizeLimit& l : p.limits) {
          std::string when;
          for (const auto& [key, value] : l.when) when += fmt::format("{}{}={}", when.empty() ? ", where " : ", ", key,
                                                                      value);
          fmt::print("    limit: {} ≤ {}{}\n", p.name, l.what, when);
        }
      fmt::print("    implements: {}\n", d.reference);
      for (const auto& p : d.params)
        fmt::print("    {}={}  ({}): {}\n", p.name, p.default_value, p.describe_type(), p.help);
      fmt::print("\n");
    }
  });
}

}  // namespace attnlab::cli
