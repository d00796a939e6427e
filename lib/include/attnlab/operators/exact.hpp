// The exact softmax attention matrix P = softmax(scale·QKᵀ [+ causal mask]) as an operator: keeps Q, K and the
// row log-sum-exp ℓ_i, applies P and Pᵀ tile by tile with P_ij = exp(s·q_iᵀk_j − ℓ_i), never forms P.
#pragma once

#include "attnlab/core/operator.hpp"
#include "attnlab/core/gradients.hpp"
#include "attnlab/core/options.hpp"
#include "attnlab/core/precision.hpp"
#include "attnlab/core/types.hpp"
#include <mutex>
#include <vector>

namespace attnlab {

/// Where the rows of Q sit in the full query sequence, for the causal mask: row r is query positions[r] of
/// n_q_full (ascending). Empty: row r is query r of Q itself. Used by methods that compute exact rows for a
/// subset of the queries (ProbSparse).
struct QueryLayout {
  std::vector<Index> positions;
  Index n_q_full = -1;
};

/// Default tile edge of the streaming kernels: a tile² logit block of float64 is 512 KiB.
constexpr Index kDefaultTile = 256;
/// Keys per group of exact_output's split-KV path (few queries over many keys).
constexpr Index kSplitKeys = 2048;

/// The exact attention matrix as an operator; keeps copies of Q and K (O((n_q + n_k)·d)) and the row
/// log-sum-exp, never P.
template <typename T>
class ExactOperator final : public AttentionOperator<T> {
 public:
  ExactOperator(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                Index tile = kDefaultTile, QueryLayout layout = {});
  Index rows() const override { return q_.rows(); }
  Index cols() const override { return k_.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  void row_block_into(Index first, Index count, MatrixR<T>& out) const override;
  /// The row log-sum-exp ℓ, computed on first use (one streaming pass) and kept.
  const VectorX<T>& row_lse() const;
  const MatrixR<T>& queries() const { return q_; }
  const MatrixR<T>& keys() const { return k_; }
  const AttentionOptions& options() const { return opts_; }

 private:
  MatrixR<T> q_, k_;
  AttentionOptions opts_;
  Index tile_;
  QueryLayout layout_;
  mutable std::once_flag lse_once_;
  mutable VectorX<T> lse_;
};

extern template class ExactOperator<float>;
extern template class ExactOperator<double>;

// ---- Exact softmax attention, three ways, all with a stable log-sum-exp:
/// P = softmax(scale·QKᵀ [+ mask]), materialized (memory-guarded).
/// With a reduced storage's `rounding` (core/precision.hpp): the logits as Tiler::logits stores them (eager) and P
/// (both policies) in the format; the softmax's max, exponentials and sum in float32, as torch.softmax takes them.
template <typename T>
MatrixR<T> exact_matrix(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                        const Rounding& rounding = {});

/// O = softmax(scale·QKᵀ [+ mask])·V, streaming over key tiles with an online softmax. With `row_lse`, also the
/// rows' log-sum-exp ℓ_i that the pass forms anyway (what the backward needs: Dao 2023, FlashAttention-2, Alg. 1).
/// Few queries over many keys (n_q ≤ tile, n_k ≥ 2·kSplitKeys: ProbSparse's selected rows, decoding), natively: the
/// keys split into fixed groups of kSplitKeys, each group's online softmax in parallel, the groups' (m, ℓ, acc) merged
/// in group order (split-KV, as FlashDecoding does) — one query tile would otherwise keep one thread busy and the
/// rest waiting; the groups are fixed, so the sums do not depend on the thread count.
/// With a reduced storage's `rounding`: each tile of P in the format before its product with V (both policies, as
/// FlashAttention-2 converts P for its second product); under eager also the logits, the running sums ℓ and the
/// running accumulator after every tile; under careful those stay in float32. The final O is the caller's to round.
template <typename T>
MatrixR<T> exact_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                        const AttentionOptions& opts, Index tile = kDefaultTile, const QueryLayout& layout = {},
                        VectorX<T>* row_lse = nullptr, const Rounding& rounding = {});

/// Row log-sum-exp ℓ_i of the (masked) logits, streaming.
template <typename T>
VectorX<T> exact_row_lse(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                         Index tile = kDefaultTile, const QueryLayout& layout = {});

// ---- Backward
/// The vector–Jacobian products of O = softmax(s·QKᵀ [+ mask])·V for the upstream gradient dO, in O(n) memory
/// (Dao 2023, FlashAttention-2, Algorithm 2): the logit tiles are formed again from Q, K and the forward's row
/// log-sum-exp ℓ, P_ij = exp(s·q_iᵀk_j − ℓ_i), D_i = rowsum(dO ∘ O)_i, and per tile
///   dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D),  dQ += s·dS K,  dK += s·dSᵀ Q   (10·n_q·n_k·d flops with d_v = d);
/// causal tiles above the diagonal are skipped. `out` and `row_lse` are the forward's (exact_output with row_lse).
/// Parallel over key tiles in kBackwardGroups fixed interleaved groups, each with its own dQ accumulator summed in
/// group order: the result does not depend on the number of threads; the extra memory is kBackwardGroups·n_q·d.
template <typename T>
Gradients<T> exact_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& out,
                            const VectorX<T>& row_lse, const ConstRef<T>& d_out, const AttentionOptions& opts,
                            Index tile = kDefaultTile, const QueryLayout& layout = {}, const Rounding& rounding = {});

/// Groups of key tiles in exact_backward (a constant, not the thread count, so that its sums are reproducible).
constexpr Index kBackwardGroups = 4;

/// The buffers of exact_backward_add and exact_backward_few_keys, kept across calls by a method that runs them on
/// its sub-problems step after step (Nyström, Linformer, ProbSparse): in steady state they allocate nothing. Every
/// fresh n × d buffer is mapped and faulted in page by page (~8 µs a page in a VM: a third to a half of those
/// methods' backward went to the page faults and zeroing of intermediates). One workspace per caller; not shared
/// between concurrent calls.
template <typename T>
struct ExactBackwardWorkspace {
  struct Thread {
    MatrixR<T> p, dp;  // a tile's P (then dS) and dP
    VectorX<T> d;      // a block's row maxima, then sums, then D_i
  };
  std::vector<Thread> threads;     // by omp_get_thread_num()
  std::vector<MatrixR<T>> dq;      // exact_backward_add: dQ of the key groups after the first
  std::vector<MatrixR<T>> dk, dv;  // exact_backward_few_keys: dK, dV of each group of query blocks
  VectorX<T> dsum;                 // D_i = rowsum(dO ∘ O)_i
  MatrixR<T> out;                  // exact_backward_set with n_k > kFewKeys: the forward's O and ℓ, formed again
  VectorX<T> lse;
};

/// exact_backward's vector–Jacobian products ADDED to the caller's dq (n_q × d), dk (n_k × d), dv (n_k × d_v), with
/// its buffers in `ws`: a method that calls exact attention's backward on a sub-problem (ProbSparse's selected rows)
/// writes into its own result without n × d temporaries. The same kernel and the same sums as exact_backward
/// (parallel over key tiles in kBackwardGroups fixed groups; group 0 adds straight into dq, the others into their
/// own partial, added to dq in group order): on zeroed dq, dk, dv the bits are exact_backward's, whatever the
/// thread count. With a reduced storage's `rounding` (core/precision.hpp), as FlashAttention-2 stores them: each
/// tile of P and of dS in the format (both policies: the tiles it converts for its products); under eager also the
/// logits, D_i, dP and the running dQ, dK, dV after every tile (careful keeps those in float32).
template <typename T>
void exact_backward_add(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& out,
                        const VectorX<T>& row_lse, const ConstRef<T>& d_out, const AttentionOptions& opts,
                        MutRef<T> dq, MutRef<T> dk, MutRef<T> dv, ExactBackwardWorkspace<T>& ws,
                        Index tile = kDefaultTile, const QueryLayout& layout = {}, const Rounding& rounding = {});

/// Keys up to which exact_backward_few_keys is meant (its blocks of rows hold all keys at once).
constexpr Index kFewKeys = 1024;
/// Fixed groups of query blocks in exact_backward_few_keys (a constant, so that its sums are reproducible).
constexpr Index kFewKeysGroups = 8;

/// The backward of non-causal exact attention over few keys (n_k ≤ kFewKeys: Nyström's m landmark keys, Linformer's
/// k projected keys), for many queries. FlashAttention-2's tiling (exact_backward) puts all those keys in one tile,
/// which leaves its parallel loop over key tiles one tile to share, and it needs the forward's O and ℓ (a forward
/// pass again).
/// Here the queries go in fixed blocks of rows, in parallel, each block's softmax formed whole (dense GEMMs and a
/// softmax backward, as autograd does it, never more than a block of rows × n_k):
///   P = softmax(s·Q_b Kᵀ),  dP = dO_b Vᵀ,  D_i = Σ_j P_ij dP_ij (= rowsum(dO ∘ O)_i),  dS = P ∘ (dP − D),
///   dQ_b = s·dS K,  dK = Σ_b s·dS_bᵀ Q_b,  dV = Σ_b P_bᵀ dO_b.
/// Block b belongs to group b mod kFewKeysGroups; each group sums its blocks in order and the groups are summed in
/// group order: the bits do not depend on the thread count. dq, dk and dv are SET (not added to).
template <typename T>
void exact_backward_few_keys(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                             const ConstRef<T>& d_out, const AttentionOptions& opts, MutRef<T> dq, MutRef<T> dk,
                             MutRef<T> dv, ExactBackwardWorkspace<T>& ws);

/// Non-causal exact attention's backward on a sub-problem of a method (Nyström's F·W over m landmark keys,
/// Linformer's (Q, EK, FV) over k projected keys), dq, dk, dv SET: exact_backward_few_keys when n_k ≤ kFewKeys,
/// otherwise the forward's O and ℓ formed again and exact_backward_add on zeroed buffers.
template <typename T>
void exact_backward_set(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& d_out,
                        const AttentionOptions& opts, MutRef<T> dq, MutRef<T> dk, MutRef<T> dv,
                        ExactBackwardWorkspace<T>& ws);

}  // namespace attnlab
