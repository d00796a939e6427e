// attnlab: exact softmax attention and its sub-quadratic approximations, computed and measured.
// Every failure ends in one line on stderr and a non-zero exit status. Eigen's blocking is pinned by the library
// before main() (core/reproducible.hpp): the same summation order on every CPU, so the same results.
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "commands.hpp"
#include "inputs.hpp"
#include "sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>

int main(int argc, char** argv) {
  attnlab::cli::set_command_line(argc, argv);
  CLI::App app{"attnlab: exact softmax attention and its approximations, and how far apart they are", "attnlab"};
  app.set_version_flag("--version", std::string(attnlab::code_version()));
  app.require_subcommand(1);
  app.fallthrough();
  // Set while parsing, so that it is in force before any subcommand runs.
  app.add_option_function<std::string>(
      "--max-memory", [](const std::string& s) { attnlab::set_memory_limit(attnlab::parse_bytes(s)); },
      "refuse any single quadratic allocation above this size (e.g. 512M, 4G); default: available memory");
  app.failure_message([](const CLI::App*, const CLI::Error& e) { return fmt::format("attnlab: {}\n", e.what()); });
  attnlab::cli::add_apply(app);
  attnlab::cli::add_compare(app);
  attnlab::cli::add_methods(app);
  attnlab::cli::add_report(app);
  attnlab::experiments::add_run_command(app);
  try {
    // `run NAME --config FILE` becomes the options FILE holds; CLI11 takes the arguments in reverse order.
    std::vector<std::string> args(argv + 1, argv + argc);
    args = attnlab::experiments::expand_config(std::move(args));
    std::reverse(args.begin(), args.end());
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const attnlab::Error& e) {
    std::fprintf(stderr, "attnlab: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    // An allocation the estimates before the work did not foresee (or other processes took the memory since):
    // say what was being computed, in sizes, and what the machine has.
    const std::string& what = attnlab::cli::work();
    const std::uint64_t avail = attnlab::available_memory();
    std::fprintf(stderr, "attnlab: error: out of memory%s%s; %s of memory available\n",
                 what.empty() ? "" : " while running ", what.c_str(),
                 avail ? attnlab::format_bytes(avail).c_str() : "an unknown amount");
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnlab: error: %s\n", e.what());
    return 4;
  }
  return 0;
}
