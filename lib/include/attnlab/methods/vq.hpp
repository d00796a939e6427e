// `vq` — Transformer-VQ (Lingle 2023): the keys quantized to a codebook C fitted by k-means, K̂ = ΔC, and the
// VQ-attention factorization (Lingle 2023, Fig. 2) exp(s·QK̂ᵀ)V = exp(s·QCᵀ)(ΔᵀV): exact attention on K̂ in
// O(n·c·d). Causal with assign=hard, quantize=keys (running per-code sums; the codebook itself is fitted on all
// keys). Two variants of attnlab's own, not in Lingle 2023: assign=soft replaces the one-hot Δ by Gaussian-mixture
// responsibilities at temperature T (after Su 2023, who reads the Performer as a soft Transformer-VQ), and
// quantize=both a mean-field form that quantizes the queries too (operators/codebook.hpp). Both are non-causal.
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

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  const AttentionOperator<T>& do_op() const override { return *op_; }

 private:
  double inertia_ = 0;
  Index iterations_ = 0;
  std::unique_ptr<AttentionOperator<T>> op_;
};

extern template class VqMethod<float>;
extern template class VqMethod<double>;

}  // namespace attnlab
