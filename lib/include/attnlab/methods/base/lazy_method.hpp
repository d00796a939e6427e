// Shared base of the methods whose output is computed from Q, K and V directly (blocked or streamed kernels) while
// P̃ as an operator is needed only for analysis (metrics, spectra, the matrix): compute() keeps the inputs, and the
// operator is built on first use, so the hot path never forms it. Used by the pattern methods (local, sparse,
// Reformer) and the kernel feature-map methods (linear, taylor, Performer).
#pragma once

#include "attnlab/core/method.hpp"

#include <memory>

namespace attnlab {

template <typename T>
class LazyOperatorMethod : public Method<T> {
 public:
  using Method<T>::Method;

 protected:
  /// Builds P̃'s operator from queries(), keys() and this->options() (valid once compute() has returned).
  virtual std::unique_ptr<AttentionOperator<T>> build_op() const = 0;
  /// Keeps the inputs (O(n·d)) and drops the operator of an earlier compute(); call from do_compute.
  void keep(const ConstRef<T>& q, const ConstRef<T>& k) {
    q_ = q;
    k_ = k;
    op_.reset();
  }
  const AttentionOperator<T>& do_op() const override {
    if (!op_) op_ = build_op();
    return *op_;
  }
  const MatrixR<T>& queries() const { return q_; }
  const MatrixR<T>& keys() const { return k_; }

 private:
  MatrixR<T> q_, k_;
  mutable std::unique_ptr<AttentionOperator<T>> op_;  // built on first use
};

}  // namespace attnlab
