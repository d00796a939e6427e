// `linear` — linear attention (Katharopoulos et al. 2020, §3.2): sim(q, k) = φ(q)ᵀφ(k) with φ = elu(x) + 1 or
// relu(x), on raw q and k; P̃_ij = sim(q_i, k_j) / Σ_j' sim(q_i, k_j') (eq. (2)); causal by prefix sums (§3.3,
// eqs. (9)–(10)) in KernelMethod. The scale does not enter (as in the paper): the method acts on raw q and k.
#include "attnlab/methods/linear.hpp"

namespace attnlab {

MethodDescriptor LinearOptions::registry_entry() {
  return describe<LinearMethod, LinearOptions>(
      "linear attention with a feature map, φ(q)ᵀΣφ(k)vᵀ / φ(q)ᵀΣφ(k)",
      "Katharopoulos et al. 2020 (Transformers are RNNs) §3.2, φ(x) = elu(x) + 1; causal masking §3.3 (prefix sums)",
      LinearOptions::causal_support())
      .with_backward(Backward::yes("nothing (exact; relu'(0) = 0); causal by reverse prefix sums"))
      .with_storage(StorageEmulation::both(
          "both policies: Q, K, V, the features φ(q), φ(k) and O; eager also the key–value state "
          "Σφ(k)vᵀ, the key sum Σφ(k), the numerators and the normalisers φ(q)ᵀΣφ(k), divided unguarded as "
          "(fq @ (fk.T @ v)) / (fq @ fk.sum(0)) divides; careful keeps those in float32, guarded. Causal (either "
          "causal_form): the chunked transcription, the masked intra-chunk scores stored under both policies, the "
          "state after every chunk under eager (operators/kernel.hpp, emulated_causal_kernel_output)")
                        .with_backward("V, dO, dQ, dK, dV and ∂L/∂φ "
                                       "in the format, the features as the forward stored them; eager also the state, "
                                       "the numerators and normalisers (divided unguarded), the division's gradients "
                                       "and the backward state Σφ(q)W̃ᵀ; careful keeps those in float32. Causal "
                                       "(either causal_form): reverse mode through the chunked transcription, "
                                       "∂L/∂(intra-chunk scores) stored under both policies, the division's "
                                       "gradients and the backward state after every chunk under eager"));
}

template <typename T>
void LinearMethod<T>::block_features(const ConstRef<T>& x, bool, const AttentionOptions&, MatrixR<T>& f,
                                     VectorX<T>& g) const {
  // Evaluated into f's own storage (kept across calls by the caller's workspace): no temporary per block.
  if (this->o_.feature == LinearFeature::Relu) f = x.cwiseMax(T(0));
  // elu(x) + 1 = x + 1 for x > 0, e^x for x ≤ 0: always positive. Written max(x, 0) + e^{min(x, 0)} so that
  // Eigen vectorizes the exp (a scalar std::exp per entry cost more than the whole attention at n = 4096).
  else f = (x.array().max(T(0)) + x.array().min(T(0)).exp()).matrix();
  g.resize(0);
}

template <typename T>
void LinearMethod<T>::block_features_backward(const ConstRef<T>& x, bool, const AttentionOptions&, const ConstRef<T>& f,
                                              const ConstRef<T>& df, const ConstVecRef<T>&, MutRef<T> dx) const {
  // d/dx (elu(x) + 1) = 1 for x > 0, e^x for x ≤ 0 (continuous at 0): e^x is the feature itself there (f = 0 + e^x,
  // bit for bit), so no exp is taken again; d/dx relu(x) = [x > 0] (0 taken at 0).
  if (this->o_.feature == LinearFeature::Relu)
    dx = (x.array() > T(0)).select(df.array(), T(0)).matrix();
  else
    dx = (x.array() > T(0)).select(df.array(), df.array() * f.array()).matrix();
}

template class LinearMethod<float>;
template class LinearMethod<double>;

}  // namespace attnlab
