// `exact:impl=streaming|materialized,tile=T` — P = softmax(s·QKᵀ [+ causal mask]), O = P·V.
// The fast path streams over key tiles (online softmax) or forms P; the operator uses the row log-sum-exp.
#include "attnlab/methods/exact.hpp"

#include "attnlab/exact.hpp"

#include <fmt/format.h>

#include <optional>

namespace attnlab {
namespace {

template <typename T>
class ExactMethod final : public Method<T> {
 public:
  ExactMethod(const MethodDescriptor& d, Params p) : Method<T>(d, std::move(p)) {
    const ExactOptions o = ExactOptions::from(this->params());  // the spec's values, typed
    materialized_ = o.impl == "materialized";
    tile_ = o.tile;
  }

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    op_.emplace(q, k, opts, tile_);
    if (materialized_) p_ = exact_matrix<T>(q, k, opts);
    return Status::Success;
  }
  const AttentionOperator<T>& do_op() const override { return *op_; }
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    if (materialized_) return p_ * v;
    return exact_output<T>(q(), k(), v, this->options(), tile_);
  }
  MatrixR<T> do_matrix() const override {
    if (materialized_) return p_;
    return exact_matrix<T>(q(), k(), this->options());
  }

 private:
  const MatrixR<T>& q() const { return op_->queries(); }
  const MatrixR<T>& k() const { return op_->keys(); }
  bool materialized_ = false;
  Index tile_ = kDefaultTile;
  std::optional<ExactOperator<T>> op_;
  MatrixR<T> p_;
};

}  // namespace

MethodDescriptor ExactOptions::descriptor() {
  return describe<ExactMethod>(
      kName, "softmax attention, streaming (online softmax) or materialized",
      "P = softmax(s·QKᵀ + M), O = P·V (Vaswani et al. 2017, eq. 1); online softmax (Milakov & Gimelshein 2018)",
      Causal::yes(),
      {ParamSpec::choice("impl", {"streaming", "materialized"},
                         "output path: tiled online softmax (O(n·d) memory) or the full matrix P"),
       ParamSpec::integer("tile", kDefaultTile, 8, 8192, "tile edge of the streaming kernels")});
}

ATTNLAB_TYPED_METHOD_DEFINE(Exact)

}  // namespace attnlab
