// `attnlab methods`: every registered method with its parameters, defaults and causal support.
#include "attnlab/registry.hpp"
#include "commands.hpp"

#include <fmt/format.h>

namespace attnlab::cli {

void add_methods(CLI::App& app) {
  auto* sub = app.add_subcommand("methods", "list every registered method, its parameters and defaults");
  auto names_only = std::make_shared<bool>(false);
  sub->add_flag("--names", *names_only, "print the names only, one per line");
  sub->callback([names_only] {
    for (const auto& d : registered_methods()) {
      if (*names_only) {
        fmt::print("{}\n", d.name);
        continue;
      }
      fmt::print("{}  —  {}\n", d.name, d.summary);
      fmt::print("    causal: {}\n", d.causal ? "supported" : "refused");
      fmt::print("    implements: {}\n", d.reference);
      for (const auto& p : d.params)
        fmt::print("    {}={}  ({}): {}\n", p.name, p.default_value, p.describe_type(), p.help);
      fmt::print("\n");
    }
  });
}

}  // namespace attnlab::cli
