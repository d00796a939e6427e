// Pseudo-inverses: the iterative schemes of Nyströmformer and their SVD reference.
//   order3 (Razavi et al. 2014, as Xiong et al. 2021 use it): Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))); with
//          E = I − AZ one step gives E' = ¾E³ + ¼E⁴ (cubic), 4 products per step;
//   newton (Newton–Schulz): Z ← Z(2I − AZ), E' = E² (quadratic), 2 products per step;
//   both from Z₀ = Aᵀ / (‖A‖₁‖A‖∞) (Xiong et al. 2021's initialisation), which makes ‖I − AZ₀‖₂ < 1 for nonsingular A;
//   svd: Moore–Penrose from the SVD, singular values below rcond·σ_max dropped.
// The solver keeps the history of ‖I − AZ_k‖_F (and ‖Z_k − A⁺‖_F when A⁺ is given), for the convergence
// experiments: the paper's 6 iterations are far from converged on badly conditioned landmark matrices.
#pragma once

#include "attnlab/core/precision.hpp"
#include "attnlab/core/types.hpp"

#include <vector>

namespace attnlab {

enum class PinvMethod { Order3, NewtonSchulz, Svd };
PinvMethod parse_pinv_method(const std::string& name);  // "iterative"|"order3", "newton", "svd"

template <typename T>
class Pseudoinverse {
 public:
  Pseudoinverse& setMethod(PinvMethod m) { method_ = m; return *this; }
  /// Number of iterations (iterative methods).
  Pseudoinverse& setIterations(Index k) { iters_ = k; return *this; }
  /// Stop early once ‖I − AZ_k‖_F ≤ tol (0: always run every iteration).
  Pseudoinverse& setTolerance(double tol) { tol_ = tol; return *this; }
  /// Relative cutoff of the SVD method (≤ 0: eps·max(rows, cols)).
  Pseudoinverse& setRcond(double r) { rcond_ = r; return *this; }
  /// A⁺ to measure ‖Z_k − A⁺‖_F against, per iteration (optional).
  Pseudoinverse& setReference(const MatrixR<double>& a_pinv) { reference_ = a_pinv; return *this; }
  /// Emulated reduced storage (core/precision.hpp): the iterative methods store Z₀, every product and every iterate
  /// in the format where `rounding` rounds accumulators (the eager policy: the reference code's iterative_inv run
  /// under .half() stores each one); the SVD method is not emulated (the caller refuses it).
  Pseudoinverse& setRounding(const Rounding& r) { rounding_ = r; return *this; }

  Pseudoinverse& compute(const ConstRef<T>& a);
  Status info() const { return status_; }
  const MatrixR<T>& pseudoinverse() const { return z_; }
  /// ‖I − AZ_k‖_F for k = 0 … iterations() (square A; for the SVD method a single entry).
  const std::vector<double>& residuals() const { return residuals_; }
  /// ‖Z_k − A⁺‖_F for k = 0 … iterations(), when a reference was set.
  const std::vector<double>& errors() const { return errors_; }
  Index iterations() const { return Index(residuals_.size()) - 1; }

 private:
  PinvMethod method_ = PinvMethod::Order3;
  Index iters_ = 6;
  double tol_ = 0;
  double rcond_ = -1;
  MatrixR<double> reference_;
  Rounding rounding_{};
  MatrixR<T> z_;
  std::vector<double> residuals_, errors_;
  Status status_ = Status::NotComputed;
};

/// Moore–Penrose pseudo-inverse by SVD (in double), cutoff rcond·σ_max (≤ 0: eps_T·max(rows, cols)).
template <typename T>
MatrixR<T> svd_pinv(const ConstRef<T>& a, double rcond = -1);

/// The backward pass of the pseudo-inverse Pseudoinverse::compute forms (tolerance 0): the vector–Jacobian product
/// dA = (∂Z/∂A)ᵀ[dZ] of Z = Z(A) for an upstream dZ = dL/dZ (cols(A) × rows(A)), evaluated in float64 whatever T
/// (as svd_pinv): the derivative of the same map at the same A, without the rounding that K reverse steps of
/// float32 m×m products would add.
///  - order3 / newton: the derivative of what `iterations` steps compute (not of the converged A⁺): reverse-mode
///    through every step (Razavi et al. 2014; Xiong et al. 2021 eq. (16)) and through the initial
///    Z₀ = Aᵀ/(‖A‖₁‖A‖∞), whose maximizing column (‖A‖₁) and row (‖A‖∞) are held fixed (piecewise-constant
///    choices) while their sums of |A| are differentiated. The steps are formed again from Z₀, their intermediates
///    (AZ and the factors) kept for the way back: every step's when they fit in 64 MiB (O(K·m²) memory, the
///    forward's products once more); beyond that from √K checkpoints (K = iterations: O(√K·m²) memory, the
///    forward's products twice). Pass Pseudoinverse::iterations().
///  - svd (square A): with nothing below the cutoff, the derivative of the inverse, dA = −Zᵀ dZ Zᵀ. With singular
///    values dropped, Z = Σ_{σ_i > cut} v_i u_iᵀ/σ_i is the pseudo-inverse of the rank-r truncation, and the
///    gradient is that of the singular-value function f(σ) = 1/σ (kept), 0 (dropped) with the kept set held fixed:
///    in the SVD A = UΣVᵀ, dA = U Ω̄ Vᵀ, Ḡ = Uᵀ dZᵀ V, Ω̄_ij = α_ij (Ḡ_ij + Ḡ_ji)/2 + β_ij (Ḡ_ij − Ḡ_ji)/2 with
///    α_ij = (f_i − f_j)/(σ_i − σ_j), β_ij = (f_i + f_j)/(σ_i + σ_j), Ω̄_ii = f'(σ_i) Ḡ_ii (the derivative of a
///    spectral function of the singular values; for kept i, j it reduces to −Ḡ_ji/(σ_iσ_j), the inverse's).
///    Its size grows like 1/(σ_r(σ_r − σ_{r+1})): where kept and dropped values meet it is as ill-conditioned as
///    the truncation is discontinuous. Non-square A is refused.
template <typename T>
MatrixR<T> pinv_backward(const ConstRef<T>& a, const ConstRef<T>& d_z, PinvMethod method, Index iterations,
                         double rcond = -1);

/// pinv_backward under an emulated reduced storage (Nyström's emulated backward; r active): order3 / newton in
/// float32 — the forward's iterates formed again as Pseudoinverse::compute stores them with setRounding(r), every
/// gradient product and sum of the reverse steps stored under r's eager policy (careful: float32); svd, or r
/// inactive, as pinv_backward.
MatrixR<float> pinv_backward_emulated(const ConstRef<float>& a, const ConstRef<float>& d_z, PinvMethod method,
                                      Index iterations, const Rounding& r);

/// Asymptotic convergence order from an error history: the median of log(e_{k+1}/e_k) / log(e_k/e_{k−1}) over
/// the steps where the errors lie in [floor, ceiling] (the asymptotic regime above rounding).
double convergence_order(const std::vector<double>& errors, double floor = 1e-12, double ceiling = 1e-1);

extern template class Pseudoinverse<float>;
extern template class Pseudoinverse<double>;

}  // namespace attnlab
