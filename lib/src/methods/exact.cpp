// `exact:impl=streaming|materialized,tile=T` — P = softmax(s·QKᵀ [+ causal mask]), O = P·V (Vaswani et al. 2017,
// eq. (1)). The fast path streams over key tiles (online softmax, Milakov & Gimelshein 2018) or forms P; the operator
// uses the row log-sum-exp.
#include "attnlab/methods/exact.hpp"

#include "attnlab/operators/exact.hpp"
#include "attnlab/core/memory.hpp"

#include <fmt/format.h>

#include <memory>

namespace attnlab {

MethodDescriptor ExactOptions::registry_entry() {
  return describe<ExactMethod, ExactOptions>(
      "softmax attention, streaming (online softmax) or materialized",
      "P = softmax(s·QKᵀ + M), O = P·V (Vaswani et al. 2017, eq. 1); online softmax (Milakov & Gimelshein 2018)",
      Causal::yes())
      .with_backward(Backward::yes("O(n) memory, FlashAttention-2 Alg. 2 (Dao 2023)"))
      .with_storage(StorageEmulation::both(
          "both policies: Q, K, V, P (materialized: all of it; streaming: each tile before its product with V, as "
          "FlashAttention-2 converts it) and O; eager also the logits (QKᵀ, then s·QKᵀ) and, streaming, the running "
          "sums ℓ and the running accumulator after every tile; careful keeps those in float32; the softmax's max, "
          "exponentials and sums (materialized) in float32 under both, as torch.softmax takes them")
                        .with_backward(
                            "V, dO and dQ, dK, dV in the format; materialized (autograd's form): dP = dO·Vᵀ and dS "
                            "under both policies, s·dS under eager; streaming (FlashAttention-2 Alg. 2): each tile of "
                            "P and dS under both, under eager also the logits, D = rowsum(dO ∘ O), dP and the running "
                            "dQ, dK, dV after every tile; careful keeps those in float32"));
}

std::uint64_t ExactOptions::memory(const ProblemSize& s) const {
  return impl == ExactImpl::Materialized ? matrix_bytes(s.n_q, s.n_k, s.elem) : 0;  // P itself
}

template <typename T>
Status ExactMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  this->keep(q, k);
  forward_.valid = false;  // new Q, K: the last output's ℓ no longer applies
  if (this->o_.impl == ExactImpl::Materialized) p_ = exact_matrix<T>(q, k, opts, this->rounding_hook());
  return Status::Success;
}

template <typename T>
std::unique_ptr<AttentionOperator<T>> ExactMethod<T>::build_op() const {
  return std::make_unique<ExactOperator<T>>(this->queries(), this->keys(), this->options(), this->o_.tile);
}

template <typename T>
MatrixR<T> ExactMethod<T>::do_output(const ConstRef<T>& v) const {
  if (this->o_.impl == ExactImpl::Materialized) return p_ * v;
  // The forward keeps what its backward needs (FlashAttention-2 saves O and ℓ the same way): a training step's
  // backward then costs one pass over the tiles, not a second forward.
  // Copies into storage kept across calls (no fresh buffers, hence no page faults, in steady state).
  MatrixR<T> out = exact_output<T>(this->queries(), this->keys(), v, this->options(), this->o_.tile, {}, &forward_.lse,
                                   this->rounding_hook());
  forward_.v = v;
  forward_.out = out;
  forward_.valid = true;
  return out;
}

template <typename T>
MatrixR<T> ExactMethod<T>::do_matrix() const {
  if (this->o_.impl == ExactImpl::Materialized) return p_;
  return exact_matrix<T>(this->queries(), this->keys(), this->options());
}

template <typename T>
Gradients<T> ExactMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  const ConstRef<T> q = this->queries(), k = this->keys();
  if (this->o_.impl == ExactImpl::Streaming) {
    // The last output()'s O and ℓ when it was taken on this V (compared element by element, O(n·d)); else the
    // forward once more.
    if (!(forward_.valid && forward_.v.rows() == v.rows() && forward_.v.cols() == v.cols() && forward_.v == v))
      do_output(v);  // keeps O and ℓ for this V
    const Rounding r = this->rounding_hook();
    if (r.active()) {  // D = rowsum(dO ∘ O) from O as stored (Method::output stores it in the format)
      MatrixR<T> stored = forward_.out;
      r.untallied()(stored, Held::tensor, "");
      return exact_backward<T>(q, k, v, stored, forward_.lse, d_out, this->options(), this->o_.tile, {}, r);
    }
    return exact_backward<T>(q, k, v, forward_.out, forward_.lse, d_out, this->options(), this->o_.tile);
  }
  // dS = P ∘ (dP − D), dP = dO Vᵀ, D_i = Σ_j P_ij dP_ij; masked entries of P are 0, so are theirs in dS. Emulated:
  // autograd's tensors stored as formed (dP, then dS from torch's softmax backward, whose D is float32 inside).
  const Rounding r = this->rounding_hook();
  const T s = T(this->options().scale);
  Gradients<T> g;
  g.dv.noalias() = p_.transpose() * d_out;
  MatrixR<T> ds = d_out * v.transpose();
  r(ds, Held::tensor, "dP = dO·Vᵀ");
  const VectorX<T> dsum = (p_.array() * ds.array()).rowwise().sum();
  if (r.active()) {
    ds = (p_.array() * (ds.array().colwise() - dsum.array())).matrix();
    r(ds, Held::tensor, "dS = P ∘ (dP − D)");
    ds *= s;  // the scale's backward: s·dS stored again under eager (a product of its own)
    r(ds, Held::accumulator, "dS = P ∘ (dP − D)");
  } else {
    ds = (p_.array() * (ds.array().colwise() - dsum.array()) * s).matrix();
  }
  g.dq.noalias() = ds * k;
  g.dk.noalias() = ds.transpose() * q;
  return g;
}

template class ExactMethod<float>;
template class ExactMethod<double>;

}  // namespace attnlab
