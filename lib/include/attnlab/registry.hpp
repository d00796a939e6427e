// The method registry and factory: every method is built from a short spec string,
// `name[:key=value,...]`. Unknown names and keys, bad values and unsupported options are refused with a
// message listing what is valid.
#pragma once

#include "attnlab/method.hpp"
#include "attnlab/spec.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace attnlab {

struct MethodDescriptor {
  std::string name;
  std::string summary;    // one line
  std::string reference;  // the equation / paper it implements
  bool causal = false;    // supports a causal mask
  std::string causal_note;  // how a causal mask is honoured, or why it is refused (the README's table)
  std::string budget;       // the parameter that trades accuracy for cost (landmarks, features, ...); "" if none
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<Method<float>>(const MethodDescriptor&, Params)> make_f32;
  std::function<std::unique_ptr<Method<double>>(const MethodDescriptor&, Params)> make_f64;
};

/// Every registered method, in a fixed order.
const std::vector<MethodDescriptor>& registered_methods();
/// The names, joined by ", " (for messages).
std::string registered_method_names();
/// Looks a method up by name; throws Error listing the valid names.
const MethodDescriptor& find_method(const std::string& name);

/// Builds a method from its spec. When the method has a `seed` parameter that the spec leaves out,
/// default_seed (if given) is used in its place.
template <typename T>
std::unique_ptr<Method<T>> make_method(const std::string& spec,
                                       std::optional<std::uint64_t> default_seed = std::nullopt);

/// Whether a method honours a causal mask, and how — or why it refuses one (the README's "causal" column).
struct Causal {
  bool supported = false;
  std::string note;
  /// Honoured: "yes", or "yes: HOW".
  static Causal yes(const std::string& how = "") { return {true, how.empty() ? "yes" : "yes: " + how}; }
  /// Refused, "refused: WHY": the method mixes every position and would see the future.
  static Causal refused(const std::string& why) { return {false, "refused: " + why}; }
  /// Honoured under some parameter values only (the method narrows supports_causal()); the note says which.
  static Causal conditional(std::string note) { return {true, std::move(note)}; }
};

/// The parameters of `a`, then those of `b` (a family's shared parameters after a method's own).
std::vector<ParamSpec> join_params(std::vector<ParamSpec> a, const std::vector<ParamSpec>& b);

namespace detail {
MethodDescriptor describe(std::string name, std::string summary, std::string reference, Causal causal,
                          std::vector<ParamSpec> params);
}  // namespace detail

/// The descriptor of method template M, built as M<T>(descriptor, params): its name (the options struct's kName),
/// a one-line summary, the equations it implements, its causal support and its parameters in spec order, the budget
/// parameter marked (ParamSpec::budget()). Each method's `NameOptions::descriptor()` is one such call.
template <template <typename> class M>
MethodDescriptor describe(std::string name, std::string summary, std::string reference, Causal causal,
                          std::vector<ParamSpec> params = {}) {
  MethodDescriptor d = detail::describe(std::move(name), std::move(summary), std::move(reference), std::move(causal),
                                        std::move(params));
  d.make_f32 = [](const MethodDescriptor& desc, Params p) -> std::unique_ptr<Method<float>> {
    return std::make_unique<M<float>>(desc, std::move(p));
  };
  d.make_f64 = [](const MethodDescriptor& desc, Params p) -> std::unique_ptr<Method<double>> {
    return std::make_unique<M<double>>(desc, std::move(p));
  };
  return d;
}

}  // namespace attnlab
