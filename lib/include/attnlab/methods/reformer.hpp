// `reformer` — Reformer's LSH attention (Kitaev et al. 2020, "Reformer: The Efficient Transformer", §2–3): angular
// LSH h(x) = argmax[xR; −xR] with a random rotation R (d × B/2), one per round, the same hash for queries and keys;
// positions sorted by (bucket, position) and cut into chunks of L keys, each query attending to its chunk and the
// previous one; several rounds combined as the softmax over the union of their key sets (the multi-round form with
// the duplicate correction, §3). With a causal mask, query i attends to the 2·L most recent keys j ≤ c_i of its own
// bucket and to c_i.
// Backward: the softmax over each query's union of key sets, given that union — the rotations, the buckets, the sort
// and the chunks held fixed at the forward's (piecewise constant in Q and K). The duplicate correction of §3 (each key
// counted once across rounds, i.e. −log(#rounds that hold it) added to its logit) is a constant given the buckets:
// it is already the union here, so it adds nothing to the gradient. PatternMethod's pattern_backward, O(nnz·d).
//   attnlab::ReformerOptions o;  o.buckets = 8;  o.chunk = 64;
//   attnlab::ReformerMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "reformer:buckets=8,chunk=64" builds the same class (make_method reads the spec into ReformerOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/pattern_method.hpp"

#include <cstdint>

namespace attnlab {

struct ReformerOptions : MethodOptions<ReformerOptions> {
  static constexpr const char* kName = "reformer";
  Index buckets = 8;
  Index rounds = 2;
  Index chunk = 64;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("buckets", &ReformerOptions::buckets, 1, 1 << 16, "number of hash buckets (1 or even)");
    p.integer("rounds", &ReformerOptions::rounds, 1, 64, "hashing rounds");
    p.integer("chunk", &ReformerOptions::chunk, 1, 1 << 24,
              "keys per chunk (each query sees its chunk and the previous)")
        .budget(Study("reformer", {8, 16, 32, 64, 128}).with("rounds=2").simplicity(6).listed(9));
    p.seed(&ReformerOptions::seed);
  }
  /// The method's entry in the registry (lib/src/methods/reformer.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class ReformerMethod final : public ConfiguredMethod<ReformerOptions, PatternMethod<T>> {
 public:
  using ConfiguredMethod<ReformerOptions, PatternMethod<T>>::ConfiguredMethod;

 private:
  Pattern pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const override;
  /// Non-causal: dense chunk products per round, merged by an online softmax; causal: the sparse product.
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
};

extern template class ReformerMethod<float>;
extern template class ReformerMethod<double>;

}  // namespace attnlab
