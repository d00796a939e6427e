// Exact softmax attention, three ways, all with a stable log-sum-exp:
//   1. materialized: P = softmax(scale·QKᵀ [+ causal mask]) (n_q×n_k), O = P·V;
//   2. streaming: O tiled over keys with an online softmax (Milakov & Gimelshein 2018; the FlashAttention
//      recurrence), memory O((n_q + n_k)·d + tile²), never forming P;
//   3. an operator form of P: apply P and Pᵀ to a block of vectors using the row log-sum-exp
//      ℓ_i = log Σ_j exp(s·q_iᵀk_j) computed once, P_ij = exp(s·q_iᵀk_j − ℓ_i).
#pragma once

#include "attnlab/operator.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/options.hpp"
#include "attnlab/types.hpp"

namespace attnlab {

/// P = softmax(scale·QKᵀ [+ mask]), materialized (memory-guarded).
template <typename T>
MatrixR<T> exact_matrix(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts);

/// O = softmax(scale·QKᵀ [+ mask])·V, streaming over key tiles with an online softmax.
template <typename T>
MatrixR<T> exact_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                        const AttentionOptions& opts, Index tile = kDefaultTile, const QueryLayout& layout = {});

/// Row log-sum-exp ℓ_i of the (masked) logits, streaming.
template <typename T>
VectorX<T> exact_row_lse(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                         Index tile = kDefaultTile, const QueryLayout& layout = {});

}  // namespace attnlab
