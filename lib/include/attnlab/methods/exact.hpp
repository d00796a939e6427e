// `exact` — softmax attention, streaming (online softmax) or materialized.
// Implements: P = softmax(s·QKᵀ + M), O = P·V (Vaswani et al. 2017, eq. (1)); the streaming path is the online
// softmax of Milakov & Gimelshein 2018 over key tiles, O(n·d) memory.
//   attnlab::ExactOptions o;  o.impl = attnlab::ExactImpl::Streaming;
//   attnlab::ExactMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "exact:impl=streaming" builds the same class (make_method reads the spec into ExactOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/lazy_method.hpp"
#include "attnlab/operators/exact.hpp"

namespace attnlab {

/// How `exact` forms its output: tiles of keys with an online softmax, or the full matrix P.
enum class ExactImpl { Streaming, Materialized };

struct ExactOptions : MethodOptions<ExactOptions> {
  static constexpr const char* kName = "exact";
  ExactImpl impl = ExactImpl::Streaming;
  Index tile = kDefaultTile;

  template <class P>
  static void parameters(P& p) {
    p.choice("impl", &ExactOptions::impl,
             {{ExactImpl::Streaming, "streaming"}, {ExactImpl::Materialized, "materialized"}},
             "output path: tiled online softmax (O(n·d) memory) or the full matrix P");
    p.integer("tile", &ExactOptions::tile, 8, 8192, "tile edge of the streaming kernels");
  }
  /// impl=materialized forms P itself (n_q × n_k), streaming nothing quadratic: the memory guard's estimate
  /// (MethodOptions::memory), in lib/src/methods/exact.cpp.
  std::uint64_t memory(const ProblemSize& size) const;
  /// The method's entry in the registry (lib/src/methods/exact.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

/// The inputs are kept in the method's own storage (LazyOperatorMethod::keep: same-shape calls reuse it) and the
/// operator is built only when analysis asks for it, so that a layer run again and again allocates only its output.
template <typename T>
class ExactMethod final : public ConfiguredMethod<ExactOptions, LazyOperatorMethod<T>> {
 public:
  using ConfiguredMethod<ExactOptions, LazyOperatorMethod<T>>::ConfiguredMethod;

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  std::unique_ptr<AttentionOperator<T>> build_op() const override;
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  MatrixR<T> do_matrix() const override;
  /// Streaming: exact_backward (FlashAttention-2 Alg. 2) in O(n) memory from the O and ℓ the last output() kept
  /// (a forward pass again if V differs); materialized: the same closed form on the stored P.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;

  MatrixR<T> p_;  // P itself (impl = materialized)
  /// The streaming forward's O and row log-sum-exp ℓ for the V it was taken on (O(n·d) memory), for the backward.
  /// A cache behind const calls: one method object is not to be used from several threads at once.
  struct Forward {
    bool valid = false;
    MatrixR<T> v, out;
    VectorX<T> lse;
  };
  mutable Forward forward_;
};

extern template class ExactMethod<float>;
extern template class ExactMethod<double>;

}  // namespace attnlab
