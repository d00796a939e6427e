// Kernel (feature-map) attention, the general form of Katharopoulos et al. 2020 §3.2:
//   O_i = Σ_j sim(q_i, k_j) v_j / Σ_j sim(q_i, k_j),   sim(q_i, k_j) = φ(q_i)ᵀ ψ(k_j),
// with the causal form as prefix sums (Katharopoulos et al. 2020 §3.3), in two ways: recurrent (an M×d_v state updated
// per position, the RNN form) and chunked (blocks of queries: the state carried across blocks, the masked
// quadratic product inside a block — the practical version of the cumsum form).
//
// Features are given as φ(q_i) = qf_i (any positive per-query factor cancels in the normalization, so it is
// dropped) and ψ(k_j) = exp(g_j)·kf_j, with a per-key log-scale g_j that may be large (Performer's
// exp(ωᵀk − ‖k‖²/2)). Query i weighs key j by exp(g_j − M_i) with M_i the maximum of g over the keys i sees —
// all keys without a mask, the prefix max with one — so exp never overflows, the dominant key of every row has
// weight 1 (nothing that matters underflows), and the stabilizer never looks ahead.
// Denominators are guarded: below eps times the magnitude of their terms they are clamped, and a row whose
// features all vanish is a zero row — never 0/0.
//
// Backward (KernelOperator::backward): the vector–Jacobian product of O = D⁻¹(A·V), A_ij = φ(q_i)ᵀψ(k_j) masked,
// D = diag(A·1) (Katharopoulos et al. 2020 eq. (2); causal eqs. (9)–(10)). With W̃_i = [dO_i, −dO_iᵀO_i] / D_ii and
// Ṽ_j = [v_j, 1], dA_ij = W̃_iᵀṼ_j on the visible entries, so dV = P̃ᵀdO, ∂L/∂φ(q_i) = Σ_j dA_ij ψ(k_j) and
// ∂L/∂ψ(k_j) = Σ_i dA_ij φ(q_i): without a mask by the global sums ΨᵀṼ and ΦᵀW̃, with one in the chunked form
// (masked products inside a block, the forward's prefix state for the queries, a suffix state over later query
// blocks for the keys). Every product is taken in the forward's stabilized units (e^{g_j − M_i} ≤ 1); the
// stabilizers M_i are per-query factors that cancel in the normalization, so the gradients are exact.
#pragma once

#include <functional>

#include "attnlab/core/gradients.hpp"
#include "attnlab/core/operator.hpp"
#include "attnlab/core/precision.hpp"
#include <vector>

namespace attnlab {

template <typename T>
using ConstVecRef = Eigen::Ref<const VectorX<T>>;

template <typename T>
struct FeatureMaps {
  MatrixR<T> qf;          ///< n_q × M
  MatrixR<T> kf;          ///< n_k × M
  VectorX<T> k_logscale;  ///< n_k; empty means all zero
  bool nonnegative = true;  ///< every sim ≥ 0 (then rows of P̃ are distributions)
};

/// The gradients of a loss L through kernel attention's output with respect to its features (KernelOperator::backward).
template <typename T>
struct FeatureGradients {
  MatrixR<T> dqf;  ///< n_q × M: ∂L/∂qf
  MatrixR<T> dkf;  ///< n_k × M: ∂L/∂kf, the key features as given (ψ(k_j) = e^{g_j}·kf_j)
  VectorX<T> dg;   ///< n_k: ∂L/∂g_j, the keys' log-scales (= kf_j · ∂L/∂kf_j)
  MatrixR<T> dv;   ///< n_k × d_v: ∂L/∂V = P̃ᵀ dO
};

/// Buffers of the backward passes (KernelOperator::backward, streamed_kernel_backward, kernel_operator_backward)
/// kept between calls, as KernelWorkspace is for the forward: a method trained step after step allocates only the
/// gradients it returns. Without it every call mapped and faulted in fresh n × (d_v + 1) and n × M buffers (a third
/// of linear attention's backward at n = 16384 went to page faults and their memset). A method object owns one; it
/// is not shared between concurrent calls.
template <typename T>
struct KernelBackwardWorkspace {
  struct Thread {
    MatrixR<T> f;            // a block's features
    VectorX<T> g;            // a block of keys' log-scales
    VectorX<T> w, inv, mag;  // per row: e^{g − m}, 1/D, the denominators' magnitudes
    MatrixR<T> y;            // a block's [numerators, denominators] (rows × (d_v + 1))
    MatrixR<T> wt;           // a block's W̃ (rows × (d_v + 1))
    MatrixR<T> df;           // a block's ∂L/∂features (rows × M)
    VectorX<T> dg;           // a block of keys' ∂L/∂g
  };
  std::vector<Thread> threads;
  std::vector<MatrixR<T>> s, r;  // per chunk: Ψ̃ᵀṼ (keys), ΦᵀW̃ (queries), M × (d_v + 1)
  std::vector<VectorX<T>> zabs;  // per key chunk: |Ψ̃|ᵀ1
  std::vector<T> m;              // per key chunk: its max log-scale
  MatrixR<T> state, rstate;  // the streamed form's S̃ and R summed
  VectorX<T> zmag;           // and |Ψ̃|ᵀ1 summed
  // The operator's backward: W̃ and Ṽ (n × (d_v + 1)), the feature gradients, the numerators without a mask, and
  // with one (the scans) per thread a segment's state and a block's scratch, per segment its total and entering state.
  MatrixR<T> wt, vt, y;
  FeatureGradients<T> fg;
  struct Scan {
    MatrixR<T> state, y, a, da, mask, keys, fw;
    VectorX<T> e, kw;
  };
  std::vector<Scan> scans;
  std::vector<MatrixR<T>> total, entry;
};

template <typename T>
class KernelOperator final : public AttentionOperator<T> {
 public:
  /// causal: query i sees keys j ≤ i + (n_k − n_q); chunk: block size of the chunked causal form.
  KernelOperator(FeatureMaps<T> f, bool causal, Index chunk = 64);
  Index rows() const override { return f_.qf.rows(); }
  Index cols() const override { return f_.kf.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override;
  bool rows_are_distributions() const override { return f_.nonnegative; }

  /// The recurrent (RNN) causal output, one position at a time with an O(M·d_v) state.
  MatrixR<T> recurrent_output(const ConstRef<T>& v) const;
  /// The backward pass of apply(v) for the upstream gradient dO = ∂L/∂O: the gradients with respect to the
  /// features, the keys' log-scales and V (the header's note). O(n·M·d_v) work, with a mask O(n·chunk·d_v) more;
  /// no n × n matrix. The recurrent form computes the same function: it shares this (chunked) backward. With a mask
  /// two scans over the blocks (queries forward, keys backward), each split into fixed segments run in parallel
  /// (their totals first), so that the bits do not depend on the thread count.
  /// Into g, with the buffers of ws (both keep their storage across same-shape calls).
  void backward(const ConstRef<T>& v, const ConstRef<T>& d_out, FeatureGradients<T>& g,
                KernelBackwardWorkspace<T>& ws) const;
  /// The features (without a mask the keys' are folded: e^{g_j − M}·kf_j, and the log-scales all M).
  const FeatureMaps<T>& features() const { return f_; }
  bool causal() const { return causal_; }

 private:
  /// The mask of block c's intra-block weights: w(r, t) = e^{g_{j0+t} − M_{i0+r}} for t ≤ r, 0 for t > r.
  void block_mask(Index c, MatrixR<T>& w) const;
  /// Σ_{visible j} (qf_i·kf_j) e^{g_j − M(i)} x_j with the stabilizer M(i) of query i's block.
  MatrixR<T> unnormalized(const MatrixR<T>& qf, const MatrixR<T>& kf, const ConstRef<T>& x) const;
  /// Key features scaled by e^{g − m}, rows [first, first + count).
  MatrixR<T> scaled_keys(const MatrixR<T>& kf, Index first, Index count, T m) const;
  /// The same into out, with the weights e^{g − m} in w (both keep their storage).
  void scaled_keys_into(Index first, Index count, T m, MatrixR<T>& out, VectorX<T>& w) const;
  /// The masked intra-block weights of block c: (qf_i·kf_j)·e^{g_j − M_i} for the block's keys j ≤ i + offset.
  MatrixR<T> block_weights(const MatrixR<T>& qf, const MatrixR<T>& kf, Index c) const;
  /// Max of g over the keys before block c's own keys (−∞ when there are none).
  T before_block(Index c) const { return before_[std::size_t(c)]; }
  Index blocks() const { return (rows() + chunk_ - 1) / chunk_; }

  FeatureMaps<T> f_;
  bool causal_;
  Index chunk_, offset_;
  VectorX<T> qmax_;         // M_i: stabilizer of query i
  std::vector<T> before_;   // causal: max of g over the keys before each block (blocks() + 1 entries)
  VectorX<T> inv_den_;      // 1 / guarded denominator, per query
  VectorX<T> kweight_;      // no mask: e^{g_j − M}, folded into kf (kept for the backward's ∂L/∂kf)
};

extern template class KernelOperator<float>;
extern template class KernelOperator<double>;

// ---- Kernel (feature-map) attention's streamed output; the operator form is attnlab/operators/kernel.hpp.
/// Features of a block of rows: f (rows × M) and, for keys, the log-scales g (left empty: all zero).
template <typename T>
using BlockFeatures = std::function<void(const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g)>;

/// Buffers of streamed_kernel_output kept between calls (one per OpenMP thread, and the per-chunk partial sums), so
/// that a method run again and again — as a layer runs in a model — allocates nothing in steady state. Without it
/// each call mapped and faulted in fresh feature blocks: with glibc's default allocator that cost Performer 10× its
/// arithmetic at n = 4096 (the buffers are above the mmap threshold and go back to the kernel on free).
/// A method object owns one; it is not shared between concurrent calls.
template <typename T>
struct KernelWorkspace {
  struct Thread {
    MatrixR<T> f;       // a block's features
    VectorX<T> g;       // a block of keys' log-scales
    VectorX<T> w;       // e^{g − m_c}, den, mag
    VectorX<T> den, mag;
  };
  std::vector<Thread> threads;
  std::vector<MatrixR<T>> s;                // per key chunk: ΦᵀV
  std::vector<VectorX<T>> z, zabs;          // per key chunk: Φᵀ1, |Φ|ᵀ1
};

/// The non-causal output of kernel attention, streamed: the same O_i = Σ_j φ(q_i)ᵀψ(k_j)v_j / Σ_j φ(q_i)ᵀψ(k_j) as
/// KernelOperator (same stabilizer M = max_j g_j, same guarded denominators), without the n × M feature matrices:
/// keys in fixed chunks of 2048 rows (in parallel; each chunk's ΦᵀV and Φᵀ1 at its own max, rescaled to M and
/// summed in chunk order, so the bits do not depend on the thread count), then queries in chunks. O((n_q + n_k)·M·d)
/// work, O(threads · 2048 · M) memory for features.
/// `ws`, when given, holds the buffers across calls (else they are made for this call).
/// With a reduced storage's `rounding` (core/precision.hpp): the features in the format (both policies); under eager
/// also the key–value state ΦᵀV, the key sum Φᵀ1, the numerators and the normalisers, divided without the guard (as
/// `(fq @ (fk.T @ v)) / (fq @ fk.sum(0))` divides: x/inf = 0, 0/0 = NaN); under careful those stay in float32 and the
/// guard stands.
template <typename T>
MatrixR<T> streamed_kernel_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                  const BlockFeatures<T>& features, bool nonnegative,
                                  KernelWorkspace<T>* ws = nullptr, const Rounding& rounding = {});

/// Causal kernel attention under an emulated reduced storage (core/precision.hpp): the chunked transcription of the
/// causal form (Katharopoulos et al. 2020 §3.3 by chunks of `chunk` queries, as chunked linear-attention kernels run
/// it), per chunk the masked intra-chunk scores A = φ(Q_c)φ(K_c)ᵀ, then numerators A·V_c + φ(Q_c)·S and normalisers
/// A·1 + φ(Q_c)·z against the state S = Σφ(k)vᵀ, z = Σφ(k) of the earlier keys, which the chunk's keys then join.
/// Both policies store the features, A and the output; eager also the numerators, the normalisers (divided
/// unguarded) and the state after every chunk; careful keeps those in float32, guarded, with the keys' log-scales
/// (Performer) carried against a running maximum. The features are formed once for all rows.
template <typename T>
MatrixR<T> emulated_causal_kernel_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                         const BlockFeatures<T>& features, bool nonnegative, Index chunk,
                                         const Rounding& rounding);

/// The VJP of a BlockFeatures map on a block of rows: given the rows x, the features f they map to (as BlockFeatures
/// made them), df = ∂L/∂f and, for keys, dg = ∂L/∂g (empty for queries), writes dx = ∂L/∂x (rows × d). Called from
/// several OpenMP threads at once, on disjoint blocks.
template <typename T>
using BlockFeaturesBackward = std::function<void(const ConstRef<T>& x, bool keys, const ConstRef<T>& f,
                                                 const ConstRef<T>& df, const ConstVecRef<T>& dg, MutRef<T> dx)>;

/// The backward pass of streamed_kernel_output (the VJP of KernelOperator::backward without a mask, then through
/// the feature maps), streamed: no n × M matrix. Three passes over fixed chunks of rows, each in parallel: keys
/// (S̃ = Ψ̃ᵀ[V, 1], each chunk at its own max of g, rescaled and summed in chunk order as the forward does), queries
/// (O and D from S̃, W̃, R = ΦᵀW̃ per chunk, ∂L/∂φ = W̃S̃ᵀ and dQ), keys again (∂L/∂ψ = [V, 1]Rᵀ, dV = Ψ̃R_v, dK).
/// The chunks do not depend on the thread count, so neither do the gradients' bits. `ws` holds the buffers across
/// calls; only the returned gradients are allocated in steady state.
/// With a reduced storage's `rounding`: the features as the forward stored them, ∂L/∂φ in the format (both
/// policies); under eager also the state [Σφ(k)vᵀ, Σφ(k)], the numerators and normalisers (divided unguarded), the
/// division's gradients and the backward state Σφ(q)W̃ᵀ.
template <typename T>
Gradients<T> streamed_kernel_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                      const ConstRef<T>& d_out, const BlockFeatures<T>& features,
                                      const BlockFeaturesBackward<T>& features_backward, bool nonnegative,
                                      KernelBackwardWorkspace<T>* ws = nullptr, const Rounding& rounding = {});

/// The backward of emulated_causal_kernel_output (a reduced storage, a causal mask): reverse mode through its chunked
/// transcription — the forward again, keeping each chunk's state, scores, numerators and normalisers; then chunk by
/// chunk from the last the division's gradients, the intra-chunk scores' gradient (masked), the backward state
/// ∂L/∂Σφ(k)vᵀ, ∂L/∂Σφ(k) that carries the later chunks' gradients to earlier keys, and the feature maps' VJP.
/// Stored in the format: ∂L/∂(scores) and ∂L/∂φ under both policies (as the forward stores the scores and the
/// features); the division's gradients and the backward state after every chunk under eager. Sequential.
template <typename T>
Gradients<T> emulated_causal_kernel_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                             const ConstRef<T>& d_out, const BlockFeatures<T>& features,
                                             const BlockFeaturesBackward<T>& features_backward, bool nonnegative,
                                             Index chunk, const Rounding& rounding);

/// The causal method's backward: KernelOperator::backward (its chunked prefix sums) into ws, then the feature maps'
/// VJP on fixed chunks of rows in parallel. q and k are the rows op's features were made from; op must be causal
/// (without a mask its key features are folded; streamed_kernel_backward serves that case).
template <typename T>
Gradients<T> kernel_operator_backward(const KernelOperator<T>& op, const ConstRef<T>& q, const ConstRef<T>& k,
                                      const ConstRef<T>& v, const ConstRef<T>& d_out,
                                      const BlockFeaturesBackward<T>& features_backward,
                                      KernelBackwardWorkspace<T>& ws);

}  // namespace attnlab
