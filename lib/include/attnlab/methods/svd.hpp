// `svd` — the best rank-R approximation of the exact P, P_R = U_RΣ_RV_Rᵀ: by Eckart & Young 1936 (Mirsky 1960 for
// every unitarily invariant norm) no matrix of rank ≤ R is closer to P in Frobenius or spectral norm, so it is the
// floor every rank-R method is measured against. Computed as P_R = (P·V_R)·V_Rᵀ from the top right singular vectors
// (dense SVD for small n, randomized block Krylov or Lanczos, matrix-free, for large n). Non-causal.
// Backward: refused. It is an analysis floor, not a trainable method: differentiating P_R = P·V_RV_Rᵀ needs the
// derivative of the top-R singular subspace, which couples every kept pair to every dropped one through
// 1/(σ_i² − σ_j²) (i ≤ R < j): the full SVD of P (the matrix-free solvers never form it), and unbounded where
// σ_R ≈ σ_{R+1} (attention matrices' tails are clustered near rounding level).
//   attnlab::SvdOptions o;  o.rank = 32;
//   attnlab::SvdMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "svd:rank=32" builds the same class (make_method reads the spec into SvdOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/lowrank_method.hpp"

namespace attnlab {

/// The top-R singular solver of `svd` (components/spectrum.hpp's SpectrumSolver, in the order the spec lists them).
enum class SvdSolver { Auto, Block, Lanczos, Dense };

struct SvdOptions : MethodOptions<SvdOptions> {
  static constexpr const char* kName = "svd";
  Index rank = 64;
  Index dense_limit = 512;
  SvdSolver solver = SvdSolver::Auto;

  template <class P>
  static void parameters(P& p) {
    p.integer("rank", &SvdOptions::rank, 1, 1 << 20, "rank R")
        .budget(Study("svd", {8, 16, 32, 64, 128}).listed(0).baseline().untimed())  // the Eckart–Young floor
        .within_min_n();
    p.integer("dense_limit", &SvdOptions::dense_limit, 1, 1 << 20,
              "n_k up to which a dense SVD is used; above, the matrix-free solver");
    p.choice("solver", &SvdOptions::solver,
             {{SvdSolver::Auto, "auto"}, {SvdSolver::Block, "block"}, {SvdSolver::Lanczos, "lanczos"},
              {SvdSolver::Dense, "dense"}},
             "top-R solver: auto (dense up to dense_limit, else block Krylov), block, lanczos (Spectra on PᵀP), dense");
  }
  /// The dense path's copies of P, and the factors: the memory guard's estimate (MethodOptions::memory), in
  /// lib/src/methods/svd.cpp.
  std::uint64_t memory(const ProblemSize& size) const;
  /// The method's entry in the registry (lib/src/methods/svd.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class SvdMethod final : public ConfiguredMethod<SvdOptions, LowRankMethod<T>> {
 public:
  using ConfiguredMethod<SvdOptions, LowRankMethod<T>>::ConfiguredMethod;

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
};

extern template class SvdMethod<float>;
extern template class SvdMethod<double>;

}  // namespace attnlab
