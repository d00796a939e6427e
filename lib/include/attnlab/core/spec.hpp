// Method specifications as short strings, `name[:key=value[,key=value]...]` (the faiss factory idea):
// `exact`, `nystrom:landmarks=64,iters=6`. Parsing checks the syntax; resolving against a method's
// parameter list checks names, types, ranges and choices and fills in defaults.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

/// One parameter a method accepts.
struct ParamSpec {
  /// Path: one of a few keywords (`choices`, the first the default) or the path of a file whose name ends in
  /// `suffix` (vq's codebook=window|PATH.npy); the file itself is read by the method, not by the spec.
  enum class Type { Integer, Real, Boolean, Choice, Path };
  std::string name;
  Type type = Type::Integer;
  std::string default_value;
  std::string help;
  std::vector<std::string> choices;  // Choice; Path: its keywords
  std::string suffix;                // Path: how a file's name ends (".npy")
  double min = 0;                    // Integer and Real: inclusive range
  double max = 0;
  long long int_min = 0;             // Integer: the same range, exactly (a double rounds 2⁶³ − 1)
  long long int_max = 0;
  bool is_budget = false;            // the parameter that trades accuracy for cost (MethodDescriptor::budget)

  static ParamSpec integer(std::string name, long long def, long long lo, long long hi, std::string help);
  static ParamSpec real(std::string name, double def, double lo, double hi, std::string help);
  static ParamSpec boolean(std::string name, bool def, std::string help);
  static ParamSpec choice(std::string name, std::vector<std::string> choices, std::string help);
  /// A keyword (the first is the default) or the path of a file ending in `suffix`.
  static ParamSpec path(std::string name, std::vector<std::string> keywords, std::string suffix, std::string help);
  /// Whether `value` is a valid value of this Path parameter: a keyword, or a name ending in the suffix that a spec
  /// can hold (no ',', no surrounding spaces).
  bool accepts_path(const std::string& value) const;
  /// `seed`: the random seed every randomized method takes (default 0).
  static ParamSpec seed();
  /// This parameter marked as the method's budget: ParamSpec::integer("landmarks", ...).budget().
  ParamSpec budget() const {
    ParamSpec p = *this;
    p.is_budget = true;
    return p;
  }
  /// "integer in [1, 4096]", "one of elu|relu", "window or the path of a .npy file", ...
  std::string describe_type() const;
};

/// The candidates a mistyped `word` probably meant: the same word in another case, a near miss (edit distance up to a
/// third of its letters), or a name it extends or shortens ("nystromformer" → nystrom); best first, at most 3.
std::vector<std::string> close_matches(const std::string& word, const std::vector<std::string>& candidates);
/// "did you mean a?" / "did you mean a or b?" from close_matches(), or "" when nothing is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

/// A parsed, not yet validated specification.
struct Spec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> values;
};

/// Parses `name[:key=value[,key=value]...]`; throws Error on bad syntax or a repeated key.
Spec parse_spec(const std::string& text);

class Params;
namespace detail {
Params make_params(std::vector<std::pair<std::string, std::string>> values);
}  // namespace detail

/// Every parameter of a method with its (validated) value, in the method's declared order.
class Params {
 public:
  Params() = default;
  long long integer(const std::string& name) const;
  double real(const std::string& name) const;
  bool boolean(const std::string& name) const;
  const std::string& choice(const std::string& name) const;
  /// A Path parameter's value: its keyword or the file's path as the spec wrote it.
  const std::string& text(const std::string& name) const;
  bool has(const std::string& name) const;
  /// "key=value,key=value" with every parameter, defaults included.
  std::string to_string() const;
  const std::vector<std::pair<std::string, std::string>>& values() const { return values_; }

 private:
  friend Params resolve_params(const std::string&, const std::vector<ParamSpec>&, const Spec&);
  friend Params detail::make_params(std::vector<std::pair<std::string, std::string>> values);
  const std::string& raw(const std::string& name) const;
  std::vector<std::pair<std::string, std::string>> values_;
};

/// Validates spec's values against the declared parameters of method `method` and fills in defaults.
/// Errors list what is valid: the parameter names, or the expected type and range.
Params resolve_params(const std::string& method, const std::vector<ParamSpec>& params, const Spec& spec);

}  // namespace attnlab
