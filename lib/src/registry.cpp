// The registry: an explicit list of method descriptors (no static self-registration, which a static
// library's linker may silently drop) — the methods of attnlab/methods/all.hpp in its order, through the list the
// build derives from it (method_list.hpp: ATTNLAB_METHODS(X) calls X(Name) per method) — and the factory from spec
// strings.
#include "attnlab/registry.hpp"

#include "attnlab/error.hpp"
#include "attnlab/methods/all.hpp"
#include "method_list.hpp"

#include <fmt/format.h>

namespace attnlab {

const std::vector<MethodDescriptor>& registered_methods() {
  static const std::vector<MethodDescriptor> all = [] {
    std::vector<MethodDescriptor> v;
#define ATTNLAB_REGISTER(Name) v.push_back(Name##Options::descriptor());
    ATTNLAB_METHODS(ATTNLAB_REGISTER)
#undef ATTNLAB_REGISTER
    return v;
  }();
  return all;
}

std::vector<ParamSpec> join_params(std::vector<ParamSpec> a, const std::vector<ParamSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

MethodDescriptor detail::describe(std::string name, std::string summary, std::string reference, Causal causal,
                                  std::vector<ParamSpec> params) {
  MethodDescriptor d;
  d.name = std::move(name);
  d.summary = std::move(summary);
  d.reference = std::move(reference);
  d.causal = causal.supported;
  d.causal_note = std::move(causal.note);
  for (const ParamSpec& p : params)
    if (p.is_budget) {
      if (!d.budget.empty())
        throw Error(fmt::format("{}: two budget parameters, {} and {}", d.name, d.budget, p.name));
      d.budget = p.name;
    }
  d.params = std::move(params);
  return d;
}

std::string registered_method_names() {
  std::string s;
  for (const auto& d : registered_methods()) s += (s.empty() ? "" : ", ") + d.name;
  return s;
}

const MethodDescriptor& find_method(const std::string& name) {
  for (const auto& d : registered_methods())
    if (d.name == name) return d;
  throw Error(fmt::format("unknown method '{}'; registered methods: {}", name, registered_method_names()));
}

template <typename T>
std::unique_ptr<Method<T>> make_method(const std::string& spec_text, std::optional<std::uint64_t> default_seed) {
  Spec spec = parse_spec(spec_text);
  const MethodDescriptor& d = find_method(spec.name);
  if (default_seed) {
    bool has_seed_param = false, seed_given = false;
    for (const auto& p : d.params) has_seed_param |= p.name == "seed";
    for (const auto& kv : spec.values) seed_given |= kv.first == "seed";
    if (has_seed_param && !seed_given) spec.values.emplace_back("seed", std::to_string(*default_seed));
  }
  Params params = resolve_params(d.name, d.params, spec);
  if constexpr (std::is_same_v<T, float>) return d.make_f32(d, std::move(params));
  else return d.make_f64(d, std::move(params));
}

template std::unique_ptr<Method<float>> make_method<float>(const std::string&, std::optional<std::uint64_t>);
template std::unique_ptr<Method<double>> make_method<double>(const std::string&, std::optional<std::uint64_t>);

}  // namespace attnlab
