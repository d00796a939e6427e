// `vq` — Transformer-VQ (Lingle 2023): keys quantized to a codebook C learned by k-means, K̂ = ΔC, and the
// VQ-attention factorization exp(s·QK̂ᵀ)V = exp(s·QCᵀ)(ΔᵀV) (Lingle 2023, Fig. 2): exact attention on K̂ in O(n·c·d).
//   assign=hard: Δ one-hot (nearest code). P̃_ij = exp(s·q_iᵀc_a(j) − L_i), L_i = log Σ_y N_y exp(s·q_iᵀc_y).
//   assign=soft: Δ → the Gaussian-mixture responsibilities R_jy = softmax_y(−‖k_j − c_y‖²/(2T)); T → 0 recovers hard
//                VQ. attnlab's variant, not in Lingle 2023 (after Su 2023, who reads the Performer as a soft
//                Transformer-VQ). Non-causal.
//   quantize=both: attnlab's mean-field form, q·k ≈ q·⟨k⟩ + ⟨q⟩·k − ⟨q⟩·⟨k⟩ with ⟨q⟩ from a second codebook on
//                the queries: logits s(q_i·c_a(j) + c'_b(i)·(k_j − c_a(j))), still linear. Non-causal.
// Causal (hard, keys): running per-code sums of values and counts, so output i reads only keys j ≤ i. The
// codebook itself is fitted on all keys before the pass — a look-ahead in the codebook (as when Transformer-VQ's
// codebook is trained), not in the attention.
#include "attnlab/methods/vq.hpp"

#include "attnlab/components/codebook_attention.hpp"
#include "attnlab/components/kmeans.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/operators/codebook.hpp"
#include "attnlab/operators/low_rank.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab {

MethodDescriptor VqOptions::registry_entry() {
  return describe<VqMethod, VqOptions>(
      "Transformer-VQ: keys quantized to a k-means codebook, exp(QCᵀ)(ΔᵀV); causal with assign=hard",
      "Lingle 2023 (Transformer-VQ): K ≈ ΔC, exp(QCᵀ)(ΔᵀV); soft (GMM) assignment after Su 2023, blog "
      "'Traces of Transformer-VQ in the Performer'",
      Causal::conditional("assign=hard, quantize=keys: the attention is causal; the codebook is fitted on all "
                          "keys (a look-ahead in the codebook)"))
      .with_size_check([](const Params& p, const ProblemSize& s) {
        require_budget_within("vq", "codes", p.integer("codes"), s.n_k, "n_k, the keys");
        if (p.choice("quantize") == "both")
          require_budget_within("vq", "codes", p.integer("codes"), s.n_q, "n_q, the queries");
      });
}

template <typename T>
Status VqMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const Index codes = this->o_.codes;
  require(codes <= k.rows(), fmt::format("vq: codes = {} exceeds the {} keys", codes, k.rows()));
  Rng rng(this->o_.seed);
  const Index iters = this->o_.iters;
  const KMeansResult<T> km = kmeans<T>(k, codes, iters, rng);
  inertia_ = km.inertia;
  iterations_ = km.iterations;
  const T s = T(opts.scale);
  MatrixR<T> logits = (q * km.centroids.transpose()) * s;  // ℓ = s·QCᵀ
  if (this->o_.quantize == VqQuantize::Both) {
    require(codes <= q.rows(), fmt::format("vq: codes = {} exceeds the {} queries", codes, q.rows()));
    const KMeansResult<T> kq = kmeans<T>(q, codes, iters, rng);
    MatrixR<T> resid = k;  // r_j = k_j − c_a(j)
    for (Index j = 0; j < k.rows(); ++j) resid.row(j) -= km.centroids.row(km.assignment[std::size_t(j)]);
    const MatrixR<T> g = (kq.centroids * resid.transpose()) * s;  // c_q × n_k
    op_ = std::make_unique<MeanFieldOperator<T>>(logits, g, km.assignment, kq.assignment);
  } else if (this->o_.assign == VqAssign::Hard) {
    op_ = codebook_attention<T>(q, k, km.centroids, opts);
  } else {
    // Responsibilities R_jy = softmax_y(−‖k_j − c_y‖²/(2T)) (the posterior of an isotropic Gaussian mixture with
    // equal weights and variance T), then P̃_ij = Σ_y exp(ℓ_iy − L_i) R_jy with L_i = log Σ_y exp(ℓ_iy)·Σ_j R_jy.
    const T temp = T(this->o_.temperature);
    MatrixR<T> r = (k * km.centroids.transpose()) * T(2);
    r.colwise() -= k.rowwise().squaredNorm();
    r.rowwise() -= km.centroids.rowwise().squaredNorm().transpose();  // −‖k − c‖²
    r /= T(2) * temp;
    for (Index j = 0; j < r.rows(); ++j) {
      r.row(j) = (r.row(j).array() - r.row(j).maxCoeff()).exp();
      r.row(j) /= r.row(j).sum();
    }
    const VectorX<T> mass = r.colwise().sum().transpose();
    MatrixR<T> e(logits.rows(), logits.cols());
    for (Index i = 0; i < logits.rows(); ++i) {
      T mx = -std::numeric_limits<T>::infinity();
      for (Index y = 0; y < logits.cols(); ++y)
        if (mass(y) > 0) mx = std::max(mx, logits(i, y));
      const T lse = mx + std::log(((logits.row(i).array() - mx).exp() * mass.transpose().array()).sum());
      e.row(i) = (logits.row(i).array() - lse).min(T(0)).exp();
    }
    op_ = std::make_unique<LowRankOperator<T>>(std::move(e), std::move(r), true);
  }
  return Status::Success;
}

template class VqMethod<float>;
template class VqMethod<double>;

}  // namespace attnlab
