// The sliding band local attention and Scatterbrain's exact part attend within (Beltagy et al. 2020, Longformer
// §3.1): query i's keys |j − c_i| ≤ W (causal: c_i − W ≤ j ≤ c_i), c_i = i + (n_k − n_q), the queries aligned to the
// last keys.
#pragma once

#include "attnlab/core/types.hpp"

namespace attnlab {

/// Refuses, before any work, shapes that leave a query's band without a key: without a mask the first
/// n_q − n_k − W queries when n_q > n_k + W (causal: the first n_q − n_k when n_q > n_k). Their softmax would be
/// over nothing.
void require_band_reaches_keys(const char* method, Index nq, Index nk, Index w, bool causal);

}  // namespace attnlab
