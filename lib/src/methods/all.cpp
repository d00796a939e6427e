// The registry's list (core/registry.hpp's registered_methods()): every method of attnlab/methods/all.hpp's
// RegisteredMethodOptions, in its order. Defined here, with the methods, so that the registry in core/ holds the
// table and the lookups and includes no method.
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/all.hpp"

#include <tuple>

namespace attnlab {

const std::vector<MethodDescriptor>& registered_methods() {
  static const std::vector<MethodDescriptor> all = [] {
    std::vector<MethodDescriptor> v;
    std::apply([&v](auto... options) { (v.push_back(decltype(options)::descriptor()), ...); },
               RegisteredMethodOptions{});
    return v;
  }();
  return all;
}

}  // namespace attnlab
