// `exact:impl=streaming|materialized,tile=T` — P = softmax(s·QKᵀ [+ causal mask]), O = P·V (Vaswani et al. 2017,
// eq. (1)). The fast path streams over key tiles (online softmax, Milakov & Gimelshein 2018) or forms P; the operator
// uses the row log-sum-exp.
#include "attnlab/methods/exact.hpp"

#include "attnlab/operators/exact.hpp"
#include "attnlab/core/memory.hpp"

#include <fmt/format.h>

#include <memory>

namespace attnlab {

const MethodDescriptor& ExactOptions::descriptor() {
  static const MethodDescriptor d =
      describe<ExactMethod, ExactOptions>(
          "softmax attention, streaming (online softmax) or materialized",
          "P = softmax(s·QKᵀ + M), O = P·V (Vaswani et al. 2017, eq. 1); online softmax (Milakov & Gimelshein 2018)",
          Causal::yes())
          .with_memory([](const Params& p, const ProblemSize& s) -> std::uint64_t {
            return ExactOptions::from(p).impl == ExactImpl::Materialized ? matrix_bytes(s.n_q, s.n_k, s.elem)
                                                                         : 0;  // P itself
          });
  return d;
}

template <typename T>
ExactMethod<T>::ExactMethod(const ExactOptions& options)
    : LazyOperatorMethod<T>(ExactOptions::descriptor(), options.params()), o_(options) {}

template <typename T>
Status ExactMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  this->keep(q, k);
  if (o_.impl == ExactImpl::Materialized) p_ = exact_matrix<T>(q, k, opts);
  return Status::Success;
}

template <typename T>
std::unique_ptr<AttentionOperator<T>> ExactMethod<T>::build_op() const {
  return std::make_unique<ExactOperator<T>>(this->queries(), this->keys(), this->options(), o_.tile);
}

template <typename T>
MatrixR<T> ExactMethod<T>::do_output(const ConstRef<T>& v) const {
  if (o_.impl == ExactImpl::Materialized) return p_ * v;
  return exact_output<T>(this->queries(), this->keys(), v, this->options(), o_.tile);
}

template <typename T>
MatrixR<T> ExactMethod<T>::do_matrix() const {
  if (o_.impl == ExactImpl::Materialized) return p_;
  return exact_matrix<T>(this->queries(), this->keys(), this->options());
}

template class ExactMethod<float>;
template class ExactMethod<double>;

}  // namespace attnlab
