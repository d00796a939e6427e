// Error metrics. Matrix errors walk P and P̃ a block of rows at a time (row_block), so the memory is
// O(block·n_k) whatever n is; all sums are in double.
#include "attnlab/analysis/metrics.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/analysis/norms.hpp"
#include "attnlab/operators/difference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace attnlab {

namespace {
/// Rows [first, first + count) of P in double, into `out`: written in place when T is double, else read into
/// `scratch` and converted. Both buffers are the caller's, kept across blocks.
template <typename T>
void row_block_double(const AttentionOperator<T>& op, Index first, Index count, MatrixR<T>& scratch,
                      MatrixR<double>& out) {
  if constexpr (std::is_same_v<T, double>) {
    op.row_block_into(first, count, out);
  } else {
    op.row_block_into(first, count, scratch);
    out = scratch.template cast<double>();
  }
}
}  // namespace

template <typename T>
MatrixErrors matrix_errors(const AttentionOperator<T>& exact, const AttentionOperator<T>& approx,
                           const MatrixErrorOptions& opts) {
  require(exact.rows() == approx.rows() && exact.cols() == approx.cols(),
          "cannot compare a {}×{} attention matrix with a {}×{} one", exact.rows(), exact.cols(),
          approx.rows(), approx.cols());
  const double tol = opts.distribution_tol >= 0 ? opts.distribution_tol : (sizeof(T) == 4 ? 1e-4 : 1e-9);
  const Index n = exact.rows(), block = std::max<Index>(1, opts.block_rows);
  double diff2 = 0, ref2 = 0, max_abs = 0, kl = 0, tv = 0;
  bool distributions = approx.rows_are_distributions();
  // The block buffers live across the blocks: a block of 256 rows of n = 2048 is 4 MiB, which glibc would otherwise
  // map and unmap (page faults) for every block; the sums are the same either way.
  MatrixR<double> p, a, d;
  MatrixR<T> scratch;
  for (Index i0 = 0; i0 < n; i0 += block) {
    const Index b = std::min(block, n - i0);
    row_block_double<T>(exact, i0, b, scratch, p);
    row_block_double<T>(approx, i0, b, scratch, a);
    d = p - a;
    diff2 += d.squaredNorm();
    ref2 += p.squaredNorm();
    max_abs = std::max(max_abs, d.cwiseAbs().maxCoeff());
    if (!distributions) continue;
    for (Index r = 0; r < b; ++r) {
      // Check P̃'s rows really are distributions before reading KL/TV off them.
      if (a.row(r).minCoeff() < -tol || std::fabs(a.row(r).sum() - 1.0) > tol) {
        distributions = false;
        break;
      }
      double row_kl = 0;
      for (Index j = 0; j < a.cols(); ++j) {
        const double pj = p(r, j);
        if (pj <= 0) continue;
        const double aj = a(r, j);
        row_kl += aj > 0 ? pj * std::log(pj / aj) : std::numeric_limits<double>::infinity();
      }
      kl += row_kl;
      tv += 0.5 * d.row(r).cwiseAbs().sum();
    }
  }
  MatrixErrors e;
  e.fro = std::sqrt(diff2);
  e.rel_fro = e.fro / std::sqrt(ref2);
  e.max_abs = max_abs;
  if (distributions) {
    // KL is ≥ 0; rounding can make a tiny negative sum when P̃ ≈ P.
    e.mean_kl = std::max(0.0, kl / double(n));
    e.mean_tv = tv / double(n);
  }
  if (opts.spectral) {
    const SpectralNormResult ref = opts.exact_spectral ? *opts.exact_spectral : spectral_norm(exact);
    SpectralNormResult diff;
    diff.converged = true;
    if (e.fro > 0) {
      DifferenceOperator<T> dop(exact, approx);
      diff = spectral_norm(dop);
    }
    e.spectral = diff.value;
    e.rel_spectral = diff.value / ref.value;
    if (!ref.converged || !diff.converged)
      e.spectral_residual = std::max(ref.converged ? 0.0 : ref.residual, diff.converged ? 0.0 : diff.residual) /
                            ref.value;
  }
  return e;
}

template <typename T>
OutputErrors output_errors(const ConstRef<T>& exact, const ConstRef<T>& approx) {
  require(exact.rows() == approx.rows() && exact.cols() == approx.cols(),
          "cannot compare a {}×{} output with a {}×{} one", exact.rows(), exact.cols(), approx.rows(),
          approx.cols());
  const MatrixR<double> o = exact.template cast<double>();
  const MatrixR<double> a = approx.template cast<double>();
  OutputErrors e;
  const double ref = o.norm();
  e.rel_fro = ref > 0 ? (o - a).norm() / ref : (o - a).norm();
  e.max_abs = o.rows() ? (o - a).cwiseAbs().maxCoeff() : 0.0;
  double sum = 0, mn = 1;
  for (Index i = 0; i < o.rows(); ++i) {
    const double no = o.row(i).norm(), na = a.row(i).norm();
    double c;
    if (no == 0 && na == 0) c = 1;
    else if (no == 0 || na == 0) c = 0;
    else c = std::clamp(o.row(i).dot(a.row(i)) / (no * na), -1.0, 1.0);
    sum += c;
    mn = std::min(mn, c);
  }
  e.mean_cosine = o.rows() ? sum / double(o.rows()) : 1.0;
  e.min_cosine = mn;
  return e;
}

std::vector<std::pair<std::string, double>> named_metrics(const OutputErrors& e) {
  return {{"out_rel_fro", e.rel_fro}, {"out_max_abs", e.max_abs}, {"out_mean_cosine", e.mean_cosine},
          {"out_min_cosine", e.min_cosine}};
}

std::vector<std::pair<std::string, double>> named_metrics(const MatrixErrors& e) {
  std::vector<std::pair<std::string, double>> v = {{"P_rel_fro", e.rel_fro}, {"P_max_abs", e.max_abs}};
  if (e.rel_spectral) v.emplace_back("P_rel_spectral", *e.rel_spectral);
  if (e.spectral_residual) v.emplace_back("P_spectral_residual", *e.spectral_residual);
  if (e.mean_kl) v.emplace_back("P_mean_kl", *e.mean_kl);
  if (e.mean_tv) v.emplace_back("P_mean_tv", *e.mean_tv);
  return v;
}

template MatrixErrors matrix_errors<float>(const AttentionOperator<float>&, const AttentionOperator<float>&,
                                           const MatrixErrorOptions&);
template MatrixErrors matrix_errors<double>(const AttentionOperator<double>&, const AttentionOperator<double>&,
                                            const MatrixErrorOptions&);
template OutputErrors output_errors<float>(const ConstRef<float>&, const ConstRef<float>&);
template OutputErrors output_errors<double>(const ConstRef<double>&, const ConstRef<double>&);

double entropy_sum(const MatrixR<double>& p) { return -(p.array() * p.array().max(1e-300).log()).sum(); }

RowStats row_stats(const AttentionOperator<double>& p, Index block) {
  RowStats s;
  const Index n = p.rows();
  MatrixR<double> rows;   // kept across blocks, as in matrix_errors
  for (Index i = 0; i < n; i += block) {
    p.row_block_into(i, std::min(block, n - i), rows);
    s.mean_entropy += entropy_sum(rows);
    s.fro2 += rows.squaredNorm();
  }
  s.mean_entropy /= double(n);
  return s;
}

}  // namespace attnlab
