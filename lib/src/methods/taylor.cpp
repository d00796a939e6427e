// `taylor` — sim(q, k) = 1 + (q/‖q‖)ᵀ(k/‖k‖) = 1 + cos(q, k), the first-order Taylor expansion of exp(cos(q, k))
// (as in the linear-attention literature; no single paper), = φ(q)ᵀφ(k) with φ(x) = [1, x/‖x‖]: a linear attention
// (Katharopoulos et al. 2020 eq. (2)), causal by prefix sums (§3.3, eqs. (9)–(10)) in KernelMethod. The scale does
// not enter: the method acts on raw q and k.
#include "attnlab/methods/taylor.hpp"

namespace attnlab {

MethodDescriptor TaylorOptions::registry_entry() {
  return describe<TaylorMethod, TaylorOptions>(
      "first-order Taylor attention, sim = 1 + cos(q, k)",
      "Su 2020, blog 'Exploring Linear Attention: Must Attention Have a Softmax?' "
      "(e^{qᵀk} ≈ 1 + qᵀk on normalized q, k)",
      TaylorOptions::causal_support())
      .with_backward(Backward::yes("nothing (exact, through x/‖x‖); causal by reverse prefix sums"))
      .with_storage(StorageEmulation::both(
          "as linear (causal too): both policies store Q, K, V, the features φ(x) = [1, x/‖x‖] and O; eager also the "
          "key–value state, the key sum, the numerators and the normalisers, divided unguarded; careful keeps those "
          "in float32, guarded")
                        .with_backward("V, dO, dQ, dK, dV and ∂L/∂φ "
                                       "in the format, the features as the forward stored them; eager also the state, "
                                       "the numerators and normalisers (divided unguarded), the division's gradients "
                                       "and the backward state Σφ(q)W̃ᵀ; careful keeps those in float32. Causal "
                                       "(either causal_form): reverse mode through the chunked transcription, "
                                       "∂L/∂(intra-chunk scores) stored under both policies, the division's "
                                       "gradients and the backward state after every chunk under eager"));
}

template <typename T>
void TaylorMethod<T>::block_features(const ConstRef<T>& x, bool, const AttentionOptions&, MatrixR<T>& f,
                                     VectorX<T>& g) const {
  // φ(x) = [1, x/‖x‖]: 1 + cos ≥ 0.
  f.resize(x.rows(), x.cols() + 1);  // keeps its storage when the size does not change
  f.col(0).setOnes();
  for (Index i = 0; i < x.rows(); ++i) {
    const T n = x.row(i).norm();
    if (n > 0) f.row(i).tail(x.cols()) = x.row(i) / n;
    else f.row(i).tail(x.cols()).setZero();  // a zero vector has no direction: sim = 1
  }
  g.resize(0);
}

template <typename T>
void TaylorMethod<T>::block_features_backward(const ConstRef<T>& x, bool, const AttentionOptions&, const ConstRef<T>& f,
                                              const ConstRef<T>& df, const ConstVecRef<T>&, MutRef<T> dx) const {
  // φ(x) = [1, u], u = x/‖x‖ (f's last d columns): the constant feature has no gradient; ∂u/∂x = (I − uuᵀ)/‖x‖
  // (symmetric), so dx = (du − (duᵀu)·u)/‖x‖. A zero row (φ = [1, 0], not differentiable there) gets 0.
  const Index d = x.cols();
  for (Index i = 0; i < x.rows(); ++i) {
    const T n = x.row(i).norm();
    if (!(n > 0)) {
      dx.row(i).setZero();
      continue;
    }
    const auto du = df.row(i).tail(d);
    const auto u = f.row(i).tail(d);
    dx.row(i) = (du - du.dot(u) * u) / n;
  }
}

template class TaylorMethod<float>;
template class TaylorMethod<double>;

}  // namespace attnlab
