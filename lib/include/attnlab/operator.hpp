// Attention matrices as linear operators (the Spectra pattern: algorithm apart from operator).
// Every attention matrix in attnlab — exact softmax, a low-rank factorisation, a sparse pattern — is an
// AttentionOperator with apply (Y = P·X) and apply_transpose (Y = Pᵀ·X). Spectra, error norms and power
// iterations are written once against this interface, so a 32k×32k matrix never has to be formed.
#pragma once

#include "attnlab/types.hpp"

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
  /// Rows [first, first + count) of P as a count×cols() block. The default applies Pᵀ to columns of the
  /// identity; operators that can read rows directly override it.
  virtual MatrixR<T> row_block(Index first, Index count) const;
  /// True when every row of P is a probability distribution (non-negative, sums to one), as softmax rows
  /// are; false for methods whose P̃ can have negative entries or unnormalized rows.
  virtual bool rows_are_distributions() const { return true; }
};

/// P materialized, block of rows by block of rows; refuses (Error) when rows()×cols() does not fit in memory.
template <typename T>
MatrixR<T> materialize(const AttentionOperator<T>& op);

/// A dense matrix seen as an operator. Holds its own copy.
template <typename T>
class DenseOperator final : public AttentionOperator<T> {
 public:
  explicit DenseOperator(MatrixR<T> p, bool distributions = true)
      : p_(std::move(p)), distributions_(distributions) {}
  Index rows() const override { return p_.rows(); }
  Index cols() const override { return p_.cols(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  MatrixR<T> row_block(Index first, Index count) const override;
  bool rows_are_distributions() const override { return distributions_; }
  const MatrixR<T>& matrix() const { return p_; }

 private:
  MatrixR<T> p_;
  bool distributions_;
};

/// P̃ = A·Btᵀ in factored form (A n_q×r, Bt n_k×r): every low-rank method (Nyström, Linformer, kernel feature
/// maps without a mask, the SVD and CUR baselines). Applying costs O((n_q + n_k)·r) per vector.
template <typename T>
class LowRankOperator final : public AttentionOperator<T> {
 public:
  LowRankOperator(MatrixR<T> a, MatrixR<T> bt, bool distributions);
  Index rows() const override { return a_.rows(); }
  Index cols() const override { return bt_.rows(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  MatrixR<T> row_block(Index first, Index count) const override;
  bool rows_are_distributions() const override { return distributions_; }
  Index rank_bound() const { return a_.cols(); }
  const MatrixR<T>& left() const { return a_; }
  const MatrixR<T>& right() const { return bt_; }

 private:
  MatrixR<T> a_, bt_;
  bool distributions_;
};

/// A − B, matrix-free: the operator whose norms are the error norms.
template <typename T>
class DifferenceOperator final : public AttentionOperator<T> {
 public:
  DifferenceOperator(const AttentionOperator<T>& a, const AttentionOperator<T>& b);
  Index rows() const override { return a_.rows(); }
  Index cols() const override { return a_.cols(); }
  MatrixR<T> apply(const ConstRef<T>& x) const override;
  MatrixR<T> apply_transpose(const ConstRef<T>& x) const override;
  MatrixR<T> row_block(Index first, Index count) const override;
  bool rows_are_distributions() const override { return false; }

 private:
  const AttentionOperator<T>& a_;
  const AttentionOperator<T>& b_;
};

extern template class AttentionOperator<float>;
extern template class AttentionOperator<double>;
extern template class DenseOperator<float>;
extern template class DenseOperator<double>;
extern template class LowRankOperator<float>;
extern template class LowRankOperator<double>;
extern template class DifferenceOperator<float>;
extern template class DifferenceOperator<double>;

}  // namespace attnlab
