// A method's parameters, declared once. An options struct holds them as typed members whose initializers are the
// defaults, and one static function names each of them — its spec name, the member, its range or choices (an enum
// with the names the spec uses; for a path, its keywords and the file's suffix), its help — in spec order:
//
//   struct NystromOptions : MethodOptions<NystromOptions> {
//     static constexpr const char* kName = "nystrom";
//     Index landmarks = 64;
//     template <class P> static void parameters(P& p) {
//       p.integer("landmarks", &NystromOptions::landmarks, 1, 1 << 20, "number of landmarks m (≤ n)")
//           .budget(Study("nystrom", {8, 16, 32, 64, 128}).simplicity(3).listed(1))
//           .within_min_n();
//     }
//   };
//
// The budget parameter carries the families the studies sweep it in (its grid, its simplicity rank, its place in the
// listing) and an integer its limits in the problem's size (within_keys, within_min_n, ...), each with one message.
// Everything else is derived from that one declaration by visiting it (as faiss's ParameterSpace or nlohmann's
// field lists, without a macro): the registry's parameter list (names, types, defaults, ranges, help; `attnlab
// methods`), reading a spec's validated values into the struct (the string factory), and writing the struct as a
// spec (a typed method's spec()), with the same range checks and messages either way.
#pragma once

#include "attnlab/core/error.hpp"
#include "attnlab/core/spec.hpp"
#include "attnlab/core/types.hpp"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace attnlab {

struct MethodDescriptor;  // core/registry.hpp

/// One value of a choice parameter: the enumerator and the name a spec writes for it.
template <typename E>
struct Choice {
  E value;
  const char* name;
};

namespace detail {

std::string format_real(double v);  // shortest round trip ("0.25", "1e-07"): how specs write numbers
[[noreturn]] void throw_bad_value(const char* method, const std::string& value, const ParamSpec& p);
ParamSpec integer_spec(const char* name, long long def, long long lo, long long hi, const char* help);
ParamSpec real_spec(const char* name, double def, double lo, double hi, const char* help);
ParamSpec boolean_spec(const char* name, bool def, const char* help);
ParamSpec choice_spec(const char* name, std::vector<std::string> names, std::string def, const char* help);
ParamSpec path_spec(const char* name, std::vector<std::string> keywords, const char* suffix, std::string def,
                    const char* help);

/// Visits an options struct's declaration in one of three ways.
template <typename O>
class ParameterVisitor {
 public:
  enum class Mode { Describe, Read, Write };

  /// Describe: the parameter list, defaults from a default-constructed O.
  explicit ParameterVisitor(std::vector<ParamSpec>* specs) : mode_(Mode::Describe), specs_(specs) {}
  /// Read: validated values into `out`.
  ParameterVisitor(const Params& in, O* out) : mode_(Mode::Read), in_(&in), out_(out) {}
  /// Write: `in` checked against its ranges and written as (name, value) pairs.
  ParameterVisitor(const O& in, std::vector<std::pair<std::string, std::string>>* values)
      : mode_(Mode::Write), obj_(&in), values_(values) {}

  template <typename I, typename C>
  ParameterVisitor& integer(const char* name, I C::*member, long long lo, long long hi, const char* help) {
    static_assert(std::is_integral_v<I> && std::is_base_of_v<C, O>);
    const auto m = static_cast<I O::*>(member);
    switch (mode_) {
      case Mode::Describe: add(integer_spec(name, static_cast<long long>(defaults_.*m), lo, hi, help)); break;
      case Mode::Read: out_->*m = static_cast<I>(in_->integer(name)); break;
      case Mode::Write: {
        const auto v = obj_->*m;
        bool ok;
        if constexpr (std::is_signed_v<I>) ok = static_cast<long long>(v) >= lo && static_cast<long long>(v) <= hi;
        else ok = hi >= 0 && static_cast<unsigned long long>(v) <= static_cast<unsigned long long>(hi) &&
                  (lo <= 0 || static_cast<unsigned long long>(v) >= static_cast<unsigned long long>(lo));
        if (!ok) throw_bad_value(O::kName, std::to_string(v), integer_spec(name, 0, lo, hi, help));
        values_->emplace_back(name, std::to_string(v));
        break;
      }
    }
    return *this;
  }
  /// `seed`: the random seed every randomized method takes (default: the member's initializer, 0).
  template <typename C>
  ParameterVisitor& seed(std::uint64_t C::*member) {
    return integer("seed", member, 0, std::numeric_limits<std::int64_t>::max(), "random seed");
  }
  template <typename C>
  ParameterVisitor& real(const char* name, double C::*member, double lo, double hi, const char* help) {
    static_assert(std::is_base_of_v<C, O>);
    const auto m = static_cast<double O::*>(member);
    switch (mode_) {
      case Mode::Describe: add(real_spec(name, defaults_.*m, lo, hi, help)); break;
      case Mode::Read: out_->*m = in_->real(name); break;
      case Mode::Write: {
        const double v = obj_->*m;
        if (!(v >= lo && v <= hi)) throw_bad_value(O::kName, format_real(v), real_spec(name, 0, lo, hi, help));
        values_->emplace_back(name, format_real(v));
        break;
      }
    }
    return *this;
  }
  template <typename C>
  ParameterVisitor& boolean(const char* name, bool C::*member, const char* help) {
    static_assert(std::is_base_of_v<C, O>);
    const auto m = static_cast<bool O::*>(member);
    switch (mode_) {
      case Mode::Describe: add(boolean_spec(name, defaults_.*m, help)); break;
      case Mode::Read: out_->*m = in_->boolean(name); break;
      case Mode::Write: values_->emplace_back(name, obj_->*m ? "true" : "false"); break;
    }
    return *this;
  }
  /// A choice among an enum's values, listed with their spec names (in the order `attnlab methods` shows them).
  template <typename E, typename C>
  ParameterVisitor& choice(const char* name, E C::*member, std::initializer_list<Choice<E>> choices,
                           const char* help) {
    static_assert(std::is_enum_v<E> && std::is_base_of_v<C, O>);
    const auto m = static_cast<E O::*>(member);
    const auto name_of = [&](E v) -> const char* {
      for (const auto& c : choices)
        if (c.value == v) return c.name;
      return nullptr;
    };
    switch (mode_) {
      case Mode::Describe: {
        std::vector<std::string> names;
        for (const auto& c : choices) names.emplace_back(c.name);
        add(choice_spec(name, std::move(names), name_of(defaults_.*m), help));
        break;
      }
      case Mode::Read: {
        const std::string& s = in_->choice(name);
        for (const auto& c : choices)
          if (s == c.name) out_->*m = c.value;
        break;
      }
      case Mode::Write: {
        const char* s = name_of(obj_->*m);
        if (!s) {
          std::vector<std::string> names;
          for (const auto& c : choices) names.emplace_back(c.name);
          throw_bad_value(O::kName, std::to_string(static_cast<long long>(obj_->*m)),
                          choice_spec(name, names, names.front(), help));
        }
        values_->emplace_back(name, s);
        break;
      }
    }
    return *this;
  }
  /// A keyword or the path of a file whose name ends in `suffix` (ParamSpec::path), held as the string the spec
  /// writes; the method reads the file.
  template <typename C>
  ParameterVisitor& path(const char* name, std::string C::*member, std::initializer_list<const char*> keywords,
                         const char* suffix, const char* help) {
    static_assert(std::is_base_of_v<C, O>);
    const auto m = static_cast<std::string O::*>(member);
    const auto spec = [&](std::string def) {
      return path_spec(name, std::vector<std::string>(keywords.begin(), keywords.end()), suffix, std::move(def), help);
    };
    switch (mode_) {
      case Mode::Describe: add(spec(defaults_.*m)); break;
      case Mode::Read: out_->*m = in_->text(name); break;
      case Mode::Write: {
        const ParamSpec p = spec(*keywords.begin());
        if (!p.accepts_path(obj_->*m)) throw_bad_value(O::kName, obj_->*m, p);
        values_->emplace_back(name, obj_->*m);
        break;
      }
    }
    return *this;
  }
  /// Marks the parameter just declared as the method's budget (MethodDescriptor::budget), with the families the
  /// studies sweep it in (core/spec.hpp's Study: label, grid, fixed options, simplicity rank, place in the listing).
  template <typename... S>
  ParameterVisitor& budget(S&&... studies) {
    if (mode_ == Mode::Describe) {
      specs_->back().is_budget = true;
      (specs_->back().studies.emplace_back(std::forward<S>(studies)), ...);
    }
    return *this;
  }
  /// The integer just declared counts items taken from the keys: at most n_k (SizeLimit, with its one message).
  ParameterVisitor& within_keys(const char* what = "n_k") { return within(SizeLimit::Bound::Keys, what); }
  /// ... from the queries: at most n_q.
  ParameterVisitor& within_queries(const char* what = "n_q") { return within(SizeLimit::Bound::Queries, what); }
  /// ... rows and columns of P: at most min(n_q, n_k).
  ParameterVisitor& within_min_n() { return within(SizeLimit::Bound::MinN, "min(n_q, n_k)"); }
  /// The limit just declared applies only where parameter `name` holds `value` (vq: codebook=window).
  ParameterVisitor& when(const char* name, const char* value) {
    if (mode_ == Mode::Describe) specs_->back().limits.back().when.emplace_back(name, value);
    return *this;
  }

 private:
  void add(ParamSpec p) { specs_->push_back(std::move(p)); }
  ParameterVisitor& within(SizeLimit::Bound b, const char* what) {
    if (mode_ == Mode::Describe) specs_->back().limits.push_back({b, what, {}});
    return *this;
  }
  Mode mode_;
  O defaults_{};
  std::vector<ParamSpec>* specs_ = nullptr;
  const Params* in_ = nullptr;
  O* out_ = nullptr;
  const O* obj_ = nullptr;
  std::vector<std::pair<std::string, std::string>>* values_ = nullptr;
};

Params make_params(std::vector<std::pair<std::string, std::string>> values);

}  // namespace detail

/// The base of every options struct O (CRTP): what O's one declaration, `template <class P> static void
/// parameters(P&)`, gives — the parameter list, the struct from a spec's values, the struct as a spec — and the
/// method's registry entry, kept once.
template <typename O>
struct MethodOptions {
  /// The method's descriptor (core/registry.hpp): O::registry_entry(), defined in the method's .cpp (its summary,
  /// the paper it implements, its causal support: describe<NameMethod, O>(...)), built on first use and kept, so
  /// that every instance and the registry refer to the same one.
  static const MethodDescriptor& descriptor() {
    static const auto d = O::registry_entry();
    return d;
  }
  /// The registry's parameter list: names, types, defaults (O's initializers), ranges, choices, help, in spec order.
  static std::vector<ParamSpec> parameter_specs() {
    std::vector<ParamSpec> specs;
    detail::ParameterVisitor<O> v(&specs);
    O::parameters(v);
    return specs;
  }
  /// The struct holding a spec's validated values (resolve_params against parameter_specs()).
  static O from(const Params& params) {
    O o;
    detail::ParameterVisitor<O> v(params, &o);
    O::parameters(v);
    return o;
  }
  /// Every parameter with its value; throws Error naming a value out of its range (as the spec parser would).
  Params params() const {
    std::vector<std::pair<std::string, std::string>> values;
    detail::ParameterVisitor<O> v(static_cast<const O&>(*this), &values);
    O::parameters(v);
    return detail::make_params(std::move(values));
  }
  /// Bytes the method forms on a problem of `size` beyond its inputs and its output: 0, for the methods linear in n.
  /// A method that can form something quadratic declares its own `std::uint64_t memory(const ProblemSize&) const`
  /// in O (exact:impl=materialized, svd, cur), which hides this one: the memory guard's estimate, before any work.
  std::uint64_t memory(const ProblemSize& /*size*/) const { return 0; }
  /// Checks in a problem's size beyond the parameters' declared limits (`within_keys()`, ...): none. O declares its
  /// own `void check_size(const ProblemSize&) const` where it has one (vq: a codebook file's dimension).
  void check_size(const ProblemSize& /*size*/) const {}
  /// The canonical spec, every parameter written out: "nystrom:landmarks=64,pinv=iterative,...".
  std::string spec() const {
    const std::string p = params().to_string();
    return p.empty() ? std::string(O::kName) : std::string(O::kName) + ":" + p;
  }
};

}  // namespace attnlab
