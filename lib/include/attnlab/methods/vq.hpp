// `vq` — Transformer-VQ (Lingle 2023): the keys quantized to a codebook C fitted by k-means, K̂ = ΔC, and the
// VQ-attention factorization (Lingle 2023, Fig. 2) exp(s·QK̂ᵀ)V = exp(s·QCᵀ)(ΔᵀV): exact attention on K̂ in
// O(n·c·d). Causal with assign=hard, quantize=keys (running per-code sums; the codebook itself is fitted on all
// keys). Two variants of attnlab's own, not in Lingle 2023: assign=soft replaces the one-hot Δ by Gaussian-mixture
// responsibilities at temperature T (after Su 2023, who reads the Performer as a soft Transformer-VQ), and
// quantize=both a mean-field form that quantizes the queries too (operators/codebook.hpp). Both are non-causal.
// Backward: exact attention's gradient on (Q, K̂, V) given the codebook and the assignments (held fixed; the k-means
// is not differentiated): dQ and dV exact; dK by the straight-through estimator as Transformer-VQ trains the keys
// (Lingle 2023: dK = dK̂, the gradient w.r.t. the quantized keys) — not the derivative of this forward, whose
// codebook is refitted on K (a finite difference in K moves the centroids). The variants:
//   assign=soft: the responsibilities R(K; C) are differentiated w.r.t. K at the fixed codebook C (exact given C,
//                no straight-through: there is no single quantized key to pass the gradient through);
//   quantize=both: dK straight-through for the key codes (∂ through r_j = k_j − c_a(j) plus ∂ through K̂_j = c_a(j),
//                i.e. s·Σ_i dS_ij q_i); dQ exact given the query assignments, including through the query codebook
//                (each centroid the mean of its queries, or a copied query: components/kmeans.hpp's formed_from) —
//                the queries' codebook is attnlab's own, with no training recipe to follow, so it is differentiated
//                as everything continuous is.
//   attnlab::VqOptions o;  o.codes = 32;  o.assign = attnlab::VqAssign::Soft;
//   attnlab::VqMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "vq:codes=32,assign=soft" builds the same class (make_method reads the spec into VqOptions).
#pragma once

#include "attnlab/core/method.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace attnlab {

/// How `vq` assigns keys to codes: the nearest code (Transformer-VQ), or soft responsibilities.
enum class VqAssign { Hard, Soft };
/// What `vq` quantizes: the keys (Transformer-VQ), or the keys and the queries (mean-field form).
enum class VqQuantize { Keys, Both };

struct VqOptions : MethodOptions<VqOptions> {
  static constexpr const char* kName = "vq";
  Index codes = 64;
  Index iters = 20;
  VqAssign assign = VqAssign::Hard;
  double temperature = 1.0;
  VqQuantize quantize = VqQuantize::Keys;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("codes", &VqOptions::codes, 1, 1 << 20, "codebook size c").budget();
    p.integer("iters", &VqOptions::iters, 0, 10000, "Lloyd iterations after k-means++");
    p.choice("assign", &VqOptions::assign, {{VqAssign::Hard, "hard"}, {VqAssign::Soft, "soft"}},
             "nearest code, or GMM responsibilities at temperature T");
    p.real("temperature", &VqOptions::temperature, 1e-12, 1e12, "T of the soft assignment");
    p.choice("quantize", &VqOptions::quantize, {{VqQuantize::Keys, "keys"}, {VqQuantize::Both, "both"}},
             "quantize K, or K and Q (mean-field form)");
    p.seed(&VqOptions::seed);
  }
  /// The method's entry in the registry (lib/src/methods/vq.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class VqMethod final : public ConfiguredMethod<VqOptions, Method<T>> {
 public:
  using ConfiguredMethod<VqOptions, Method<T>>::ConfiguredMethod;
  bool supports_causal() const override {
    return this->o_.assign == VqAssign::Hard && this->o_.quantize == VqQuantize::Keys;
  }
  std::string lookahead() const override { return "the codebook is fitted by k-means on all keys"; }
  /// The k-means fit of the key codebook: its inertia Σ‖k − c_a(k)‖² and the Lloyd iterations it ran.
  std::vector<std::pair<std::string, double>> diagnostics() const override {
    return {{"kmeans_inertia", inertia_}, {"kmeans_iterations", double(iterations_)}};
  }

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  const AttentionOperator<T>& do_op() const override { return *op_; }
  /// dQ, dV exact and dK straight-through (dK = dK̂) given the codebook and assignments; see the header comment.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;

  double inertia_ = 0;
  Index iterations_ = 0;
  std::unique_ptr<AttentionOperator<T>> op_;
  // Kept for the backward: Q, the key codebook C; soft: K, the logits s·QCᵀ and their normalizers L_i;
  // both: the residuals r_j = k_j − c_a(j) and how the query codebook was formed from Q.
  MatrixR<T> q_, k_, centroids_, logits_, resid_;
  VectorX<T> lse_;
  std::vector<Index> q_formed_from_, q_copy_of_;
};

extern template class VqMethod<float>;
extern template class VqMethod<double>;

}  // namespace attnlab
