// The one interface every attention method implements (the faiss pattern: one family, one interface,
// and the exact method is a member of the family and the ground truth).
//
// A method sees attention as a linear map of V: given Q and K (and the options), it builds the attention
// matrix it implies, P̃(Q, K); its output for values V is P̃·V. So, as an Eigen solver:
//   method.compute(Q, K, options);   // fit landmarks, features, codebooks, ... (data-dependent state)
//   method.output(V);                // fast path, the method's own complexity
//   method.op();                     // P̃ as an operator (apply, apply_transpose), for spectra and norms
//   method.matrix();                 // P̃ materialized, for small problems (memory-guarded)
#pragma once

#include "attnlab/core/gradients.hpp"
#include "attnlab/core/operator.hpp"
#include "attnlab/core/options.hpp"
#include "attnlab/core/spec.hpp"
#include "attnlab/core/types.hpp"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

struct MethodDescriptor;

/// An output checked for the failures reduced precision brings: non-finite entries and rows of zeros (a row of zeros
/// where attention averages values is the silent failure: x/inf = 0).
struct OutputCheck {
  std::uint64_t entries = 0, nonfinite = 0, rows = 0, zero_rows = 0;
};
template <typename T>
OutputCheck check_output(const ConstRef<T>& out) {
  OutputCheck c;
  c.entries = std::uint64_t(out.size());
  c.rows = std::uint64_t(out.rows());
  for (Index i = 0; i < out.rows(); ++i) {
    bool zero = out.cols() > 0;
    for (Index j = 0; j < out.cols(); ++j) {
      if (!std::isfinite(out(i, j))) ++c.nonfinite;
      if (out(i, j) != T(0)) zero = false;
    }
    c.zero_rows += zero;
  }
  return c;
}

/// The base of every method: the protocol (checks, the causal refusal, compute()/info()) over the method's typed
/// options, which only the method's class holds (ConfiguredMethod, methods/base/configured_method.hpp).
template <typename T>
class Method {
 public:
  explicit Method(const MethodDescriptor& descriptor);
  virtual ~Method() = default;
  Method(const Method&) = delete;
  Method& operator=(const Method&) = delete;

  const std::string& name() const;
  /// The parameters' values as a spec holds them, written from the method's typed options (the one copy).
  virtual Params params() const = 0;
  /// The canonical specification, every parameter written out: replays the same method.
  std::string spec() const;
  /// Whether this instance honours a causal mask (the descriptor's flag unless a method narrows it by parameter).
  virtual bool supports_causal() const;

  /// Fits the method to (Q, K). Throws Error for mismatched shapes, bad options, or a causal mask the
  /// method cannot honour (it is refused, never silently leaked).
  Method& compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts = {});
  Status info() const { return status_; }

  /// O = P̃·V by the method's fast path.
  MatrixR<T> output(const ConstRef<T>& v) const;
  /// P̃ as an operator. Valid while the method lives and is not recomputed.
  const AttentionOperator<T>& op() const;
  /// P̃ materialized (n_q×n_k); refuses when it would not fit in memory.
  MatrixR<T> matrix() const;
  /// The backward pass of output(V): given the upstream gradient dO = dL/dO (n_q × d_v), the vector–Jacobian
  /// products dL/dQ, dL/dK, dL/dV of this method's own forward, with the Q and K of compute() and its causal mask.
  /// Random parameters (features, projections, sampled landmarks) and piecewise-constant choices (buckets, top-u
  /// selections, codeword assignments) are held at their fitted values: the gradient of the attention given those
  /// choices (each method's header says what it holds fixed; `attnlab methods` lists it). Throws Error for a method
  /// that defines none (the message says why), for shapes that do not match, or before compute().
  Gradients<T> backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const;
  /// Data-dependent state fitted on all keys before the attention (VQ's codebook): a look-ahead outside the
  /// attention itself, described here ("" when there is none). With a causal mask the attention given that state
  /// is causal; the state is not.
  virtual std::string lookahead() const { return ""; }
  /// Under a reduced storage (AttentionOptions::storage): what rounding did to each intermediate of the last compute(),
  /// the last output() after it and the last backward() after that (core/precision.hpp), in the order they were
  /// stored; a call made again replaces its tallies, it does not add to them. Empty when native.
  std::vector<RoundingLog::Entry> rounding() const { return rounding_.entries(); }
  /// What the last output() returned, checked under a reduced storage (check_output). The no-silent-NaN rule: the
  /// caller reports these; `--fail-on-nonfinite` makes the command fail on them.
  OutputCheck output_check() const { return output_check_; }
  /// What the last backward() returned (dQ, dK and dV together), checked the same way under a reduced storage.
  OutputCheck gradient_check() const { return gradient_check_; }
  /// Method-specific numbers worth recording beside the errors (e.g. Nyström's ‖I − AZ‖_F), as (name, value).
  virtual std::vector<std::pair<std::string, double>> diagnostics() const { return {}; }
  /// Bytes this method forms on a problem of `size` beyond its inputs and its output, known before any work (its
  /// options' memory(): exact:impl=materialized, svd's dense path, ...; 0 for the methods linear in n).
  virtual std::uint64_t memory_estimate(const ProblemSize& size) const = 0;
  /// Throws Error when the method cannot apply to a problem of `size` for a reason beyond its parameters' declared
  /// limits (its options' check_size(): vq's codebook file against the keys' dimension), before any work.
  virtual void check_size(const ProblemSize& size) const = 0;
  /// An upper bound on rank(P̃) (landmarks, features, ...), or -1 when the method is not rank-limited.
  virtual Index rank_bound() const { return -1; }

  Index n_q() const { return n_q_; }
  Index n_k() const { return n_k_; }
  const AttentionOptions& options() const { return opts_; }
  /// Throws Error for a reduced storage and policy this method does not emulate: what its descriptor says for every
  /// parameter value (check_storage), then what its own parameters rule out (check_params_storage). compute() calls
  /// it; so do the callers that refuse before any work (the command, compare, the Python module). Native: nothing.
  void check_storage_support(Storage storage, Policy policy) const;

 protected:
  /// The parameter-dependent part of check_storage_support (Performer's eager emulation follows the reference code's
  /// positive features only); the default rules nothing out.
  virtual void check_params_storage(Storage /*storage*/, Policy /*policy*/) const {}
  /// Builds the state; opts.scale is already resolved. Returns the status (Success unless an inner
  /// iteration failed to converge or a numerical issue was detected).
  virtual Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) = 0;
  /// The operator form of P̃, built by do_compute.
  virtual const AttentionOperator<T>& do_op() const = 0;
  /// Fast path; the default applies the operator.
  virtual MatrixR<T> do_output(const ConstRef<T>& v) const { return do_op().apply(v); }
  /// Materialized P̃; the default densifies the operator block by block.
  virtual MatrixR<T> do_matrix() const { return materialize(do_op()); }
  /// The backward pass (shapes already checked); the default refuses with the descriptor's reason.
  virtual Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const;
  void check_gradient_shapes(const Gradients<T>& g, Index dv) const;
  /// The rounding of this call's storage and policy, tallied into rounding(): the kernels' hook (a no-op when native).
  Rounding rounding_hook() const { return {opts_.storage, opts_.policy, &rounding_}; }

 private:
  void require_computed(const char* what) const;
  const MethodDescriptor& descriptor_;
  Status status_ = Status::NotComputed;
  AttentionOptions opts_;
  Index n_q_ = 0, n_k_ = 0;
  mutable RoundingLog rounding_;
  mutable OutputCheck output_check_, gradient_check_;
};

extern template class Method<float>;
extern template class Method<double>;

}  // namespace attnlab
