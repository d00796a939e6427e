// Shared base of the methods whose P̃ is a factored product A·Btᵀ (Nyström, Linformer, efficient, SVD, CUR).
// Two ways to hand over the factors:
//  - set_factors(A, Bt): built in do_compute; the operator and the output P̃·V = A(BtᵀV) follow;
//  - defer_factors(rank): the method keeps the pieces its own do_output needs (its fast path, which may
//    associate differently or stream), and make_factors() builds A and Bt only when the operator is asked for
//    (metrics, spectra, the matrix), so the hot path never forms an n×rank factor it does not need.
#pragma once

#include "attnlab/core/error.hpp"
#include "attnlab/core/method.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/operators/low_rank.hpp"

#include <optional>
#include <string>
#include <utility>

namespace attnlab {

template <typename T>
class LowRankMethod : public Method<T> {
 public:
  using Method<T>::Method;
  Index rank_bound() const override { return op_ ? op_->rank_bound() : deferred_rank_; }

 protected:
  void set_factors(MatrixR<T> a, MatrixR<T> bt, bool distributions) {
    op_.emplace(std::move(a), std::move(bt), distributions);
    deferred_rank_ = -1;
  }
  void defer_factors(Index rank, bool distributions) {
    op_.reset();
    deferred_rank_ = rank;
    distributions_ = distributions;
  }
  /// The factors (A, Bt) of a deferred compute; called once, on first use of the operator.
  virtual std::pair<MatrixR<T>, MatrixR<T>> make_factors() const {
    throw Error("internal: deferred factors without make_factors()");
  }
  const AttentionOperator<T>& do_op() const override { return factors(); }
  /// A·(Btᵀ·V). Under an emulated reduced storage (core/precision.hpp) the generic form of a set_factors method: the
  /// factors as the method formed them (float32), then stored in the format (both policies), the state Btᵀ·V stored
  /// under eager (an accumulator), the product's sums in float32. Methods with their own do_output emulate there.
  MatrixR<T> do_output(const ConstRef<T>& v) const override {
    const Rounding r = this->rounding_hook();
    if (!r.active()) return this->do_op().apply(v);
    const LowRankOperator<T>& f = factors();
    MatrixR<T> a = f.left(), bt = f.right();
    r(a, Held::tensor, "factors A, B");
    r(bt, Held::tensor, "factors A, B");
    MatrixR<T> state = bt.transpose() * v;
    r(state, Held::accumulator, "state BᵀV");
    return a * state;
  }
  /// The factored operator (A, Bt), formed on first use for a deferred compute: what a backward pass of
  /// set_factors' methods reads (efficient's softmax₂(Q) and softmax₁(K)).
  const LowRankOperator<T>& factors() const {
    if (!op_) {
      auto [a, bt] = make_factors();
      op_.emplace(std::move(a), std::move(bt), distributions_);
    }
    return *op_;
  }

 private:
  mutable std::optional<LowRankOperator<T>> op_;
  Index deferred_rank_ = -1;
  bool distributions_ = false;
};

}  // namespace attnlab
