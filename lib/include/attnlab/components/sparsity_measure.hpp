// Informer's query sparsity measurement (Zhou et al. 2021, eq. (2)), exposed for the experiments:
//   M(q_i, K)  = LSE_j(s·q_iᵀk_j) − mean_j(s·q_iᵀk_j)        (exact, O(n_q·n_k·d))
//   M̄(q_i, K) = max_j(s·q_iᵀk_j) − mean_j(s·q_iᵀk_j)         (over U sampled keys, or all keys)
// Lemma 1: M̄ ≤ M ≤ M̄ + ln n_k over the same keys. With a causal mask both run over the visible keys only.
#pragma once

#include "attnlab/core/options.hpp"
#include "attnlab/core/random.hpp"
#include "attnlab/core/precision.hpp"
#include "attnlab/core/types.hpp"

#include <vector>

namespace attnlab {

enum class SparsityMeasure { MaxMean, Lse };

/// The measure of every query. samples = 0: over all (visible) keys; else U keys per query drawn uniformly with
/// replacement from the visible ones (as the reference code does), from rng.
/// Under an emulated reduced storage (`rounding`, eager policy): each query's logits qᵀk, then s·qᵀk, and its measure
/// are stored in the format as formed (the reference's Q_K_sample and M under .half()), the max and mean in float32.
template <typename T>
VectorX<double> sparsity_measure(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts,
                                 SparsityMeasure kind, Index samples, Rng& rng, const Rounding& rounding = {});

/// u = min(n_q, ⌈c·ln n_q⌉)... as Informer: c·⌈ln n_q⌉ capped at n_q.
Index probsparse_u(Index n_q, double factor);
/// U = c·⌈ln n_k⌉ sampled keys per query (the reference code's default).
Index probsparse_default_samples(Index n_k, double factor);

/// The selected ("active") queries, ascending. Without a mask: the u largest measures (ties by position).
/// With one: query i is selected when its measure is among the u largest of the measures of queries 0…i — a
/// decision a decoder can take at step i. (Informer ranks all queries at once, which lets future keys decide
/// which past queries are exact; that would leak the future.) The causal rule selects about u·(1 + ln(n/u)).
std::vector<Index> select_queries(const VectorX<double>& measure, Index u, bool causal);

}  // namespace attnlab
