// Method specifications as short strings, `name[:key=value[,key=value]...]` (the faiss factory idea):
// `exact`, `nystrom:landmarks=64,iters=6`. Parsing checks the syntax; resolving against a method's
// parameter list checks names, types, ranges and choices and fills in defaults.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

/// A limit of an integer parameter in the problem's size (a budget that counts items taken from the sequence:
/// landmarks, rank, columns, codes, Linformer's k cannot exceed it), declared with the parameter
/// (`p.integer("k", ...).within_keys()`) and checked, with its one message, before any work (check_method_fits) and
/// by compute() on its inputs: "METHOD: PARAM = VALUE exceeds the sequence (WHAT = N); give PARAM ≤ N".
struct SizeLimit {
  enum class Bound { Keys, Queries, MinN };  // n_k, n_q, min(n_q, n_k)
  Bound bound = Bound::Keys;
  std::string what;  // how the message names the bound ("n_k", "min(n_q, n_k)", "n_k, the keys")
  /// The limit applies only where each named parameter holds this value (vq: codebook=window).
  std::vector<std::pair<std::string, std::string>> when;
};

/// A budget family of the studies (error_vs_budget, gradients, `attnlab report`, the drop-in and fine-tuning tools,
/// through analysis/budget_families.hpp): the method at a grid of its budget parameter, under fixed options, declared
/// with that parameter: `p.integer("landmarks", ...).budget(Study("nystrom", {8, 16, 32, 64, 128}).simplicity(3)
/// .listed(1))`.
struct Study {
  std::string label;                // the family's name in every CSV and figure
  std::string fixed;                // options fixed in its spec ("pinv=svd"); "" for none
  std::vector<long long> budgets;   // the grid, in sweep order
  /// How much machinery the family adds to attention (lower: simpler; the report's tie-break among equally fast
  /// and accurate points): a fixed pattern, then one feature map, then landmark/projection methods, then
  /// data-dependent hashing, selection and clustering, then combinations. Undeclared: last (the analysis baselines).
  int rank = kLast;
  int position = 0;                 // place in the families' listing: the CSVs' order, the figures' colours
  bool deployable = true;           // false: an analysis baseline (forms or sweeps all of P)
  bool measure_cost = true;         // false: not timed (the SVD floor, a reference rather than a method to run)
  static constexpr int kLast = 1 << 20;

  Study(std::string label_, std::vector<long long> budgets_)
      : label(std::move(label_)), budgets(std::move(budgets_)) {}
  /// Options fixed in the family's spec: Study("nystrom_svd", ...).with("pinv=svd").
  Study with(std::string options) && {
    fixed = std::move(options);
    return std::move(*this);
  }
  Study simplicity(int r) && {
    rank = r;
    return std::move(*this);
  }
  Study listed(int p) && {
    position = p;
    return std::move(*this);
  }
  /// An analysis baseline, not a method one would deploy (the report and the drop-in tools leave it out by default).
  Study baseline() && {
    deployable = false;
    return std::move(*this);
  }
  /// Not timed by error_vs_budget (nor drawn on the error-against-cost figure).
  Study untimed() && {
    measure_cost = false;
    return std::move(*this);
  }
};

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
  std::vector<Study> studies;        // the budget parameter's families in the studies
  std::vector<SizeLimit> limits;     // Integer: its limits in the problem's size

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
