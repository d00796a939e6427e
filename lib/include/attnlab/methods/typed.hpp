// Typed access to a registered method: `Nystrom<double> m(opts)` with a plain options struct
// (attnlab/methods/nystrom.hpp, ...) instead of a spec string. The spec parser fills the same structs
// (Options::from(params)), and a struct writes its spec back (Options::spec()), so the two ways build the same
// method: TypedMethod<T, Options> is a Method<T> (compute/info/output/op/matrix) that owns the registered
// implementation built from options.spec() and forwards to it.
#pragma once

#include "attnlab/method.hpp"
#include "attnlab/registry.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

template <typename T, typename Options>
class TypedMethod final : public Method<T> {
 public:
  /// Throws Error when an option is out of range (the message names it and what is valid).
  explicit TypedMethod(const Options& options = {}) : TypedMethod(make_method<T>(options.spec())) {}

  /// The options this method runs with (defaults filled in, as validated by the registry).
  const Options& options() const { return options_; }

  bool supports_causal() const override { return impl_->supports_causal(); }
  std::string lookahead() const override { return impl_->lookahead(); }
  std::vector<std::pair<std::string, double>> diagnostics() const override { return impl_->diagnostics(); }
  Index rank_bound() const override { return impl_->rank_bound(); }

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    impl_->compute(q, k, opts);
    return impl_->info();
  }
  const AttentionOperator<T>& do_op() const override { return impl_->op(); }
  MatrixR<T> do_output(const ConstRef<T>& v) const override { return impl_->output(v); }
  MatrixR<T> do_matrix() const override { return impl_->matrix(); }

 private:
  explicit TypedMethod(std::unique_ptr<Method<T>> impl)
      : Method<T>(find_method(Options::kName), impl->params()),
        options_(Options::from(impl->params())),
        impl_(std::move(impl)) {}

  Options options_;
  std::unique_ptr<Method<T>> impl_;
};

}  // namespace attnlab

/// Inside an options struct: from() (what the spec parser's validated parameters hold), spec() (the struct written
/// back as a spec, every parameter given) and descriptor() (the method's entry in the registry: name, parameters,
/// causal support, factories), all three defined in the method's own .cpp.
#define ATTNLAB_OPTIONS_IO(Options)     \
  static Options from(const Params& p); \
  std::string spec() const;             \
  static MethodDescriptor descriptor();

/// After an options struct NameOptions: the typed class Name<T> and its two instantiations (compiled once, in the
/// method's .cpp by ATTNLAB_TYPED_METHOD_DEFINE).
#define ATTNLAB_TYPED_METHOD(Name)                                    \
  template <typename T>                                               \
  using Name = TypedMethod<T, Name##Options>;                         \
  extern template class TypedMethod<float, Name##Options>;            \
  extern template class TypedMethod<double, Name##Options>;

/// In the method's .cpp: the float and double instantiations of Name<T>.
#define ATTNLAB_TYPED_METHOD_DEFINE(Name)          \
  template class TypedMethod<float, Name##Options>; \
  template class TypedMethod<double, Name##Options>;
