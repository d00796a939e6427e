// The method registry and factory: every method is built from a short spec string,
// `name[:key=value,...]`. Unknown names and keys, bad values and unsupported options are refused with a
// message listing what is valid.
#pragma once

#include "attnlab/core/method.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/spec.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace attnlab {

struct Backward;

/// Whether a method emulates a reduced storage precision (core/precision.hpp) under each policy, and which of its
/// intermediates each policy stores in the format (`attnlab methods`' "precision" line; the method's header says the
/// same). A method that declares none refuses bf16 and fp16 with the note.
struct StorageEmulation {
  bool eager = false, careful = false;
  std::string note = "refused: not emulated yet";
  /// Whether Method::backward is emulated too, and which of its intermediates each policy stores.
  bool backward = false;
  std::string backward_note = "refused: the backward pass is not emulated yet";
  static StorageEmulation both(const std::string& note) { return {true, true, note}; }
  static StorageEmulation careful_only(const std::string& note) { return {false, true, note}; }
  StorageEmulation with_backward(const std::string& bnote) && {
    backward = true;
    backward_note = bnote;
    return std::move(*this);
  }
};

struct MethodDescriptor {
  std::string name;
  std::string summary;    // one line
  std::string reference;  // the equation / paper it implements
  bool causal = false;    // supports a causal mask
  std::string causal_note;  // how a causal mask is honoured, or why it is refused (the README's table)
  std::string budget;       // the parameter that trades accuracy for cost (landmarks, features, ...); "" if none
  /// Whether Method::backward is defined and what it holds fixed ("yes: …"), or why it is refused ("refused: …"):
  /// the README's "backward" column.
  bool backward = false;
  std::string backward_note = "refused: not defined";
  std::vector<ParamSpec> params;
  /// This descriptor with its backward pass declared: `.with_backward(Backward::yes("ω held fixed"))`.
  MethodDescriptor with_backward(const Backward& b) &&;
  /// Its reduced-precision emulation: `.with_storage(StorageEmulation::both("eager: ...; careful: ..."))`.
  StorageEmulation storage;
  MethodDescriptor with_storage(StorageEmulation s) && {
    storage = std::move(s);
    return std::move(*this);
  }
  /// The string factory: the method from a spec's validated values (its options struct read from them). What a method
  /// forms in memory and the checks in a problem's size other than the declared limits are the options struct's
  /// (MethodOptions::memory, ::check_size), read through the built method (Method::memory_estimate, ::check_size).
  std::function<std::unique_ptr<Method<float>>(const Params&)> make_f32;
  std::function<std::unique_ptr<Method<double>>(const Params&)> make_f64;
};

/// Every registered method, in a fixed order (attnlab/methods/all.hpp's list; defined in lib/src/methods/all.cpp).
const std::vector<MethodDescriptor>& registered_methods();
/// The names, joined by ", " (for messages).
std::string registered_method_names();
/// Looks a method up by name; throws Error "no method 'X'; did you mean y?" (the close names, spec.hpp's
/// close_matches), or listing every registered name when none is close.
const MethodDescriptor& find_method(const std::string& name);

/// Before any work: throws Error when the method cannot run on a problem of `size` — a parameter beyond the
/// sequence (its declared limits and its options' size check, as compute() would say later), or more memory
/// than the guard allows (memory.hpp: available memory or --max-memory; the message names the method, the sizes and
/// the bytes).
template <typename T>
void check_method_fits(const Method<T>& m, const ProblemSize& size);

/// Throws Error "method 'X' does not emulate bf16 storage under the eager policy (NOTE)" when the method does not
/// declare that emulation (MethodDescriptor::storage); native storage always passes. compute() checks it, and the
/// module and the command before any data is read.
void check_storage(const MethodDescriptor& d, Storage storage, Policy policy);

/// The parameters' declared limits in the problem's size (ParamSpec::limits: `p.integer("k", ...).within_keys()`), on
/// n_q queries and n_k keys: throws Error "METHOD: PARAM = VALUE exceeds the sequence (WHAT = N); give PARAM ≤ N",
/// the one message of every limit, whether checked before any work (check_method_fits) or by compute(). Budgets that
/// bound a neighbourhood (a window, a chunk) or a share (ProbSparse's factor) saturate at the whole sequence — exact
/// attention — and random features (Performer) may outnumber the positions: they declare no limit.
void check_limits(const MethodDescriptor& d, const Params& params, Index n_q, Index n_k);

/// The spec as a user would write it: the name and the parameters that differ from their defaults, the seed left out
/// when it is `default_seed` ("nystrom:landmarks=32" for nystrom:landmarks=32,pinv=iterative,iters=6,...).
std::string short_spec(const MethodDescriptor& d, const Params& params,
                       std::optional<std::uint64_t> default_seed = std::nullopt);

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

/// Whether a method defines a backward pass, and what it holds fixed — or why it refuses (the README's "backward"
/// column). The conventions: random parameters and piecewise-constant choices are held at their fitted values.
struct Backward {
  bool supported = false;
  std::string note;
  /// Defined: "yes", or "yes: WHAT IS HELD FIXED".
  static Backward yes(const std::string& held = "") { return {true, held.empty() ? "yes" : "yes: " + held}; }
  /// Refused: "refused: WHY".
  static Backward refused(const std::string& why) { return {false, "refused: " + why}; }
};

inline MethodDescriptor MethodDescriptor::with_backward(const Backward& b) && {
  backward = b.supported;
  backward_note = b.note;
  return std::move(*this);
}

/// The parameters of `a`, then those of `b` (a family's shared parameters after a method's own).
std::vector<ParamSpec> join_params(std::vector<ParamSpec> a, const std::vector<ParamSpec>& b);

namespace detail {
MethodDescriptor describe(std::string name, std::string summary, std::string reference, Causal causal,
                          std::vector<ParamSpec> params);
}  // namespace detail

/// The descriptor of the method class template M, built from its options struct O (M<T>(const O&)): its name
/// (O::kName) and parameters (O's declaration, core/parameters.hpp), a one-line summary, the paper and equations it
/// implements, and its causal support. Each method's `NameOptions::registry_entry()` is one such call; the
/// string factory reads a spec's values into O and calls M's constructor.
template <template <typename> class M, typename O>
MethodDescriptor describe(std::string summary, std::string reference, Causal causal) {
  MethodDescriptor d = detail::describe(O::kName, std::move(summary), std::move(reference), std::move(causal),
                                        O::parameter_specs());
  d.make_f32 = [](const Params& p) -> std::unique_ptr<Method<float>> {
    return std::make_unique<M<float>>(O::from(p));
  };
  d.make_f64 = [](const Params& p) -> std::unique_ptr<Method<double>> {
    return std::make_unique<M<double>>(O::from(p));
  };
  return d;
}

}  // namespace attnlab
