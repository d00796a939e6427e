// Kernel (feature-map) attention's streamed output; the operator form is attnlab/operators/kernel.hpp.
#pragma once

#include "attnlab/operators/kernel.hpp"

#include <functional>
#include <vector>

namespace attnlab {

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
template <typename T>
MatrixR<T> streamed_kernel_output(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                                  const BlockFeatures<T>& features, bool nonnegative,
                                  KernelWorkspace<T>* ws = nullptr);

}  // namespace attnlab
