// Singular-value spectra of attention matrices: all of them from a dense SVD (Eigen's BDCSVD), or the top k of
// any attention operator — exact, approximate, or their difference — matrix-free, never forming the matrix:
//   block   — randomized block Krylov (components/block_krylov.hpp): one pass over the logit tiles applies P to a
//             whole block of vectors; stops on the residuals ‖Aᵀu − σv‖ ≤ tol·σ_1 (the default above dense_limit);
//   lanczos — Spectra's SymEigsSolver on AᵀA, one vector per product (kept to compare the two in one run).
#pragma once

#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/core/operator.hpp"

#include <cstdint>
#include <string>

namespace attnlab {

/// Every singular value of a materialized matrix, descending (computed in double).
template <typename T>
VectorX<double> singular_values(const ConstRef<T>& a);

enum class SpectrumSolver { Auto, Dense, Block, Lanczos };
/// "auto", "dense", "block", "lanczos"; Error otherwise.
SpectrumSolver parse_spectrum_solver(const std::string& name);
const char* spectrum_solver_name(SpectrumSolver s);

struct TopSingularOptions {
  SpectrumSolver solver = SpectrumSolver::Auto;  ///< Auto: dense when cols ≤ dense_limit or k > cols/2, else block
  Index dense_limit = 512;
  double tol = 1e-9;        ///< block: residual bound relative to σ_1; lanczos: Spectra's relative eigenvalue tol
  Index block = 0;          ///< block: vectors per product (0: the solver's default)
  Index max_passes = 400;   ///< block: products before giving up
  std::uint64_t seed = 0;   ///< block: the starting block
};

/// The top k singular triplets of an operator.
struct TopSingular {
  VectorX<double> values;     ///< descending
  MatrixR<double> right;      ///< columns are v_1 … v_k
  VectorX<double> residuals;  ///< ‖Aᵀu_j − σ_j v_j‖ (block), ‖AᵀAv_j − σ_j²v_j‖/σ_j (lanczos), 0 (dense)
  Index iterations = 0;       ///< Rayleigh–Ritz steps (block), restarts (lanczos)
  Index products = 0;         ///< passes over the operator (P or Pᵀ applied to one block or one vector)
  Index vectors = 0;          ///< vectors the operator was applied to, in all
  SpectrumSolver solver = SpectrumSolver::Dense;
};

/// Top k singular values and right vectors of `a`. Throws Error when k is out of range or the iterative solver
/// does not reach its tolerance (the message gives the largest residual reached).
template <typename T>
TopSingular top_singular(const AttentionOperator<T>& a, Index k, const TopSingularOptions& opts = {});

}  // namespace attnlab
