// Shared base of the kernel feature-map methods (linear, taylor, performer): a method supplies the feature
// maps; the base builds the KernelOperator and chooses the causal form (recurrent or chunked).
#pragma once

#include "attnlab/kernel_attention.hpp"
#include "lazy_method.hpp"
#include "attnlab/spec.hpp"


namespace attnlab {

/// The causal_form and chunk parameters every kernel method takes.
inline std::vector<ParamSpec> causal_form_params() {
  return {ParamSpec::choice("causal_form", {"chunked", "recurrent"},
                            "causal prefix sums: blocks of matrix products, or the RNN form one position at a time"),
          ParamSpec::integer("chunk", 64, 1, 65536, "block size of the chunked causal form")};
}

template <typename T>
class KernelMethod : public LazyOperatorMethod<T> {
 public:
  /// Without a mask P̃ = D⁻¹ΦqΨkᵀ has rank ≤ the number of features.
  Index rank_bound() const override {
    return this->info() != Status::NotComputed && !this->options().causal ? features_ : Index(-1);
  }
  KernelMethod(const MethodDescriptor& d, Params p) : LazyOperatorMethod<T>(d, std::move(p)) {
    recurrent_ = this->params().choice("causal_form") == "recurrent";
    chunk_ = Index(this->params().integer("chunk"));
  }

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
    return std::make_unique<KernelOperator<T>>(std::move(f), this->options().causal, chunk_);
  }
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    if (!this->options().causal) {
      const BlockFeatures<T> feats = [this](const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g) {
        block_features(x, keys, this->options(), f, g);
      };
      return streamed_kernel_output<T>(this->queries(), this->keys(), v, feats, nonnegative(), &workspace_);
    }
    const auto& op = static_cast<const KernelOperator<T>&>(this->do_op());
    if (recurrent_) return op.recurrent_output(v);
    return op.apply(v);
  }

 private:
  bool recurrent_ = false;
  Index chunk_ = 64;
  Index features_ = 0;
  /// The streamed output's buffers, kept across calls (kernel_attention.hpp): none allocated in steady state.
  mutable KernelWorkspace<T> workspace_;
};

}  // namespace attnlab
