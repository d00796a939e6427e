// The registry: an explicit list of method descriptors (no static self-registration, which a static library's linker
// may silently drop) — registered_methods(), defined with the methods (lib/src/methods/all.cpp, from
// attnlab/methods/all.hpp's RegisteredMethodOptions, in its order) — and the factory from spec strings, which reads
// a spec's values into the method's options struct and calls its typed class's constructor.
#include "attnlab/core/registry.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace attnlab {

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
  for (const ParamSpec& p : params) {
    if (!p.limits.empty() && p.type != ParamSpec::Type::Integer)
      throw Error(fmt::format("{}: parameter {} declares a size limit but is not an integer", d.name, p.name));
    if (p.is_budget) {
      if (!d.budget.empty())
        throw Error(fmt::format("{}: two budget parameters, {} and {}", d.name, d.budget, p.name));
      d.budget = p.name;
    }
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
  std::vector<std::string> names;
  for (const auto& d : registered_methods()) names.push_back(d.name);
  const std::string hint = did_you_mean(name, names);
  if (!hint.empty()) throw Error(fmt::format("no method '{}'; {}", name, hint));
  throw Error(fmt::format("no method '{}'; registered methods: {}", name, registered_method_names()));
}

template <typename T>
void check_method_fits(const Method<T>& m, const ProblemSize& size) {
  ProblemSize s = size;
  s.elem = sizeof(T);
  const MethodDescriptor& d = find_method(m.name());
  check_limits(d, m.params(), s.n_q, s.n_k);
  m.check_size(s);
  check_memory(m.memory_estimate(s),
               "{} on n_q = {}, n_k = {}, d = {}, d_v = {} ({})", m.spec(), s.n_q, s.n_k, s.d, s.d_v,
               dtype_name(dtype_of<T>()));
}

template void check_method_fits<float>(const Method<float>&, const ProblemSize&);
template void check_method_fits<double>(const Method<double>&, const ProblemSize&);

void check_storage(const MethodDescriptor& d, Storage storage, Policy policy) {
  if (storage == Storage::native) return;
  require(policy == Policy::eager ? d.storage.eager : d.storage.careful,
          "method '{}' does not emulate {} storage under the {} policy ({})", d.name, storage_name(storage),
          policy_name(policy), d.storage.note);
}

void check_limits(const MethodDescriptor& d, const Params& params, Index n_q, Index n_k) {
  for (const ParamSpec& p : d.params)
    for (const SizeLimit& l : p.limits) {
      if (!std::all_of(l.when.begin(), l.when.end(), [&](const auto& c) { return params.text(c.first) == c.second; }))
        continue;
      const Index n = l.bound == SizeLimit::Bound::Keys      ? n_k
                      : l.bound == SizeLimit::Bound::Queries ? n_q
                                                             : std::min(n_q, n_k);
      const long long value = params.integer(p.name);
      require(value <= n, "{}: {} = {} exceeds the sequence ({} = {}); give {} ≤ {}", d.name, p.name, value,
              l.what, n, p.name, n);
    }
}

std::string short_spec(const MethodDescriptor& d, const Params& params, std::optional<std::uint64_t> default_seed) {
  std::string s = d.name;
  char sep = ':';
  for (const auto& [key, value] : params.values()) {
    const auto p = std::find_if(d.params.begin(), d.params.end(), [&](const ParamSpec& x) { return x.name == key; });
    if (p == d.params.end()) continue;
    if (key == "seed" && default_seed && value == std::to_string(*default_seed)) continue;
    if (value == p->default_value && !(key == "seed" && default_seed)) continue;
    s += sep + key + "=" + value;
    sep = ',';
  }
  return s;
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
  if constexpr (std::is_same_v<T, float>) return d.make_f32(params);
  else return d.make_f64(params);
}

template std::unique_ptr<Method<float>> make_method<float>(const std::string&, std::optional<std::uint64_t>);
template std::unique_ptr<Method<double>> make_method<double>(const std::string&, std::optional<std::uint64_t>);

}  // namespace attnlab
