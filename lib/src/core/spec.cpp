// Spec strings `name[:key=value,...]`: syntax, then validation against a method's parameters.
#include "attnlab/core/spec.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/parameters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

namespace attnlab {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// A name or key as written: letters of either case, digits, '_' and '-'. Whether it names anything is for the
// lookup to say ("no method 'Nystrom'; did you mean nystrom?"), not the syntax.
bool is_word(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

std::string fmt_number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", (long long)v);
  return fmt::format("{}", v);
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

bool parse_ll(const std::string& s, long long& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  out = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && end == s.c_str() + s.size();
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(out);
}

bool parse_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "1" || s == "yes" || s == "on") return out = true, true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return out = false, true;
  return false;
}

}  // namespace

std::vector<std::string> close_matches(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& c : candidates) {
    const std::string lc = lower(c);
    if (lc == w) return {c};  // the same name in another case: no other candidate matters
    const std::size_t shorter = std::min(w.size(), lc.size());
    const std::size_t d = edit_distance(w, lc);
    // A typo (a third of the letters at most), or one name extending the other (nystromformer, landmark).
    const bool prefix = shorter >= 3 && (w.compare(0, shorter, lc, 0, shorter) == 0);
    if (d <= std::max<std::size_t>(1, shorter / 3) || prefix) scored.emplace_back(prefix ? 0 : d, c);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (const auto& [d, c] : scored)
    if (out.size() < 3) out.push_back(c);
  return out;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const auto close = close_matches(word, candidates);
  if (close.empty()) return "";
  std::string s = "did you mean ";
  for (std::size_t i = 0; i < close.size(); ++i)
    s += (i == 0 ? "" : i + 1 == close.size() ? " or " : ", ") + close[i];
  return s + "?";
}

ParamSpec ParamSpec::integer(std::string name, long long def, long long lo, long long hi, std::string help) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = Type::Integer;
  p.default_value = std::to_string(def);
  p.min = double(lo);
  p.max = double(hi);
  p.int_min = lo;
  p.int_max = hi;
  p.help = std::move(help);
  return p;
}

ParamSpec ParamSpec::real(std::string name, double def, double lo, double hi, std::string help) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = Type::Real;
  p.default_value = fmt::format("{}", def);
  p.min = lo;
  p.max = hi;
  p.help = std::move(help);
  return p;
}

ParamSpec ParamSpec::boolean(std::string name, bool def, std::string help) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = Type::Boolean;
  p.default_value = def ? "true" : "false";
  p.help = std::move(help);
  return p;
}

ParamSpec ParamSpec::choice(std::string name, std::vector<std::string> choices, std::string help) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = Type::Choice;
  p.default_value = choices.at(0);
  p.choices = std::move(choices);
  p.help = std::move(help);
  return p;
}

ParamSpec ParamSpec::path(std::string name, std::vector<std::string> keywords, std::string suffix,
                          std::string help) {
  ParamSpec p = choice(std::move(name), std::move(keywords), std::move(help));
  p.type = Type::Path;
  p.suffix = std::move(suffix);
  return p;
}

bool ParamSpec::accepts_path(const std::string& value) const {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return true;
  return value.size() > suffix.size() && value.compare(value.size() - suffix.size(), suffix.size(), suffix) == 0 &&
         value.find(',') == std::string::npos && trim(value) == value;
}

ParamSpec ParamSpec::seed() {
  return integer("seed", 0, 0, std::numeric_limits<std::int64_t>::max(), "random seed");
}

std::string detail::format_real(double v) { return fmt::format("{}", v); }

void detail::throw_bad_value(const char* method, const std::string& value, const ParamSpec& p) {
  throw Error(fmt::format("{}: bad value '{}' for '{}', expected {}", method, value, p.name, p.describe_type()));
}

ParamSpec detail::integer_spec(const char* name, long long def, long long lo, long long hi, const char* help) {
  return ParamSpec::integer(name, def, lo, hi, help);
}
ParamSpec detail::real_spec(const char* name, double def, double lo, double hi, const char* help) {
  return ParamSpec::real(name, def, lo, hi, help);
}
ParamSpec detail::boolean_spec(const char* name, bool def, const char* help) {
  return ParamSpec::boolean(name, def, help);
}
ParamSpec detail::choice_spec(const char* name, std::vector<std::string> names, std::string def, const char* help) {
  ParamSpec p = ParamSpec::choice(name, std::move(names), help);
  p.default_value = std::move(def);
  return p;
}

ParamSpec detail::path_spec(const char* name, std::vector<std::string> keywords, const char* suffix, std::string def,
                            const char* help) {
  ParamSpec p = ParamSpec::path(name, std::move(keywords), suffix, help);
  p.default_value = std::move(def);
  return p;
}

Params detail::make_params(std::vector<std::pair<std::string, std::string>> values) {
  Params p;
  p.values_ = std::move(values);
  return p;
}

std::string ParamSpec::describe_type() const {
  switch (type) {
    case Type::Integer: return fmt::format("integer in [{}, {}]", int_min, int_max);  // exact, never 9.2e+18
    case Type::Real: return fmt::format("number in [{}, {}]", fmt_number(min), fmt_number(max));
    case Type::Boolean: return "true|false";
    case Type::Choice: return fmt::format("one of {}", fmt::join(choices, "|"));
    case Type::Path: return fmt::format("{} or the path of a {} file", fmt::join(choices, "|"), suffix);
  }
  return "";
}

Spec parse_spec(const std::string& text) {
  const std::string t = trim(text);
  Spec spec;
  const auto colon = t.find(':');
  spec.name = trim(t.substr(0, colon));
  if (!is_word(spec.name))
    throw Error(fmt::format("bad method spec '{}': expected name[:key=value[,key=value]...]", text));
  if (colon == std::string::npos) return spec;
  const std::string rest = t.substr(colon + 1);
  if (trim(rest).empty()) throw Error(fmt::format("bad method spec '{}': nothing after ':'", text));
  std::size_t start = 0;
  while (start <= rest.size()) {
    auto comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    const std::string item = rest.substr(start, comma - start);
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw Error(fmt::format("bad method spec '{}': '{}' is not key=value", text, trim(item)));
    std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (!is_word(key)) throw Error(fmt::format("bad method spec '{}': bad key '{}'", text, key));
    if (value.empty()) throw Error(fmt::format("bad method spec '{}': no value for '{}'", text, key));
    for (const auto& kv : spec.values)
      if (kv.first == key) throw Error(fmt::format("bad method spec '{}': '{}' given twice", text, key));
    spec.values.emplace_back(std::move(key), std::move(value));
    start = comma + 1;
  }
  return spec;
}

Params resolve_params(const std::string& method, const std::vector<ParamSpec>& params, const Spec& spec) {
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  for (const auto& kv : spec.values) {
    if (std::find(names.begin(), names.end(), kv.first) == names.end()) {
      if (names.empty())
        throw Error(fmt::format("method '{}' takes no parameters, got '{}'", method, kv.first));
      const std::string hint = did_you_mean(kv.first, names);
      throw Error(fmt::format("method '{}' has no parameter '{}'; {}valid: {}", method, kv.first,
                              hint.empty() ? "" : hint + " ", fmt::join(names, ", ")));
    }
  }
  Params out;
  for (const auto& p : params) {
    std::string value = p.default_value;
    for (const auto& kv : spec.values)
      if (kv.first == p.name) value = kv.second;
    const auto bad = [&]() {
      return Error(fmt::format("{}: bad value '{}' for '{}', expected {}", method, value, p.name,
                               p.describe_type()));
    };
    switch (p.type) {
      case ParamSpec::Type::Integer: {
        long long v;
        if (!parse_ll(value, v) || v < p.int_min || v > p.int_max) throw bad();
        value = std::to_string(v);
        break;
      }
      case ParamSpec::Type::Real: {
        double v;
        if (!parse_double(value, v) || v < p.min || v > p.max) throw bad();
        value = detail::format_real(v);  // one spelling of a number, as a typed method writes it
        break;
      }
      case ParamSpec::Type::Boolean: {
        bool v;
        if (!parse_bool(value, v)) throw bad();
        value = v ? "true" : "false";
        break;
      }
      case ParamSpec::Type::Choice:
        if (std::find(p.choices.begin(), p.choices.end(), value) == p.choices.end()) throw bad();
        break;
      case ParamSpec::Type::Path:
        if (!p.accepts_path(value)) throw bad();
        break;
    }
    out.values_.emplace_back(p.name, value);
  }
  return out;
}

const std::string& Params::raw(const std::string& name) const {
  for (const auto& kv : values_)
    if (kv.first == name) return kv.second;
  throw Error(fmt::format("internal: no parameter '{}'", name));
}

bool Params::has(const std::string& name) const {
  return std::any_of(values_.begin(), values_.end(), [&](const auto& kv) { return kv.first == name; });
}
long long Params::integer(const std::string& name) const { return std::stoll(raw(name)); }
double Params::real(const std::string& name) const { return std::stod(raw(name)); }
bool Params::boolean(const std::string& name) const { return raw(name) == "true"; }
const std::string& Params::choice(const std::string& name) const { return raw(name); }
const std::string& Params::text(const std::string& name) const { return raw(name); }

std::string Params::to_string() const {
  std::string s;
  for (const auto& kv : values_) {
    if (!s.empty()) s += ',';
    s += kv.first + '=' + kv.second;
  }
  return s;
}

}  // namespace attnlab
