// `exact:impl=streaming|materialized,tile=T` — P = softmax(s·QKᵀ [+ causal mask]), O = P·V.
// The fast path streams over key tiles (online softmax) or forms P; the operator uses the row log-sum-exp.
#include "attnlab/methods/exact.hpp"

#include "attnlab/exact.hpp"
#include "attnlab/memory.hpp"
#include "lazy_method.hpp"

#include <fmt/format.h>

#include <memory>

namespace attnlab {
namespace {

/// The inputs are kept in the method's own storage (LazyOperatorMethod::keep: same-shape calls reuse it) and the
/// operator is built only when analysis asks for it, so that a layer run again and again allocates only its output.
template <typename T>
class ExactMethod final : public LazyOperatorMethod<T> {
 public:
  ExactMethod(const MethodDescriptor& d, Params p) : LazyOperatorMethod<T>(d, std::move(p)) {
    const ExactOptions o = ExactOptions::from(this->params());  // the spec's values, typed
    materialized_ = o.impl == "materialized";
    tile_ = o.tile;
  }

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    this->keep(q, k);
    if (materialized_) p_ = exact_matrix<T>(q, k, opts);
    return Status::Success;
  }
  std::unique_ptr<AttentionOperator<T>> build_op() const override {
    return std::make_unique<ExactOperator<T>>(this->queries(), this->keys(), this->options(), tile_);
  }
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    if (materialized_) return p_ * v;
    return exact_output<T>(this->queries(), this->keys(), v, this->options(), tile_);
  }
  MatrixR<T> do_matrix() const override {
    if (materialized_) return p_;
    return exact_matrix<T>(this->queries(), this->keys(), this->options());
  }

 private:
  bool materialized_ = false;
  Index tile_ = kDefaultTile;
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
       ParamSpec::integer("tile", kDefaultTile, 8, 8192, "tile edge of the streaming kernels")})
      .with_memory([](const Params& p, const ProblemSize& s) -> std::uint64_t {
        return p.choice("impl") == "materialized" ? matrix_bytes(s.n_q, s.n_k, s.elem) : 0;  // P itself
      });
}

ATTNLAB_TYPED_METHOD_DEFINE(Exact)

}  // namespace attnlab
