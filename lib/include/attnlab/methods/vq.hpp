// `vq` — Transformer-VQ (Lingle 2023): the keys quantized to a codebook C, K̂ = ΔC, and the VQ-attention
// factorization (Lingle 2023, Fig. 2) exp(s·QK̂ᵀ)V = exp(s·QCᵀ)(ΔᵀV): exact attention on K̂ in O(n·c·d).
// Where C comes from (`codebook`):
//   codebook=window (the default): C fitted by k-means (components/kmeans.hpp, seeded) on the keys of the call
//                itself, future keys included — a look-ahead in the codebook, which lookahead() states;
//   codebook=PATH.npy: a fixed (codes, d) codebook fitted elsewhere (on training windows: vq_fit_codebook below,
//                attnlab.vq_codebook in Python), held as a trained Transformer-VQ holds its codebook. No k-means
//                runs; every key takes its nearest code. The file (a relative path: from the working directory) is
//                read once per (path, size, modification time) and shared by every instance; `codes` must equal
//                its rows and d the inputs' (checked before work).
// Causal with assign=hard, quantize=keys (running per-code sums, so output i reads no key after i). With
// codebook=PATH.npy nothing else looks ahead: O_i is independent of the keys and values after i, and lookahead()
// is empty — the form for a causal verdict. codebook=window stays accepted under a causal mask (the experiments
// that run it keep running) with its look-ahead stated; it is not a fair causal method.
// Two variants of attnlab's own, not in Lingle 2023: assign=soft replaces the one-hot Δ by Gaussian-mixture
// responsibilities at temperature T (after Su 2023, who reads the Performer as a soft Transformer-VQ), and
// quantize=both a mean-field form that quantizes the queries too (operators/codebook.hpp). Both are non-causal,
// and both need codebook=window (they fit by k-means).
// Backward: exact attention's gradient on (Q, K̂, V) given the codebook and the assignments (held fixed; the k-means
// is not differentiated, a given codebook is not either): dQ and dV exact; dK by the straight-through estimator as
// Transformer-VQ trains the keys (Lingle 2023: dK = dK̂, the gradient w.r.t. the quantized keys) — not the
// derivative of this forward, whose codebook is refitted on K (a finite difference in K moves the centroids) or,
// given, makes K̂ piecewise constant in K. The variants:
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
// A fixed codebook, fitted on training keys and held for causal use:
//   write_npy("cb.npy", attnlab::vq_fit_codebook<double>(K_train, 32, 20, 0).centroids);  // io/npy.hpp
//   auto m = attnlab::make_method<double>("vq:codes=32,codebook=cb.npy");  // m->lookahead() == ""
#pragma once

#include "attnlab/components/kmeans.hpp"
#include "attnlab/core/method.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"

#include <cstdint>
#include <memory>
#include <string>
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
  /// "window": k-means on the call's keys (a look-ahead); else the path of a fixed (codes, d) .npy codebook.
  std::string codebook = "window";
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("codes", &VqOptions::codes, 1, 1 << 20, "codebook size c")
        .budget(Study("vq", {8, 16, 32, 64, 128}).simplicity(8).listed(7))
        .within_keys("n_k, the keys").when("codebook", "window")  // k-means on the keys of the call
        .within_queries("n_q, the queries").when("codebook", "window").when("quantize", "both");
    p.integer("iters", &VqOptions::iters, 0, 10000, "Lloyd iterations after k-means++");
    p.choice("assign", &VqOptions::assign, {{VqAssign::Hard, "hard"}, {VqAssign::Soft, "soft"}},
             "nearest code, or GMM responsibilities at temperature T");
    p.real("temperature", &VqOptions::temperature, 1e-12, 1e12, "T of the soft assignment");
    p.choice("quantize", &VqOptions::quantize, {{VqQuantize::Keys, "keys"}, {VqQuantize::Both, "both"}},
             "quantize K, or K and Q (mean-field form)");
    p.path("codebook", &VqOptions::codebook, {"window"}, ".npy",
           "window: k-means on the call's keys, future keys included (a look-ahead); PATH.npy: a fixed (codes, d) "
           "codebook fitted on other windows (attnlab.vq_codebook), no k-means, no look-ahead");
    p.seed(&VqOptions::seed);
  }
  /// Whether the codebook is given (a file), not fitted on the call's keys.
  bool fixed_codebook() const { return codebook != "window"; }
  /// A fixed codebook's dimension against the keys' (MethodOptions::check_size; codes ≤ n_k with codebook=window is
  /// a declared limit), in lib/src/methods/vq.cpp.
  void check_size(const ProblemSize& size) const;
  /// The method's entry in the registry (lib/src/methods/vq.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

/// The key codebook `vq` fits with codebook=window: k-means++ then up to `iters` Lloyd iterations, seeded by
/// `seed` — the method's own call, so that a codebook fitted here on training keys (rows of several windows
/// stacked) is what the method would fit on them. Its centroids, written as a .npy, are a codebook=PATH.npy.
template <typename T>
KMeansResult<T> vq_fit_codebook(const ConstRef<T>& keys, Index codes, Index iters, std::uint64_t seed);

/// The codebook in the .npy file at `path` (float32 or float64, shape (codes, d), finite, at least one code), in
/// float64: read once per (path, size, modification time) and shared. Throws Error naming the file otherwise.
std::shared_ptr<const MatrixR<double>> vq_codebook_file(const std::string& path);

template <typename T>
class VqMethod final : public ConfiguredMethod<VqOptions, Method<T>> {
 public:
  /// The causal emulation's blocks of queries (emulated_causal_output; vq_rounding_bound follows them).
  static constexpr Index kCausalBlock = 64;
  /// With codebook=PATH.npy reads the file (vq_codebook_file) and checks it before any data: `codes` must equal its
  /// rows, and assign=hard, quantize=keys (the variants fit by k-means); throws Error otherwise.
  explicit VqMethod(const VqOptions& options = {});
  bool supports_causal() const override {
    return this->o_.assign == VqAssign::Hard && this->o_.quantize == VqQuantize::Keys;
  }
  /// codebook=window: the k-means on all keys of the call, stated; a fixed codebook: "" (no look-ahead).
  std::string lookahead() const override {
    return this->o_.fixed_codebook() ? "" : "the codebook is fitted by k-means on all keys (codebook=window)";
  }
  /// The key codebook's inertia Σ‖k − c_a(k)‖² and the Lloyd iterations the k-means ran (0 with a fixed codebook,
  /// whose inertia is the keys' quantization error against it).
  std::vector<std::pair<std::string, double>> diagnostics() const override {
    return {{"kmeans_inertia", inertia_}, {"kmeans_iterations", double(iterations_)}};
  }
  /// The key codebook C of the last compute(): k-means' centroids (codebook=window, fitted on the keys as this call
  /// held them: stored in the format under an emulated storage) or the file's, in T; empty before compute(). What
  /// vq_rounding_bound reads of each run.
  const MatrixR<T>& codebook() const { return centroids_; }
  /// quantize=both: the query codebook C' (k-means' centroids on the queries as this call held them), each key's
  /// code a(j) and each query's code b(i) of the last compute(); empty otherwise. What vq_both_rounding_bound reads
  /// of each run.
  const MatrixR<T>& query_codebook() const { return qcentroids_; }
  const std::vector<Index>& key_codes() const { return key_codes_; }
  const std::vector<Index>& query_codes() const { return query_codes_; }

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  const AttentionOperator<T>& do_op() const override { return *op_; }
  /// The operator's P̃·V; under an emulated reduced storage the form written out as a transcription stores it (the
  /// registry entry's storage note).
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  /// dQ, dV exact and dK straight-through (dK = dK̂) given the codebook and assignments; see the header comment.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;
  /// The non-causal emulated forward (hard or soft, keys quantized) as a transcription stores it, its stored tensors
  /// kept in the tape for the backward (vq.cpp).
  struct Tape;
  MatrixR<T> emulated_output(const ConstRef<T>& v, const Rounding& r, Tape& t) const;
  /// assign=soft: the responsibilities R as a transcription forms and stores them, from the stored keys and codebook.
  MatrixR<T> stored_responsibilities(const Rounding& r, const MatrixR<T>& c) const;
  /// do_backward under an emulated reduced storage (keys quantized, non-causal): the transcription's backward.
  Gradients<T> emulated_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const;
  /// quantize=both under an emulated reduced storage: the mean-field form as a transcription stores it, and its
  /// reverse mode (codes fixed, dK straight-through) (vq.cpp).
  struct BothTape;
  MatrixR<T> emulated_both_output(const ConstRef<T>& v, const Rounding& r, BothTape& t) const;
  Gradients<T> emulated_both_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const;
  /// quantize=both: ∂L/∂C' (the query codebook's gradient) passed to the queries C' was formed from, into dq.
  void add_query_codebook_gradient(const MatrixR<T>& dcq, MatrixR<T>& dq) const;
  /// The causal form under an emulated reduced storage: Transformer-VQ's blockwise transcription (Lingle 2023 §3.3:
  /// blocks of kCausalBlock queries, each attending to its own keys under the mask and to the cache — the per-code
  /// value sums and counts of every earlier key), stored as the registry entry's note says. With a tape, each
  /// block's stored weights, cache and the rows' numerators and normalisers are kept for the backward.
  struct CausalTape;
  /// C stored (into c) and ℓ = s·QCᵀ as every emulated path stores them (vq.cpp).
  MatrixR<T> stored_logits(const Rounding& r, MatrixR<T>& c) const;
  MatrixR<T> emulated_causal_output(const ConstRef<T>& v, const Rounding& r, CausalTape* tape) const;
  /// Reverse mode through emulated_causal_output, codebook and assignments fixed, dK straight-through.
  Gradients<T> emulated_causal_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const;

  std::shared_ptr<const MatrixR<double>> given_;  // the fixed codebook (codebook=PATH.npy), else null
  double inertia_ = 0;
  Index iterations_ = 0;
  std::unique_ptr<AttentionOperator<T>> op_;
  // Kept for the backward: Q, the key codebook C; soft: K, the logits s·QCᵀ and their normalizers L_i;
  // both: the residuals r_j = k_j − c_a(j), how the query codebook was formed from Q, the query codebook C' and the
  // key and query codes, and under an emulated storage K.
  MatrixR<T> q_, k_, centroids_, logits_, resid_, qcentroids_;
  VectorX<T> lse_;
  std::vector<Index> q_formed_from_, q_copy_of_, key_codes_, query_codes_;
};

extern template KMeansResult<float> vq_fit_codebook<float>(const ConstRef<float>&, Index, Index, std::uint64_t);
extern template KMeansResult<double> vq_fit_codebook<double>(const ConstRef<double>&, Index, Index, std::uint64_t);
extern template class VqMethod<float>;
extern template class VqMethod<double>;

}  // namespace attnlab
