// Error metrics between an exact and an approximate attention: on the attention matrices (dense or
// operators, evaluated block of rows by block of rows so that P is never formed whole) and on outputs.
#pragma once

#include "attnlab/analysis/norms.hpp"
#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/core/operator.hpp"
#include "attnlab/core/types.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {

/// Errors of P̃ against P.
struct MatrixErrors {
  double fro = 0;           ///< ‖P − P̃‖_F
  double rel_fro = 0;       ///< ‖P − P̃‖_F / ‖P‖_F
  double max_abs = 0;       ///< max_ij |P_ij − P̃_ij|
  /// Mean over rows of KL(P_i ‖ P̃_i) = Σ_j P_ij log(P_ij / P̃_ij); +∞ when P̃ puts zero mass where P does not.
  /// Only when P̃'s rows are distributions.
  std::optional<double> mean_kl;
  /// Mean over rows of the total variation ½ Σ_j |P_ij − P̃_ij|. Only when P̃'s rows are distributions.
  std::optional<double> mean_tv;
  std::optional<double> spectral;      ///< ‖P − P̃‖₂ (when asked for)
  std::optional<double> rel_spectral;  ///< ‖P − P̃‖₂ / ‖P‖₂
  /// When a spectral norm stopped short of its tolerance: the larger residual of the two, over ‖P‖₂ (a bound on
  /// the absolute error of rel_spectral's numerator and denominator alike).
  std::optional<double> spectral_residual;
};

struct MatrixErrorOptions {
  Index block_rows = 256;     ///< rows evaluated at a time
  bool spectral = true;       ///< also the spectral norms (matrix-free, block Krylov)
  /// Tolerance for calling P̃'s rows distributions: entries ≥ −tol and |row sum − 1| ≤ tol.
  double distribution_tol = -1;  ///< −1: 1e-4 in float32, 1e-9 in float64
  /// ‖P‖₂ of `exact` (spectral_norm(exact)) where the caller has it: a Reference computes it once for all the
  /// methods measured against it, instead of once per method (each a block Krylov solve of exact attention, which
  /// recomputes exp(QKᵀ) at every product). Unset: computed here.
  std::optional<SpectralNormResult> exact_spectral;
};

template <typename T>
MatrixErrors matrix_errors(const AttentionOperator<T>& exact, const AttentionOperator<T>& approx,
                           const MatrixErrorOptions& opts = {});

/// Errors of an approximate output Õ against the exact O.
struct OutputErrors {
  double rel_fro = 0;      ///< ‖O − Õ‖_F / ‖O‖_F
  double max_abs = 0;      ///< max |O − Õ|
  double mean_cosine = 0;  ///< mean over rows of cos(O_i, Õ_i) (rows that are both zero count as 1)
  double min_cosine = 0;
};

template <typename T>
OutputErrors output_errors(const ConstRef<T>& exact, const ConstRef<T>& approx);

/// The errors as (metric name, value) in the order results files use: out_rel_fro, out_max_abs,
/// out_mean_cosine, out_min_cosine.
std::vector<std::pair<std::string, double>> named_metrics(const OutputErrors& e);
/// P_rel_fro, P_max_abs, then P_rel_spectral, P_mean_kl, P_mean_tv where computed.
std::vector<std::pair<std::string, double>> named_metrics(const MatrixErrors& e);

/// −Σ_ij P_ij log P_ij (nats; 0 log 0 = 0) over a block of rows of P: divided by the rows, the mean row entropy.
double entropy_sum(const MatrixR<double>& p);

/// P's mean row entropy (nats) and ‖P‖_F², read `block` rows at a time (P is never formed whole).
struct RowStats {
  double mean_entropy = 0, fro2 = 0;
};
RowStats row_stats(const AttentionOperator<double>& p, Index block = 128);

}  // namespace attnlab
