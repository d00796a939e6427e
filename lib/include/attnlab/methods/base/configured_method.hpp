// The typed class of a method over its options struct, declared once: every method's public class is
//   template <typename T> class NystromMethod final : public ConfiguredMethod<NystromOptions, LowRankMethod<T>> {
//    public:
//     using ConfiguredMethod<NystromOptions, LowRankMethod<T>>::ConfiguredMethod;
//    private:
//     ...its overrides...
//   };
// The overrides are private (the class is final): users call the base's public compute(), output(), backward(),
// which check the inputs and then dispatch to them.
// so that `NystromMethod<double> m(o);`, `NystromMethod<double> m;` (the defaults) and `m.settings()` come from here:
// the base of the method's family (Method<T>, LowRankMethod<T>, PatternMethod<T>, KernelMethod<T>, ...) is built from
// the registry's descriptor (Options::descriptor()), the options are checked against their ranges and kept — the one
// copy of the parameters: params() and spec() are written from it, and the facts the options struct declares about a
// problem's size (memory(), check_size()) are read from it typed. The string factory reads a spec into the same
// options (core/registry.hpp's describe<M, O>).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"

#include <type_traits>

namespace attnlab {

struct CausalFormOptions;  // methods/base/kernel_method.hpp

template <typename Options, typename Base>
class ConfiguredMethod : public Base {
 public:
  /// Throws Error when an option is out of range (the message names it and what is valid).
  explicit ConfiguredMethod(const Options& options = {})
      : ConfiguredMethod(options, std::is_base_of<CausalFormOptions, Options>{}) {}
  /// The options the method was built with (its params() are the same values as a spec).
  const Options& settings() const { return o_; }
  Params params() const final { return o_.params(); }
  std::uint64_t memory_estimate(const ProblemSize& size) const final { return o_.memory(size); }
  void check_size(const ProblemSize& size) const final { o_.check_size(size); }

 protected:
  const Options o_;

 private:
  /// Options::params() checks every value against its range, with the spec parser's message.
  static const Options& checked(const Options& options) {
    (void)options.params();
    return options;
  }
  ConfiguredMethod(const Options& options, std::false_type)
      : Base(Options::descriptor()), o_(checked(options)) {}
  /// The kernel methods' base also takes the causal form (the CausalFormOptions their options struct inherits).
  ConfiguredMethod(const Options& options, std::true_type)
      : Base(Options::descriptor(), options), o_(checked(options)) {}
};

}  // namespace attnlab
