// The sweep runner: resume from the CSV, shard the grid, write each finished point at once, show progress.
#include "sweep.hpp"

#include "attnlab/analysis/cost.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/io/tidy_csv.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

namespace attnlab::experiments {

const std::vector<std::string>& result_columns() {
  static const std::vector<std::string> c = {"experiment", "point", "source", "method", "spec",    "n",      "d",
                                             "seed",       "sequence", "layer", "head", "dtype", "variant", "step"};
  return c;
}

const std::vector<std::string>& result_columns_v1() {
  static const std::vector<std::string> c = {"experiment", "point", "source", "method", "spec",
                                             "n",          "d",     "seed",   "variant", "step"};
  return c;
}

bool given(const CLI::App& app, const std::string& option) {
  const CLI::Option* o = app.get_option_no_throw(option);
  return o != nullptr && o->count() > 0;
}

namespace {

constexpr const char* kDoneMetric = "point_done";
// Where a results line holds the point's id and the metric (after schema_version, code_version and experiment).
constexpr std::size_t kPointCol = 3;
std::size_t metric_col() { return 2 + result_columns().size(); }

/// An index column's text: empty for −1 (none).
std::string optional_index(std::int64_t i) { return i >= 0 ? std::to_string(i) : ""; }

/// Reads what an earlier run left: keeps the rows of finished points (those with a point_done row), drops the
/// rest (a point interrupted mid-way, a torn last line), rewrites the file atomically, returns the finished ids.
std::set<std::string> resume(const std::string& path, const std::string& header) {
  std::set<std::string> done;
  if (!std::filesystem::exists(path)) return done;
  std::istringstream in(read_text_file(path));  // plain or gzip; a gzip stream cut short is read to its last flush
  std::string first, line;
  std::getline(in, first);
  if (first.empty()) return done;
  if (first == tidy_header(result_columns_v1()))
    throw Error(fmt::format("{0}: written by results schema 1; migrate it to schema {1} (same values, new columns: "
                            "the run then resumes it) with `python3 tools/migrate_results.py {0}`, or move it away "
                            "or use --out",
                            path, kResultsSchemaVersion));
  if (first != header)
    throw Error(fmt::format("{}: written by another schema (header differs); move it away or use --out", path));
  std::vector<std::pair<std::string, std::string>> rows;  // (point id, line)
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no trailing newline: torn by an interruption
    const auto f = split_csv_line(line);
    if (f.size() != result_columns().size() + 4) continue;
    rows.emplace_back(f[kPointCol], line);
    if (f[metric_col()] == kDoneMetric) done.insert(f[kPointCol]);
  }
  std::string kept = first + '\n';
  for (const auto& [id, l] : rows)
    if (done.count(id)) kept += l + '\n';
  write_text_file(path, kept);  // atomically: a second interruption here loses nothing
  return done;
}

/// Rewrites a finished file with its points in grid order, each point's lines as they were: side-by-side workers
/// commit points in the order they finish, and the same rows should give the same bytes whichever finished first.
void order_points(const std::string& path, const std::vector<Point>& grid) {
  std::map<std::string, std::size_t> rank;
  for (std::size_t i = 0; i < grid.size(); ++i) rank.emplace(grid[i].id, i);
  std::istringstream in(read_text_file(path));
  std::string header, line;
  std::getline(in, header);
  std::vector<std::pair<std::size_t, std::string>> blocks;  // (grid index, the point's lines)
  std::map<std::string, std::size_t> block_of;
  while (std::getline(in, line)) {
    const auto f = split_csv_line(line);
    const std::string id = f.size() > kPointCol ? f[kPointCol] : std::string();
    const auto [it, fresh] = block_of.emplace(id, blocks.size());
    if (fresh) blocks.emplace_back(rank.count(id) ? rank.at(id) : 0, std::string());
    blocks[it->second].second += line + '\n';
  }
  std::stable_sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string text = header + '\n';
  for (const auto& b : blocks) text += b.second;
  write_text_file(path, text);
}

struct RunOptions {
  std::string out, preset = "quick", shard = "0/1", config_out;
  int threads = 0;
  bool dump_config = false;
};

std::string format_seconds(double s) {
  if (s < 90) return fmt::format("{:.0f}s", s);
  if (s < 5400) return fmt::format("{:.1f}min", s / 60);
  return fmt::format("{:.1f}h", s / 3600);
}

std::string dump(Experiment& e, const RunOptions& o) {
  std::string s = fmt::format("# attnlab run {} --config FILE replays this run (code version {})\n", e.name(),
                              code_version());
  s += fmt::format("preset = {}\nshard = {}\n", o.preset, o.shard);
  if (o.threads > 0) s += fmt::format("threads = {}\n", o.threads);
  for (const auto& [key, value] : e.settings()) s += fmt::format("{} = {}\n", key, value);
  return s;
}

/// The settings of a dump() (or a .config sidecar's text), key → value, without what does not change a point's
/// rows: the preset's name (its values are the settings), the shard and the thread count.
std::map<std::string, std::string> point_settings(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq);
    if (key != "preset" && key != "shard" && key != "threads") out[key] = line.substr(eq + 3);
  }
  return out;
}

/// A resumed file keeps its finished points as they are: refused when its sidecar says they were computed with other
/// settings (a point's id names its grid coordinates, not everything its rows depend on: `precision`'s methods and
/// formats, say), which would otherwise leave old rows under the new sidecar and compute nothing. More of the
/// coordinates the ids name (lengths, sources, seeds: Options' in_point_ids) only add points, and are resumed; a
/// setting the old sidecar lacks (written by a version without that option) is not a difference.
void check_resumable(Experiment& e, const std::string& path, const std::set<std::string>& done,
                     const std::string& now) {
  const std::string config = path + ".config";
  if (done.empty() || !std::filesystem::exists(config)) return;
  const auto before = point_settings(read_text_file(config)), after = point_settings(now);
  std::string diff;
  for (const auto& [key, value] : after) {
    const auto it = before.find(key);
    if (it == before.end() || it->second == value || e.grows(key, it->second, value)) continue;
    diff += fmt::format("{}{}: {} → {}", diff.empty() ? "" : "; ", key, it->second, value);
  }
  if (!diff.empty())
    throw Error(fmt::format("{}: its {} finished points were computed with other settings ({}); rerun with "
                            "`--config {} --out {}` to resume it, or give another --out (or delete it) to start anew",
                            path, done.size(), diff, config, path));
}

void run_experiment(Experiment& e, CLI::App& sub, const RunOptions& o) {
  e.apply_preset(o.preset, sub);
  if (o.dump_config) {
    std::fputs(dump(e, o).c_str(), stdout);
    return;
  }
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::size_t shard = 0, shards = 1;
  {
    char slash = 0;
    long long i = -1, count = 0;  // signed: an unsigned read takes "-1" as 2^64 − 1
    std::istringstream s(o.shard);
    if (!(s >> i >> slash >> count) || slash != '/' || i < 0 || count <= 0 || i >= count || !s.eof())
      throw Error(fmt::format("--shard '{}': expected i/N with 0 ≤ i < N", o.shard));
    shard = std::size_t(i);
    shards = std::size_t(count);
  }
  const std::string path = o.out.empty() ? fmt::format("results/{}.csv.gz", e.name()) : o.out;
  const std::string header = tidy_header(result_columns());
  if (std::filesystem::path(path).has_parent_path())
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const std::set<std::string> done = resume(path, header);
  check_resumable(e, path, done, dump(e, o));
  std::vector<Point> points = e.grid();
  std::vector<Point*> todo;
  std::set<std::string> ids;
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (!ids.insert(points[i].id).second) throw Error(fmt::format("{}: grid point '{}' twice", e.name(), points[i].id));
    if (i % shards == shard && !done.count(points[i].id)) todo.push_back(&points[i]);
  }
  {  // the sidecar: everything needed to replay the run
    std::ofstream side(path + ".config");
    // What the timings in this file were taken on (threads, products, ISA): beside the settings, not one of them.
    side << dump(e, o) << "# costs measured with: " << cost_context() << "\n# costs measured on: " << cpu_name()
         << "\n";
  }
  TidyCsvWriter csv(path, result_columns(), /*append=*/true);
  const bool tty = isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t skipped = points.size() / shards + (shard < points.size() % shards ? 1 : 0) - todo.size();
  // The points that may run side by side first, then those that run alone (a timed one: on every thread, as the
  // serial loop runs every point); the file is put back in grid order at the end.
  std::vector<Point*> alone;
  if (e.points_side_by_side()) {
    const auto part = std::stable_partition(todo.begin(), todo.end(), [](const Point* p) { return !p->alone; });
    alone.assign(part, todo.end());
    todo.erase(part, todo.end());
  } else {
    alone.swap(todo);
  }
  const std::size_t total = todo.size() + alone.size();
  std::mutex commit_mutex;
  std::size_t finished = 0;
  // Writes one point's rows and its done marker, then commits: the point is on disk before its worker takes the next.
  const auto commit = [&](const Point& pt, const std::vector<Row>& rows) {
    const std::lock_guard<std::mutex> lock(commit_mutex);
    for (const Row& r : rows)
      if (!std::isnan(r.value))
        csv.write({e.name(), pt.id, r.source, r.method, r.spec, std::to_string(r.n), std::to_string(r.d),
                   std::to_string(r.seed), optional_index(r.sequence), optional_index(r.layer),
                   optional_index(r.head), r.dtype, r.variant, optional_index(r.step)},
                  r.metric, r.value);
    std::vector<std::string> done_keys(result_columns().size());
    done_keys[0] = e.name();
    done_keys[1] = pt.id;
    csv.write(done_keys, kDoneMetric, 1);
    csv.commit();
    ++finished;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double left = el / double(finished) * double(total - finished);
    if (tty)
      std::fprintf(stderr, "\r%s: %zu/%zu points (%zu done before), %s elapsed, ~%s left   ", e.name().c_str(),
                   finished, total, skipped, format_seconds(el).c_str(), format_seconds(left).c_str());
  };
  const int workers = int(std::min<std::size_t>(todo.size(), std::size_t(omp_get_max_threads())));
  if (workers <= 1) {
    for (Point* pt : todo) commit(*pt, pt->run());
  } else {
    // One point per worker, each on one thread (its own parallel regions run with one: the nthreads of the
    // worker's data environment), taking the next point when done. The first error stops the taking; the points
    // already running finish and are kept, then it is raised, as the serial loop would after the points before it.
    std::atomic<std::size_t> next{0};
    std::exception_ptr error;
#pragma omp parallel num_threads(workers)
    {
      omp_set_num_threads(1);
      for (;;) {
        const std::size_t i = next.fetch_add(1);
        if (i >= todo.size()) break;
        try {
          commit(*todo[i], todo[i]->run());
        } catch (...) {
          const std::lock_guard<std::mutex> lock(commit_mutex);
          if (!error) error = std::current_exception();
          next = todo.size();
        }
      }
    }
    if (error) {
      csv.close();
      std::rethrow_exception(error);
    }
  }
  for (Point* pt : alone) commit(*pt, pt->run());
  csv.close();
  // A gzip file that was appended to (resumed) holds several members and per-point flushes: rewrite it as one
  // member, so that the same rows always give the same bytes (committed results do not churn).
  if (e.points_side_by_side()) order_points(path, points);  // (rewrites the file whole, as below)
  else if (is_gzip_path(path)) write_text_file(path, read_text_file(path));
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%s%s: %zu points computed, %zu already done, %s; results in %s\n", tty ? "\n" : "",
               e.name().c_str(), total, skipped, format_seconds(el).c_str(), path.c_str());
}

}  // namespace

std::vector<std::string> expand_config(std::vector<std::string> args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string file;
    if (args[i] == "--config" && i + 1 < args.size()) file = args[i + 1];
    else if (args[i].rfind("--config=", 0) == 0) file = args[i].substr(9);
    else continue;
    std::ifstream in(file);
    if (!in) throw Error(fmt::format("--config {}: cannot read it", file));
    std::vector<std::string> opts;
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      const auto hash = line.find('#');
      if (hash != std::string::npos) line.resize(hash);
      const auto eq = line.find('=');
      const auto trim = [](std::string t) {
        const auto b = t.find_first_not_of(" \t\"'[");
        const auto e = t.find_last_not_of(" \t\"']");
        return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
      };
      if (trim(line).empty()) continue;
      if (eq == std::string::npos) throw Error(fmt::format("--config {}:{}: expected key = value", file, lineno));
      const std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
      if (key.empty() || value.empty()) throw Error(fmt::format("--config {}:{}: expected key = value", file, lineno));
      opts.push_back("--" + key + "=" + value);
    }
    const std::size_t width = args[i] == "--config" ? 2 : 1;
    args.erase(args.begin() + std::ptrdiff_t(i), args.begin() + std::ptrdiff_t(i + width));
    args.insert(args.begin() + std::ptrdiff_t(i), opts.begin(), opts.end());
    i += opts.size() - 1;
  }
  return args;
}

void add_run_command(CLI::App& app) {
  auto* run = app.add_subcommand("run", "run an experiment's sweep, writing tidy CSV under results/ (resumable)");
  run->require_subcommand(1);
  for (auto& exp : all_experiments()) {
    std::shared_ptr<Experiment> e(std::move(exp));
    auto* sub = run->add_subcommand(e->name(), e->question());
    auto o = std::make_shared<RunOptions>();
    sub->add_option("--out", o->out,
                    "CSV to write (default results/NAME.csv.gz; gzip-compressed when the name ends in .gz); "
                    "an existing one is resumed");
    sub->add_option("--preset", o->preset, "grid preset: quick (minutes on 2 cores) or paper (the papers' sizes)")
        ->check(CLI::IsMember({"quick", "paper"}))
        ->capture_default_str();
    sub->add_option("--shard", o->shard, "run the points i, i+N, i+2N, ... of the grid (0 ≤ i < N)")
        ->capture_default_str();
    sub->add_option("--threads", o->threads, "OpenMP threads (default, 0: all cores)")->check(CLI::NonNegativeNumber);
    sub->add_option("--config", o->config_out, "read options from a file written by --dump-config (replays a run)");
    sub->add_flag("--dump-config", o->dump_config, "print the full configuration as TOML and exit");
    e->add_options(*sub);
    sub->callback([e, sub, o] { run_experiment(*e, *sub, *o); });
  }
}

}  // namespace attnlab::experiments
