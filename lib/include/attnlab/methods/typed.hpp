// Typed access to a registered method: `Nystrom<double> m(opts)` with a plain options struct
// (attnlab/methods/nystrom.hpp, ...) instead of a spec string. The spec parser fills the same structs
// (Options::from(params)), and a struct writes its spec back (Options::spec()), so the two ways build the same
// method: TypedMethod<T, Options> is a Method<T> (compute/info/output/op/matrix) that owns the registered
// implementation built from options.spec() and forwards to it.
#pragma once

#include "attnlab/method.hpp"
#include "attnlab/registry.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
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

namespace attnlab::detail {

/// Reads a validated parameter into an options field: integers, seeds, reals, booleans and choices.
struct ReadField {
  const Params& p;
  void operator()(const char* name, Index& v) const { v = Index(p.integer(name)); }
  void operator()(const char* name, std::uint64_t& v) const { v = std::uint64_t(p.integer(name)); }
  void operator()(const char* name, double& v) const { v = p.real(name); }
  void operator()(const char* name, bool& v) const { v = p.boolean(name); }
  void operator()(const char* name, std::string& v) const { v = p.choice(name); }
};

/// Writes an options field as `name=value` the way the spec parser reads it back.
struct WriteField {
  std::string& s;
  template <typename V>
  void operator()(const char* name, const V& v) const {
    s += s.find(':') == std::string::npos ? ':' : ',';
    s += name;
    s += '=';
    if constexpr (std::is_same_v<V, bool>) s += v ? "true" : "false";
    else if constexpr (std::is_same_v<V, std::string>) s += v;
    else s += fmt::format("{}", v);
  }
};

}  // namespace attnlab::detail

/// Inside an options struct, after its fields: ATTNLAB_OPTIONS(NameOptions, param, param, ...) names every parameter
/// once, in the descriptor's order (as nlohmann::json's NLOHMANN_DEFINE_TYPE_INTRUSIVE names a type's fields), and
/// from that one list defines fields(o, f) (f("param", o.param) for each), from() (what the spec parser's validated
/// parameters hold) and spec() (the struct written back as a spec, every parameter given); it declares descriptor()
/// (the method's entry in the registry: name, parameters, causal support, factories), defined in the method's .cpp.
/// ATTNLAB_OPTIONS_NONE(NameOptions): the same for a method without parameters.
#define ATTNLAB_OPTIONS(Options, ...)                           \
  template <typename O, typename F>                             \
  static void fields(O& o, F&& f) {                             \
    ATTNLAB_FOR_EACH(ATTNLAB_OPTIONS_FIELD, __VA_ARGS__)        \
  }                                                             \
  ATTNLAB_OPTIONS_IO(Options)
#define ATTNLAB_OPTIONS_NONE(Options)   \
  template <typename O, typename F>     \
  static void fields(O&, F&&) {}        \
  ATTNLAB_OPTIONS_IO(Options)

#define ATTNLAB_OPTIONS_IO(Options)                  \
  static Options from(const Params& p) {             \
    Options o;                                       \
    fields(o, ::attnlab::detail::ReadField{p});      \
    return o;                                        \
  }                                                  \
  std::string spec() const {                         \
    std::string s = kName;                           \
    fields(*this, ::attnlab::detail::WriteField{s}); \
    return s;                                        \
  }                                                  \
  static MethodDescriptor descriptor();
#define ATTNLAB_OPTIONS_FIELD(x) f(#x, o.x);
// ATTNLAB_FOR_EACH(m, a, b, ...) → m(a) m(b) ... for up to 8 arguments.
#define ATTNLAB_FE_1(m, x) m(x)
#define ATTNLAB_FE_2(m, x, ...) m(x) ATTNLAB_FE_1(m, __VA_ARGS__)
#define ATTNLAB_FE_3(m, x, ...) m(x) ATTNLAB_FE_2(m, __VA_ARGS__)
#define ATTNLAB_FE_4(m, x, ...) m(x) ATTNLAB_FE_3(m, __VA_ARGS__)
#define ATTNLAB_FE_5(m, x, ...) m(x) ATTNLAB_FE_4(m, __VA_ARGS__)
#define ATTNLAB_FE_6(m, x, ...) m(x) ATTNLAB_FE_5(m, __VA_ARGS__)
#define ATTNLAB_FE_7(m, x, ...) m(x) ATTNLAB_FE_6(m, __VA_ARGS__)
#define ATTNLAB_FE_8(m, x, ...) m(x) ATTNLAB_FE_7(m, __VA_ARGS__)
#define ATTNLAB_FE_PICK(_1, _2, _3, _4, _5, _6, _7, _8, N, ...) ATTNLAB_FE_##N
#define ATTNLAB_FOR_EACH(m, ...) ATTNLAB_FE_PICK(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)(m, __VA_ARGS__)

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
