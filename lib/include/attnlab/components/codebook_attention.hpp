// Transformer-VQ's attention for a given codebook (Lingle 2023): keys replaced by their nearest codes,
// K̂ = ΔC, computed as exp(s·QCᵀ)(ΔᵀV) / exp(s·QCᵀ)(Δᵀ1) in O(n·c·d); causal by running per-code sums of values
// and counts. The `vq` method fits C by k-means on the keys and calls this; with a codebook learned elsewhere
// (as in a trained Transformer-VQ) the causal form has no look-ahead at all.
#pragma once

#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/core/operator.hpp"
#include "attnlab/core/options.hpp"

#include <memory>

namespace attnlab {

template <typename T>
std::unique_ptr<AttentionOperator<T>> codebook_attention(const ConstRef<T>& q, const ConstRef<T>& k,
                                                         const ConstRef<T>& codebook, const AttentionOptions& opts);

}  // namespace attnlab
