// Attention matrices as linear operators (the Spectra pattern: algorithm apart from operator).
// Every attention matrix in attnlab — exact softmax, a low-rank factorisation, a sparse pattern — is an
// AttentionOperator with apply (Y = P·X) and apply_transpose (Y = Pᵀ·X). Spectra, error norms and power
// iterations are written once against this interface, so a 32k×32k matrix never has to be formed.
#pragma once

#include "attnlab/core/types.hpp"
#include <memory>

namespace attnlab {

template <typename T>
class AttentionOperator {
 public:
  using Scalar = T;
  virtual ~AttentionOperator() = default;

  virtual Index rows() const = 0;
  virtual Index cols() const = 0;
  /// Y = P·X, X is cols()×b.
  virtual MatrixR<T> apply(const ConstRef<T>& x) const = 0;
  /// Y = Pᵀ·X, X is rows()×b.
  virtual MatrixR<T> apply_transpose(const ConstRef<T>& x) const = 0;
  /// Rows [first, first + count) of P as a new count×cols() block (row_block_into into a fresh matrix).
  MatrixR<T> row_block(Index first, Index count) const;
  /// The same rows into `out`, resized to count×cols(): a caller walking P block by block (the error metrics) keeps
  /// one buffer instead of a fresh allocation a block, which glibc maps and unmaps (page faults) for blocks over its
  /// mmap threshold. The one way an operator gives its rows: the default applies Pᵀ to columns of the identity;
  /// operators that can read rows directly override it.
  virtual void row_block_into(Index first, Index count, MatrixR<T>& out) const;
  /// True when every row of P is a probability distribution (non-negative, sums to one), as softmax rows
  /// are; false for methods whose P̃ can have negative entries or unnormalized rows.
  virtual bool rows_are_distributions() const { return true; }
};

/// P materialized, block of rows by block of rows; refuses (Error) when rows()×cols() does not fit in memory.
template <typename T>
MatrixR<T> materialize(const AttentionOperator<T>& op);

extern template class AttentionOperator<float>;
extern template class AttentionOperator<double>;

}  // namespace attnlab
