// What defines an attention problem apart from the arrays: the logit scale and the causal mask.
#pragma once

#include "attnlab/core/precision.hpp"
#include "attnlab/core/types.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace attnlab {

/// Options of one attention computation P = softmax(scale·QKᵀ [+ mask]).
struct AttentionOptions {
  /// Logit scale; NaN means the default 1/√d.
  double scale = std::numeric_limits<double>::quiet_NaN();
  /// Causal mask. With n_q ≠ n_k the queries are aligned with the *last* n_q keys (bottom-right, as when
  /// decoding with a key cache): query i sees keys j ≤ i + (n_k − n_q). This needs n_k ≥ n_q so that every
  /// query sees at least one key.
  bool causal = false;
  /// Emulated storage precision (core/precision.hpp): native computes in the method's type and rounds nothing; bf16
  /// and fp16 store the method's tensors in that format over float32 accumulation (Method<float> only), the
  /// intermediates the policy names included. A method that does not emulate it refuses it (`attnlab methods`).
  Storage storage = Storage::native;
  Policy policy = Policy::eager;

  double resolved_scale(Index d) const { return std::isnan(scale) ? 1.0 / std::sqrt(double(d)) : scale; }
};

/// Offset of the causal alignment: query i sees keys j ≤ i + causal_offset(n_q, n_k).
inline Index causal_offset(Index n_q, Index n_k) { return n_k - n_q; }

/// Checks shapes and options of a (Q, K) pair: d of Q equals d of K, sizes positive, scale finite and
/// positive, causal alignment defined. Throws Error naming the mismatch.
void validate_qk(Index n_q, Index d_q, Index n_k, Index d_k, const AttentionOptions& opts);
/// Checks that V has one row per key.
void validate_v(Index n_k, Index v_rows);

}  // namespace attnlab
