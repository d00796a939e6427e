// The sweep runner every experiment uses: a grid of points, each computed once and written to a tidy CSV under
// results/ as soon as it finishes. A re-run reads the CSV, keeps the finished points and computes only the rest
// (an interrupted run loses at most the point it was on); `--shard i/N` takes a deterministic 1/N of the grid;
// a progress line (points done, elapsed, estimated remaining) goes to the terminal.
#pragma once

#include "options.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace attnlab::experiments {

/// Tidy CSV columns after schema_version and code_version (results schema 2; docs/reproducing.md: "Results files"
/// says what each holds in every experiment): experiment, point, source, method, spec, n, d, seed, sequence, layer,
/// head, dtype, variant, step.
const std::vector<std::string>& result_columns();

/// The results schema before this one (schema 1: no sequence, layer, head, dtype columns): a file written by it is
/// migrated by tools/migrate_results.py, not resumed.
const std::vector<std::string>& result_columns_v1();

/// One row of a point's results. The columns a row does not use stay empty (−1, "").
struct Row {
  std::string source;  // generated kind (gaussian, ...) or model source (trained, initialized, trained_causal, files)
  std::string method, spec, variant;
  std::int64_t n = 0, d = 0;
  std::uint64_t seed = 0;
  std::int64_t sequence = -1, layer = -1, head = -1;  // a model head's held-out sequence, layer and head; −1: none
  std::string dtype;       // the compute type when a row has one (compare); empty: none
  std::int64_t step = -1;  // iteration / feature count / ...; −1: none
  std::string metric;
  double value = 0;
};

/// One grid point: a stable id (its identifying parameters as text) and the work that yields its rows.
struct Point {
  std::string id;
  std::function<std::vector<Row>()> run;
  /// In an experiment whose points run side by side (Experiment::points_side_by_side), a point that times something
  /// or measures memory: it runs alone, on every thread, after the others.
  bool alone = false;
};

/// An experiment: its name, the question it answers, its options with their presets, and its grid.
class Experiment {
 public:
  virtual ~Experiment() = default;
  /// Its name (`attnlab run NAME`) and the question it answers: the registry's table (registry.cpp) gives them.
  const std::string& name() const { return name_; }
  const std::string& question() const { return question_; }
  virtual std::vector<Point> grid() = 0;

  /// Registers the options on the `attnlab run NAME` subcommand.
  void add_options(CLI::App& app) { options().register_on(app); }
  /// Sets the grid for a preset ("quick": the whole set in minutes on 2 cores; "paper": the papers' sizes); options
  /// given on the command line win over the preset. Then check()s the result.
  void apply_preset(const std::string& preset, const CLI::App& app) {
    options().apply(preset, app);
    check();
  }
  /// The effective grid after the preset, as option → value ("n" → "512,2048"): what --dump-config writes.
  std::vector<std::pair<std::string, std::string>> settings() { return options().values(); }
  /// Whether its points may run side by side, one thread each, as many at once as --threads allows: only where its
  /// points time nothing and measure no memory (side by side they would share the cores and the process's peak), or
  /// mark those that do (Point::alone).
  /// The values are the same bits either way (core/reproducible.hpp: no value depends on the thread count), and the
  /// file the same bytes (its points put back in grid order at the end); a point alone on 2 cores left one of them
  /// idle half the time (run precision: 107 s on 2 threads, 149 s on one, ~121 CPU-s of work).
  virtual bool points_side_by_side() const { return false; }
  /// Whether setting `key` changed from `before` to `now` only adds grid points (Options::grows).
  bool grows(const std::string& key, const std::string& before, const std::string& now) {
    return options().grows(key, before, now);
  }

 protected:
  /// Declares every option once: flag, variable, help, and preset values (options.hpp).
  virtual void declare(Options& o) = 0;
  /// Checks that need the whole configuration, after the preset and the command line (throws Error).
  virtual void check() const {}

 private:
  Options& options() {
    if (!declared_) declare(options_), declared_ = true;
    return options_;
  }
  friend std::vector<std::unique_ptr<Experiment>> all_experiments();
  std::string name_, question_;
  Options options_;
  bool declared_ = false;
};

/// Expands `attnlab run NAME --config FILE` into the options FILE holds (lines `key = value` as --dump-config
/// writes them; `#` starts a comment), in place, before parsing. Throws Error for an unreadable file or line.
std::vector<std::string> expand_config(std::vector<std::string> args);

/// Every experiment, by name.
std::vector<std::unique_ptr<Experiment>> all_experiments();

/// Registers `attnlab run NAME ...` for every experiment.
void add_run_command(CLI::App& app);

}  // namespace attnlab::experiments
