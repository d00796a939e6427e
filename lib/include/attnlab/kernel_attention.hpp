// Kernel (feature-map) attention's streamed output; the operator form is attnlab/operators/kernel.hpp.
#pragma once

#include "attnlab/operators/kernel.hpp"

#include <functional>

namespace attnlab {

/// Features of a block of rows: f (rows × M) and, for keys, the log-scales g (left empty: all zero).
template <typename T>
using BlockFeatures = std::function<void(const ConstRef<T>& x, bool keys, MatrixR<T>& f, VectorX<T>& g)>;

/// The non-causal output of kernel attention, streamed: the same O_i = Σ_j φ(q_i)ᵀψ(k_j)v_j / Σ_j φ(q_i)ᵀψ(k_j) as
/// KernelOperator (same stabilizer M = max_j g_j, same guarded denominators), without the n × M feature matrices:
/// keys in fixed chunks of 2048 rows (in parallel; each chunk's ΦᵀV and Φᵀ1 at its own max, rescaled to M and
/// summed in chunk order, so the bits do not depend on the thread count), then queries in chunks. O((n_q + n_k)·M·d)
/// work, O(threads · 2048 · M) memory for features.
template <typename T>
MatrixR<T> streamed_kernel_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                  const BlockFeatures<T>& features, bool nonnegative);

}  // namespace attnlab
