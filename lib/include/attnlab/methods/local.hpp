// `local` — sliding-window attention (Beltagy et al. 2020, Longformer §3.1, "sliding window"): each query attends to
// the keys |j − c_i| ≤ W around its aligned position c_i = i + (n_k − n_q) (with a causal mask, c_i − W ≤ j ≤ c_i),
// softmax over that band only: O(n·W·d).
// Backward: the softmax over each query's band (PatternMethod's pattern_backward, O(n·W·d)); nothing is random and
// the band does not depend on Q or K, so it is the exact gradient of this forward.
//   attnlab::LocalOptions o;  o.window = 64;
//   attnlab::LocalMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "local:window=64" builds the same class (make_method reads the spec into LocalOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/pattern_method.hpp"

namespace attnlab {

struct LocalOptions : MethodOptions<LocalOptions> {
  static constexpr const char* kName = "local";
  Index window = 64;

  template <class P>
  static void parameters(P& p) {
    p.integer("window", &LocalOptions::window, 0, 1 << 24, "half-width W of the band")
        .budget(Study("local", {4, 8, 16, 32, 64}).simplicity(0).listed(8));
  }
  /// The method's entry in the registry (lib/src/methods/local.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class LocalMethod final : public ConfiguredMethod<LocalOptions, PatternMethod<T>> {
 public:
  using ConfiguredMethod<LocalOptions, PatternMethod<T>>::ConfiguredMethod;

 private:
  /// The blocked kernel: blocks of 64 queries against the keys their bands span, one GEMM each (never P̃).
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  /// The same blocks' backward (never the pattern, never P̃); the pattern's backward when n_k < n_q.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;
  Pattern pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const override;
};

extern template class LocalMethod<float>;
extern template class LocalMethod<double>;

}  // namespace attnlab
