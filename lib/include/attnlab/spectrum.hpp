// Singular-value spectra of attention matrices: all of them from a dense SVD (Eigen's BDCSVD), or the top k of
// any attention operator — exact, approximate, or their difference — matrix-free with Spectra (Lanczos on the
// Gram operator AᵀA), never forming the matrix.
#pragma once

#include "attnlab/operator.hpp"

namespace attnlab {

/// Every singular value of a materialized matrix, descending (computed in double).
template <typename T>
VectorX<double> singular_values(const ConstRef<T>& a);

/// The top k singular triplets of an operator: values (descending) and right singular vectors (cols×k).
struct TopSingular {
  VectorX<double> values;
  MatrixR<double> right;  ///< columns are v_1 … v_k
  Index iterations = 0;
};

/// Top k singular values and right vectors of `a`, matrix-free (Spectra SymEigsSolver on AᵀA). Dense SVD when
/// the operator is small (cols ≤ dense_limit). Throws Error when k is out of range or Lanczos fails.
template <typename T>
TopSingular top_singular(const AttentionOperator<T>& a, Index k, Index dense_limit = 512, double tol = 1e-10);

}  // namespace attnlab
