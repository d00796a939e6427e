// Top-k singular triplets of an attention operator by randomized block Krylov iteration (Halko, Martinsson &
// Tropp 2011, Alg. 4.4 with the Krylov basis of Musco & Musco 2015), restarted thickly when the basis is full.
//
// Why blocks: for an exact attention operator one product P·X costs a pass over every logit tile (2n²d flops
// and n² exps) whatever the width of X, so applying P to b vectors at once pays the logits and the exp once per
// b vectors. Lanczos on PᵀP (Spectra, one vector per product) pays them once per vector.
//
// The iteration keeps an orthonormal basis V (n×B) of the right Krylov space and, from the products already paid
// for, W = A·V and Z = Aᵀ·W. Rayleigh–Ritz is the SVD of the small problem A·V = W = Ũ Σ Yᵀ (Householder QR of W,
// then the SVD of R): Ritz values σ_j, right vectors v_j = V y_j, left vectors u_j = Ũ e_j, with A v_j = σ_j u_j
// exactly. The residual of the other half,
//     r_j = ‖Aᵀu_j − σ_j v_j‖ = ‖Z y_j − σ_j² V y_j‖ / σ_j,
// costs no product, and (u_j, σ_j, v_j) is an exact singular triplet of some A + E with ‖E‖₂ ≤ r_j; the value
// error is at most r_j, and r_j²/gap when σ_j is separated from the rest of the spectrum by `gap`. The solver
// stops when r_j ≤ tol·σ_1 for j = 1 … k (a Ritz value at or below tol·σ_1 is at the noise floor: A v_j = σ_j u_j
// already says ‖A v_j‖ ≤ tol·σ_1, and r_j is reported as σ_j). The next block is the part of the newest Z block
// orthogonal to the basis (block Gram–Schmidt, twice); when the basis would exceed `max_basis`, it is cut to the
// k + b leading Ritz vectors (W and Z cut with it, so no product is repeated) — a thick restart.
#pragma once

#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/core/operator.hpp"

#include <cstdint>

namespace attnlab {

struct BlockKrylovOptions {
  Index block = 0;          ///< vectors per product (0: k + max(8, k/4))
  Index max_basis = 0;      ///< basis columns before a thick restart (0: max(k + 3b, 6b))
  Index max_passes = 400;   ///< products with A or Aᵀ (each over a whole block) before giving up
  double tol = 1e-9;        ///< stop when every r_j ≤ tol·σ_1, j ≤ k (raised to 1e-5 for float operators)
  std::uint64_t seed = 0;   ///< the Gaussian starting block
};

template <typename T>
class BlockKrylovSvd {
 public:
  explicit BlockKrylovSvd(BlockKrylovOptions opts = {}) : opts_(opts) {}
  /// Top k triplets of `a`. Throws Error for k out of range; a run that exhausts max_passes ends with
  /// info() == NoConvergence and the best Ritz triplets so far (their residuals say how good they are).
  BlockKrylovSvd& compute(const AttentionOperator<T>& a, Index k);
  Status info() const { return status_; }
  const VectorX<double>& singularValues() const { return values_; }  ///< descending, k of them
  const MatrixR<double>& rightVectors() const { return right_; }      ///< cols()×k
  const MatrixR<double>& leftVectors() const { return left_; }        ///< rows()×k
  const VectorX<double>& residuals() const { return residuals_; }     ///< r_j as above
  Index passes() const { return passes_; }          ///< block products with A or Aᵀ
  Index iterations() const { return iterations_; }  ///< Rayleigh–Ritz steps
  Index restarts() const { return restarts_; }
  Index block() const { return block_; }
  double tolerance() const { return tol_; }

 private:
  BlockKrylovOptions opts_;
  Status status_ = Status::NotComputed;
  VectorX<double> values_, residuals_;
  MatrixR<double> right_, left_;
  Index passes_ = 0, iterations_ = 0, restarts_ = 0, block_ = 0;
  double tol_ = 0;
};

extern template class BlockKrylovSvd<float>;
extern template class BlockKrylovSvd<double>;

}  // namespace attnlab
