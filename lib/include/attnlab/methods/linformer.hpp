// `linformer` — Linformer (Wang et al. 2020, eq. (7)): P̃ = softmax(s·Q(EK)ᵀ)·F with k×n projections E, F of the
// keys and values, so the output softmax(s·Q(EK)ᵀ)·(FV) costs O(n·k·d). E, F Gaussian N(0, 1/k) (the
// Johnson–Lindenstrauss projection of Wang et al. 2020, Theorem 2), uniform ±1/√k, mean pooling over k segments, or
// the identity (k = n: exact attention). Non-causal: E and F mix every position.
// Backward: E and F are held fixed (parameters, random or not): exact attention's backward on (Q, EK, FV), then
// dK = Eᵀ·d(EK), dV = Fᵀ·d(FV).
//   attnlab::LinformerOptions o;  o.k = 128;  o.projection = attnlab::LinformerProjection::Pool;
//   attnlab::LinformerMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "linformer:k=128,projection=pool" builds the same class (make_method reads the spec into LinformerOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/lowrank_method.hpp"
#include "attnlab/operators/exact.hpp"

#include <cstdint>
#include <memory>
#include <utility>

namespace attnlab {

/// Linformer's projections E, F (k × n).
enum class LinformerProjection { Gaussian, Uniform, Pool, Identity };

struct LinformerOptions : MethodOptions<LinformerOptions> {
  static constexpr const char* kName = "linformer";
  Index k = 64;
  LinformerProjection projection = LinformerProjection::Gaussian;
  bool share_kv = false;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("k", &LinformerOptions::k, 1, 1 << 20, "projected length k (≤ n_k)")
        .budget(Study("linformer_pool", {8, 16, 32, 64, 128}).with("projection=pool").simplicity(2).listed(3),
                Study("linformer_gaussian", {8, 16, 32, 64, 128}).with("projection=gaussian").simplicity(5).listed(4))
        .within_keys();  // more than n_k is no longer a low-rank approximation, only a costlier one
    p.choice("projection", &LinformerOptions::projection,
             {{LinformerProjection::Gaussian, "gaussian"},
              {LinformerProjection::Uniform, "uniform"},
              {LinformerProjection::Pool, "pool"},
              {LinformerProjection::Identity, "identity"}},
             "E, F: N(0, 1/k) entries, ±1/√k, mean pooling over k segments, or I (k = n)");
    p.boolean("share_kv", &LinformerOptions::share_kv, "E = F (key-value sharing)");
    p.seed(&LinformerOptions::seed);
  }
  /// The method's entry in the registry (lib/src/methods/linformer.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class LinformerMethod final : public ConfiguredMethod<LinformerOptions, LowRankMethod<T>> {
 public:
  using ConfiguredMethod<LinformerOptions, LowRankMethod<T>>::ConfiguredMethod;
  /// The parameters E, F (k × n_k) of the last compute() (analysis/rounding_bound.hpp's Linformer form takes them).
  const std::pair<MatrixR<T>, MatrixR<T>>& projections() const {
    require(ef_ != nullptr, "linformer: projections() before compute()");
    return *ef_;
  }

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  std::pair<MatrixR<T>, MatrixR<T>> make_factors() const override;
  /// Exact attention's backward on (Q, EK, FV) — over k ≤ kFewKeys projected keys by blocks of queries with the
  /// softmax formed whole (exact_backward_few_keys, O(n·k) work), else FlashAttention-2 Alg. 2 — then
  /// dK = Eᵀ·d(EK), dV = Fᵀ·d(FV); E, F held fixed. Its buffers are kept in the method: only the gradients are new.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;
  /// do_backward under an emulated reduced storage (linformer.cpp).
  Gradients<T> emulated_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const;

  Index drawn_n_ = -1;  // the n_k that E and F were drawn for
  std::shared_ptr<const std::pair<MatrixR<T>, MatrixR<T>>> ef_;  // the parameters E, F, k × n_k (shared_draw)
  MatrixR<T> q_, ek_;   // the queries (kept for the output) and E·K
  AttentionOptions plain_;
  MatrixR<T> f_stored_;  // under a reduced storage: F as stored in the format (E is used once, in do_compute)
  /// The backward's buffers, kept across calls (a cache behind const calls: one method object is not to be used
  /// from several threads at once).
  struct BackwardWorkspace {
    ExactBackwardWorkspace<T> exact;
    MatrixR<T> fv, dek, dfv;  // F·V, d(EK), d(FV): k × d
  };
  mutable BackwardWorkspace ws_;
};

extern template class LinformerMethod<float>;
extern template class LinformerMethod<double>;

}  // namespace attnlab
