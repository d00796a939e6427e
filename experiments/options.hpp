// Every option of an experiment declared once: its flag, the variable it fills, its help text and its value under
// each preset. That one declaration registers the flag on `attnlab run NAME` (CLI11), applies the preset (a value
// given on the command line or in --config wins over it) and records the effective value for --dump-config and the
// results' .config sidecar, which --config replays.
//   o.add("--n", n_, "sequence lengths").preset({512}, {512, 2048});   // quick, paper
//   o.add("--methods", methods_, "method specs").separator(';').preset(defaults);
#pragma once

#include "attnlab/core/error.hpp"
#include "attnlab/core/types.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace attnlab::experiments {

/// The largest head dimension an experiment takes (the command's compare takes as much): beyond it linear attention's
/// d × d state alone passes memory.
inline constexpr double kMaxHeadDim = 4096;
/// The most seeds an experiment takes: every seed is a point of the grid, which is built before the first one runs.
inline constexpr double kMaxSeeds = 10000;

template <typename V>
struct is_vector : std::false_type {};
template <typename V>
struct is_vector<std::vector<V>> : std::true_type {};

/// Registers `flag`, filling `target`, on a CLI11 (sub)command; a list takes `separator` between its items. Defined
/// and instantiated for the option types the experiments use in options.cpp, the one experiments file that
/// compiles CLI11 (its templates cost each file that includes it several seconds of build); an option of a new
/// type is a link error naming it until it is added there.
template <typename V>
void add_flag(CLI::App& app, const std::string& flag, V& target, const std::string& help, char separator);

/// True when the option was given on the command line or in --config (presets do not override it).
bool given(const CLI::App& app, const std::string& option);

class Options {
  struct Entry {
    std::string flag, help;
    char separator = ',';
    std::function<void(CLI::App&, const Entry&)> add;  // registers the flag
    std::function<void(bool paper)> preset;            // sets the preset's value (empty: none)
    std::function<std::string(char)> text;             // the effective value as --config reads it
    std::function<bool()> recorded = [] { return true; };
    std::vector<std::function<void()>> checks;         // each throws Error for a value out of range
    enum class Grid { none, list, count } grid = Grid::none;  // in_point_ids(): how the option grows the grid
    void* target = nullptr;                            // the variable, for target<V>()
    const std::type_info* type = nullptr;
  };

  template <typename V>
  static std::string text(const V& v, char separator) {
    if constexpr (is_vector<V>::value) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : std::string(1, separator)) + text(x, separator);
      return s;
    } else if constexpr (std::is_same_v<V, bool>) {
      return v ? "true" : "false";
    } else if constexpr (std::is_same_v<V, std::string>) {
      return v;
    } else {
      return fmt::format("{}", v);  // integers as integers, doubles in their shortest round-trip form
    }
  }

 public:
  /// The handle add() returns, to give the option a preset, a list separator or a condition on its recording.
  template <typename V>
  class Declared {
   public:
    Declared(Options& o, std::size_t i, V& target) : o_(o), i_(i), target_(target) {}
    /// Its value under the quick preset (the whole set in minutes on 2 cores) and the paper preset.
    Declared& preset(V quick, V paper) {
      V& t = target_;
      o_.entries_[i_].preset = [&t, quick = std::move(quick), paper = std::move(paper)](bool p) {
        t = p ? paper : quick;
      };
      return *this;
    }
    /// The same value under both presets.
    Declared& preset(V both) { return preset(both, both); }
    /// A list's separator on the command line and in the recorded value (default ','; method specs, whose own
    /// parameters are comma-separated, use ';').
    Declared& separator(char c) {
      o_.entries_[i_].separator = c;
      return *this;
    }
    /// Recorded in the settings only when `when()` holds (the options of a user's files, say).
    Declared& recorded_if(std::function<bool()> when) {
      o_.entries_[i_].recorded = std::move(when);
      return *this;
    }

    /// Every value (of a list: every item) finite and > 0: checked after the preset and the command line, before
    /// any point runs (`--seeds 0` would run nothing and say it succeeded; `--temperatures nan` fail mid-run).
    Declared& positive() {
      static_assert(std::is_arithmetic_v<V> || is_vector<V>::value, "positive(): a number or a list of numbers");
      const V& t = target_;
      o_.entries_[i_].checks.push_back([&t, flag = o_.entries_[i_].flag] {
        const auto one = [&flag](const auto& x) {
          if (!(double(x) > 0 && double(x) < std::numeric_limits<double>::infinity()))
            throw Error(fmt::format("{}: every value must be positive and finite, got {}", flag, x));
        };
        if constexpr (is_vector<V>::value) {
          for (const auto& x : t) one(x);
        } else {
          one(t);
        }
      });
      return *this;
    }
    /// Every value (of a list: every item) at most `limit`, for the reason `why`: checked with positive()'s, before
    /// any point (a grid of 10^20 seeds is built in memory before its first point; a head dimension of 10^5 asks a
    /// d × d state of linear attention for 80 GB).
    Declared& at_most(double limit, const char* why) {
      static_assert(std::is_arithmetic_v<V> || is_vector<V>::value, "at_most(): a number or a list of numbers");
      const V& t = target_;
      o_.entries_[i_].checks.push_back([&t, limit, why, flag = o_.entries_[i_].flag] {
        const auto one = [&](const auto& x) {
          if (double(x) > limit) throw Error(fmt::format("{}: {} is more than {} ({})", flag, x, limit, why));
        };
        if constexpr (is_vector<V>::value) {
          for (const auto& x : t) one(x);
        } else {
          one(t);
        }
      });
      return *this;
    }
    /// The option's values are coordinates the grid points' ids name (a list: lengths, sources, temperatures; an
    /// integer count: seeds 0, ..., seeds − 1): a results file resumed with more of them keeps its finished points,
    /// which no other change of settings does (sweep.cpp, check_resumable).
    Declared& in_point_ids() {
      static_assert(is_vector<V>::value || std::is_integral_v<V>, "in_point_ids(): a list or an integer count");
      o_.entries_[i_].grid = is_vector<V>::value ? Entry::Grid::list : Entry::Grid::count;
      return *this;
    }
    /// A list whose items are all different (a duplicate would write the same rows twice).
    Declared& distinct() {
      static_assert(is_vector<V>::value, "distinct(): a list");
      const V& t = target_;
      o_.entries_[i_].checks.push_back([&t, flag = o_.entries_[i_].flag] {
        for (std::size_t i = 0; i < t.size(); ++i)
          for (std::size_t j = 0; j < i; ++j)
            if (t[i] == t[j]) throw Error(fmt::format("{}: '{}' is given twice", flag, t[i]));
      });
      return *this;
    }

   private:
    Options& o_;
    std::size_t i_;
    V& target_;
  };

  /// Declares `flag` (with its dashes), filling `target`; without preset() it keeps target's initial value.
  template <typename V>
  Declared<V> add(std::string flag, V& target, std::string help) {
    Entry e;
    e.flag = std::move(flag);
    e.help = std::move(help);
    e.add = [&target](CLI::App& app, const Entry& self) {
      add_flag(app, self.flag, target, self.help, self.separator);
    };
    e.text = [&target](char separator) { return text(target, separator); };
    e.target = &target;
    e.type = &typeid(V);
    entries_.push_back(std::move(e));
    return Declared<V>(*this, entries_.size() - 1, target);
  }

  /// The variable behind a declared `flag` of type V; nullptr when no such option is declared.
  template <typename V>
  V* target(const std::string& flag) const {
    for (const Entry& e : entries_)
      if (e.flag == flag && *e.type == typeid(V)) return static_cast<V*>(e.target);
    return nullptr;
  }
  /// Appends `text` to the help of `flag` when it is registered (for a rule another declaration brings: the
  /// model options' source `files` on --sources).
  void note_help(std::string flag, std::string text) { notes_.emplace_back(std::move(flag), std::move(text)); }
  /// Runs `rule` after every preset is applied and before the experiment's check(): a rule across options.
  void after_apply(std::function<void(Options&, const CLI::App&)> rule) { rules_.push_back(std::move(rule)); }

  /// Registers every flag on the subcommand.
  void register_on(CLI::App& app) const {
    for (const Entry& e : entries_) {
      Entry with_notes = e;
      for (const auto& [flag, text] : notes_)
        if (flag == e.flag) with_notes.help += text;
      e.add(app, with_notes);
    }
  }
  /// Sets every option not given on the command line (or in --config) to its value under `preset`, then applies
  /// the rules across options (after_apply).
  void apply(const std::string& preset, const CLI::App& app) {
    for (const Entry& e : entries_)
      if (e.preset && !given(app, e.flag)) e.preset(preset == "paper");
    for (const auto& rule : rules_) rule(*this, app);
    for (const Entry& e : entries_)
      for (const auto& check : e.checks) check();
  }
  /// Whether the recorded value `now` of option `key` (its flag without dashes) only adds grid points to `before`:
  /// an in_point_ids() list holding every item of before, or a count no smaller.
  bool grows(const std::string& key, const std::string& before, const std::string& now) const {
    for (const Entry& e : entries_) {
      if (e.flag.substr(e.flag.find_first_not_of('-')) != key) continue;
      if (e.grid == Entry::Grid::count) {  // a hand-edited sidecar's non-number is a difference, not a throw
        char *end_now = nullptr, *end_before = nullptr;
        const long long n = std::strtoll(now.c_str(), &end_now, 10), b = std::strtoll(before.c_str(), &end_before, 10);
        return !now.empty() && !before.empty() && *end_now == 0 && *end_before == 0 && n >= b;
      }
      if (e.grid != Entry::Grid::list) return false;
      const auto items = [&](const std::string& text) {
        std::vector<std::string> out;
        std::size_t start = 0;
        for (std::size_t i = 0; i <= text.size(); ++i) {
          if (i < text.size() && text[i] != e.separator) continue;
          out.push_back(text.substr(start, i - start));
          start = i + 1;
        }
        return out;
      };
      const auto have = items(now);
      for (const auto& x : items(before))
        if (std::find(have.begin(), have.end(), x) == have.end()) return false;
      return true;
    }
    return false;
  }
  /// The effective values, as (key, value) in declaration order: key is the flag without its dashes.
  std::vector<std::pair<std::string, std::string>> values() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Entry& e : entries_)
      if (e.recorded()) out.emplace_back(e.flag.substr(e.flag.find_first_not_of('-')), e.text(e.separator));
    return out;
  }

 private:
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::string>> notes_;
  std::vector<std::function<void(Options&, const CLI::App&)>> rules_;
};

}  // namespace attnlab::experiments
