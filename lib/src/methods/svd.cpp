// `svd` — the best rank-R approximation of the exact P (Eckart & Young 1936; Mirsky 1960):
//   P_R = U_RΣ_RV_Rᵀ = (P·V_R)·V_Rᵀ,
// no matrix of rank ≤ R closer to P in Frobenius or spectral norm. V_R, the top right singular vectors, from a dense
// SVD for small n, randomized block Krylov on P (matrix-free) or Lanczos on PᵀP for large n. P's rows are read from
// the row log-sum-exp, never forming P whole on the matrix-free paths. A rank-limited analysis of all of P: a causal
// P̃ from it would not be causal, so causal is refused.
#include "attnlab/methods/svd.hpp"

#include "attnlab/components/spectrum.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/operators/exact.hpp"

namespace attnlab {
namespace {

SpectrumSolver spectrum_solver(SvdSolver s) {
  switch (s) {
    case SvdSolver::Auto: return SpectrumSolver::Auto;
    case SvdSolver::Block: return SpectrumSolver::Block;
    case SvdSolver::Lanczos: return SpectrumSolver::Lanczos;
    case SvdSolver::Dense: return SpectrumSolver::Dense;
  }
  throw Error("svd: unknown solver");
}

}  // namespace

MethodDescriptor SvdOptions::registry_entry() {
  return describe<SvdMethod, SvdOptions>(
      "best rank-R approximation of the exact P (Eckart–Young floor; non-causal)",
      "Eckart & Young 1936; P_R = U_RΣ_RV_Rᵀ", Causal::refused("a rank-R approximation of all of P"))
      .with_backward(Backward::refused(
          "an analysis floor, not a trainable method: the derivative of the rank-R truncation needs every singular "
          "pair of P (terms 1/(σ_i² − σ_j²), i ≤ R < j) and is unbounded where σ_R ≈ σ_{R+1}"))
      .with_storage(StorageEmulation::both(
          "an analysis floor: its factors (P·V_R, V_R from the SVD of P in float32 from the stored Q, K) stored in "
          "the format (both policies), O too; eager also the state V_Rᵀ·V; careful keeps it in float32"));
}

std::uint64_t SvdOptions::memory(const ProblemSize& s) const {
  const bool dense =
      solver == SvdSolver::Dense || (solver == SvdSolver::Auto && (s.n_k <= dense_limit || rank > s.n_k / 2));
  // The dense path: P in T, its float64 copy and the SVD's working copy; the factors are n × R.
  const std::uint64_t factors = matrix_bytes(std::uint64_t(s.n_q + s.n_k), std::uint64_t(rank), s.elem);
  return add_bytes(dense ? matrix_bytes(s.n_q, s.n_k, s.elem + 16) : 0, factors);
}

template <typename T>
Status SvdMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const Index r = this->o_.rank;  // ≤ min(n_q, n_k): its declared limit (svd.hpp), checked by compute()
  const ExactOperator<T> p(q, k, opts);
  TopSingularOptions so;
  so.solver = spectrum_solver(this->o_.solver);
  so.dense_limit = this->o_.dense_limit;
  const TopSingular top = top_singular(p, r, so);
  const MatrixR<T> v = top.right.template cast<T>();
  this->set_factors(p.apply(v), v, false);
  return Status::Success;
}

template class SvdMethod<float>;
template class SvdMethod<double>;

}  // namespace attnlab
