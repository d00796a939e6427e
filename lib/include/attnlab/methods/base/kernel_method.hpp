// Shared base of the kernel feature-map methods (linear, taylor, performer): a method supplies the feature
// maps; the base builds the KernelOperator and chooses the causal form (recurrent or chunked) from the
// CausalFormOptions its options struct inherits.
// Backward: the VJP through the normalized linear attention (∂L/∂φ(q), ∂L/∂ψ(k) and dV: without a mask streamed in
// chunks as the output is, streamed_kernel_backward; with one KernelOperator::backward, by reverse prefix sums in the
// chunked form, which the recurrent form shares as it computes the same function), then each method's VJP of its
// feature map (block_features_backward) on the features already made.
#pragma once

#include "attnlab/operators/kernel.hpp"
#include "attnlab/methods/base/lazy_method.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"

namespace attnlab {

/// How a kernel method sums its causal prefixes (Katharopoulos et al. 2020 §3.3).
enum class CausalForm { Chunked, Recurrent };

/// The causal_form and chunk parameters every kernel method takes: its options struct inherits them and its
/// parameters() calls CausalFormOptions::parameters(p) where they go in the spec.
struct CausalFormOptions {
  CausalForm causal_form = CausalForm::Chunked;
  Index chunk = 64;

  template <class P>
  static void parameters(P& p) {
    p.choice("causal_form", &CausalFormOptions::causal_form,
             {{CausalForm::Chunked, "chunked"}, {CausalForm::Recurrent, "recurrent"}},
             "causal prefix sums: blocks of matrix products, or the RNN form one position at a time");
    p.integer("chunk", &CausalFormOptions::chunk, 1, 65536, "block size of the chunked causal form");
  }
  /// What the causal forms give every kernel method: a causal mask honoured (its descriptor's Causal).
  static Causal causal_support() { return Causal::yes("recurrent or chunked prefix sums"); }
};

template <typename T>
class KernelMethod : public LazyOperatorMethod<T> {
 public:
  /// Without a mask P̃ = D⁻¹ΦqΨkᵀ has rank ≤ the number of features.
  Index rank_bound() const override {
    return this->info() != Status::NotComputed && !this->options().causal ? features_ : Index(-1);
  }
  KernelMethod(const MethodDescriptor& d, const CausalFormOptions& form) : LazyOperatorMethod<T>(d), form_(form) {}

 protected:
  /// Parameters that depend on the input's shape (Performer's ω), drawn before any feature is computed.
  virtual void prepare(const ConstRef<T>& /*q*/, const ConstRef<T>& /*k*/, const AttentionOptions& /*opts*/) {}
  /// The features of a block of rows (queries: keys = false; keys: log-scales in g, empty meaning zero); a feature
  /// of a row depends on that row only.
  virtual void block_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, MatrixR<T>& f,
                              VectorX<T>& g) const = 0;
  /// How many features a row of dimension d has (rank bound without a mask).
  virtual Index feature_count(Index d) const = 0;
  /// Every sim(q, k) ≥ 0 (then rows of P̃ are distributions and denominators need no magnitude guard).
  virtual bool nonnegative() const { return true; }
  /// The VJP of block_features: given the rows x, the features f block_features made of them, ∂L/∂f (rows × M) and,
  /// for keys, ∂L/∂g (rows; empty for queries), writes dx = ∂L/∂x (rows × d). The per-row stabilizers a map
  /// subtracts (its maxima) are held constant: they cancel in e^{g}·f (keys) or are a per-query factor that cancels
  /// in the normalization (queries), so the gradient stays exact. Called from several OpenMP threads at once (on
  /// disjoint blocks; per-thread scratch by omp_get_thread_num(), as block_features).
  virtual void block_features_backward(const ConstRef<T>& x, bool keys, const AttentionOptions& opts,
                                       const ConstRef<T>& f, const ConstRef<T>& df, const ConstVecRef<T>& dg,
                                       MutRef<T> dx) const = 0;

  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    prepare(q, k, opts);
    this->keep(q, k);  // the features are made when needed, so that the output never holds n × M of them
    features_ = feature_count(q.cols());
    return Status::Success;
  }
  /// The operator (analysis: metrics, spectra, the matrix; the causal output) with every feature formed.
  std::unique_ptr<AttentionOperator<T>> build_op() const override {
    FeatureMaps<T> f;
    VectorX<T> unused;
    block_features(this->queries(), false, this->options(), f.qf, unused);
    block_features(this->keys(), true, this->options(), f.kf, f.k_logscale);
    f.nonnegative = nonnegative();
    return std::make_unique<KernelOperator<T>>(std::move(f), this->options().causal, form_.chunk);
  }
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    if (!this->options().causal) {
      const BlockFeatures<T> feats = [this](const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g) {
        block_features(x, keys, this->options(), f, g);
      };
      return streamed_kernel_output<T>(this->queries(), this->keys(), v, feats, nonnegative(), &workspace_,
                                       this->rounding_hook());
    }
    if (this->rounding_hook().active()) {  // the chunked transcription, emulated (either causal form)
      const BlockFeatures<T> feats = [this](const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g) {
        block_features(x, keys, this->options(), f, g);
      };
      return emulated_causal_kernel_output<T>(this->queries(), this->keys(), v, feats, nonnegative(), form_.chunk,
                                              this->rounding_hook());
    }
    const auto& op = static_cast<const KernelOperator<T>&>(this->do_op());
    if (form_.causal_form == CausalForm::Recurrent) return op.recurrent_output(v);
    return op.apply(v);
  }
  /// The VJP through the attention, then through the feature maps, with the buffers kept in backward_ws_. Without a
  /// mask streamed as the output is (streamed_kernel_backward: the features made again per chunk, no n × M matrix,
  /// no operator built); with one on the operator the causal output already built (its features, stabilizers and
  /// denominators). Both causal forms share the chunked backward (the same function of Q, K, V).
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override {
    const BlockFeaturesBackward<T> back = [this](const ConstRef<T>& x, bool keys, const ConstRef<T>& f,
                                                 const ConstRef<T>& df, const ConstVecRef<T>& dg, MutRef<T> dx) {
      block_features_backward(x, keys, this->options(), f, df, dg, dx);
    };
    if (!this->options().causal) {
      const BlockFeatures<T> feats = [this](const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g) {
        block_features(x, keys, this->options(), f, g);
      };
      return streamed_kernel_backward<T>(this->queries(), this->keys(), v, d_out, feats, back, nonnegative(),
                                         &backward_ws_, this->rounding_hook());
    }
    if (this->rounding_hook().active()) {  // reverse mode through the chunked transcription (either causal form)
      const BlockFeatures<T> feats = [this](const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g) {
        block_features(x, keys, this->options(), f, g);
      };
      return emulated_causal_kernel_backward<T>(this->queries(), this->keys(), v, d_out, feats, back, nonnegative(),
                                                form_.chunk, this->rounding_hook());
    }
    const auto& op = static_cast<const KernelOperator<T>&>(this->do_op());
    return kernel_operator_backward<T>(op, this->queries(), this->keys(), v, d_out, back, backward_ws_);
  }

 private:
  CausalFormOptions form_;
  Index features_ = 0;
  /// The streamed output's buffers, kept across calls (operators/kernel.hpp): none allocated in steady state.
  mutable KernelWorkspace<T> workspace_;
  /// The backward's buffers, kept likewise: only the returned gradients are allocated in steady state.
  mutable KernelBackwardWorkspace<T> backward_ws_;
};

}  // namespace attnlab
