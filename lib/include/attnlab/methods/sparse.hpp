// `sparse` — fixed sparse patterns, the union of: the sliding-window band |j − c_i| ≤ W (Beltagy et al. 2020,
// Longformer §3.1); strided keys (c_i − j) mod S = 0 (Child et al. 2019, "Generating Long Sequences with Sparse
// Transformers", strided attention); G global tokens that attend to and are attended by every position (Beltagy
// et al. 2020 §3.1; Zaheer et al. 2020, BigBird §2); R random keys per query (Zaheer et al. 2020, BigBird §2). The
// softmax is taken over that union only; a causal mask restricts every part to j ≤ c_i.
// Backward: the softmax over each query's union, the union held fixed (the random keys are the seed's, as the
// forward's): PatternMethod's pattern_backward, O(nnz·d).
//   attnlab::SparseOptions o;  o.window = 16;  o.stride = 32;
//   attnlab::SparseMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "sparse:window=16,stride=32" builds the same class (make_method reads the spec into SparseOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/pattern_method.hpp"

#include <cstdint>

namespace attnlab {

struct SparseOptions : MethodOptions<SparseOptions> {
  static constexpr const char* kName = "sparse";
  Index window = 16;
  Index stride = 32;
  Index globals = 2;
  Index random = 8;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("window", &SparseOptions::window, -1, 1 << 24, "half-width of the band (−1: no band)").budget();
    p.integer("stride", &SparseOptions::stride, 0, 1 << 24, "strided keys (c_i − j) mod S = 0 (0: none)");
    p.integer("globals", &SparseOptions::globals, 0, 1 << 24, "number of global tokens");
    p.integer("random", &SparseOptions::random, 0, 1 << 24, "random keys per query");
    p.seed(&SparseOptions::seed);
  }
  /// The method's entry in the registry (lib/src/methods/sparse.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class SparseMethod final : public ConfiguredMethod<SparseOptions, PatternMethod<T>> {
 public:
  using ConfiguredMethod<SparseOptions, PatternMethod<T>>::ConfiguredMethod;

 private:
  /// The union's output part by part (dense blocks, strided GEMMs, a few dot products) merged by an online softmax.
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  Pattern pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const override;
};

extern template class SparseMethod<float>;
extern template class SparseMethod<double>;

}  // namespace attnlab
