// Shared base of the kernel feature-map methods (linear, taylor, performer): a method supplies the feature
// maps; the base builds the KernelOperator and chooses the causal form (recurrent or chunked).
#pragma once

#include "attnlab/kernel_attention.hpp"
#include "attnlab/method.hpp"
#include "attnlab/spec.hpp"

#include <optional>

namespace attnlab {

/// The causal_form and chunk parameters every kernel method takes.
inline std::vector<ParamSpec> causal_form_params() {
  return {ParamSpec::choice("causal_form", {"chunked", "recurrent"},
                            "causal prefix sums: blocks of matrix products, or the RNN form one position at a time"),
          ParamSpec::integer("chunk", 64, 1, 65536, "block size of the chunked causal form")};
}

template <typename T>
class KernelMethod : public Method<T> {
 public:
  /// Without a mask P̃ = D⁻¹ΦqΨkᵀ has rank ≤ the number of features.
  Index rank_bound() const override {
    return op_ && !this->options().causal ? features_ : Index(-1);
  }
  KernelMethod(const MethodDescriptor& d, Params p) : Method<T>(d, std::move(p)) {
    recurrent_ = this->params().choice("causal_form") == "recurrent";
    chunk_ = Index(this->params().integer("chunk"));
  }

 protected:
  virtual FeatureMaps<T> features(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) = 0;

  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    FeatureMaps<T> f = features(q, k, opts);
    features_ = f.qf.cols();
    op_.emplace(std::move(f), opts.causal, chunk_);
    return Status::Success;
  }
  const AttentionOperator<T>& do_op() const override { return *op_; }
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    if (this->options().causal && recurrent_) return op_->recurrent_output(v);
    return op_->apply(v);
  }

 private:
  bool recurrent_ = false;
  Index chunk_ = 64;
  Index features_ = 0;
  std::optional<KernelOperator<T>> op_;
};

}  // namespace attnlab
