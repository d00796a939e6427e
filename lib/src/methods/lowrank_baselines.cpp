// Numerical-analysis references for the low-rank methods; both need the exact P (its rows and columns are read
// from the row log-sum-exp, never forming P whole).
//   svd:rank=R — the best rank-R approximation P_R = U_RΣ_RV_Rᵀ (Eckart–Young–Mirsky): no rank-R matrix is
//                closer to P in Frobenius or spectral norm. P_R = (P·V_R)·V_Rᵀ with V_R the top right singular
//                vectors: dense SVD for small n, randomized block Krylov on P (matrix-free) for large n.
//   cur:columns=C — the classical Nyström / CUR approximation of seed 000's last section (eqs. (12)-(13)):
//                P ≈ P[:,J]·pinv(P[I,J])·P[I,:], I = J for square P, sampled uniformly or by the leverage scores
//                of the rank-C singular subspace (Drineas, Mahoney & Muthukrishnan 2008).
// Both are rank-limited analyses of P itself; a causal P̃ from them would not be causal, so causal is refused.
#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/linalg/pinv.hpp"
#include "attnlab/memory.hpp"
#include "attnlab/methods/cur.hpp"
#include "attnlab/methods/svd.hpp"
#include "lowrank_method.hpp"
#include "attnlab/spectrum.hpp"
#include "attnlab/landmarks.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace attnlab {
namespace {

template <typename T>
class SvdMethod final : public LowRankMethod<T> {
 public:
  using LowRankMethod<T>::LowRankMethod;

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    const SvdOptions o = SvdOptions::from(this->params());  // the spec's values, typed
    const Index r = o.rank;
    require(r <= std::min(q.rows(), k.rows()),
            fmt::format("svd: rank = {} exceeds min(n_q, n_k) = {}", r, std::min(q.rows(), k.rows())));
    const ExactOperator<T> p(q, k, opts);
    TopSingularOptions so;
    so.solver = parse_spectrum_solver(o.solver);
    so.dense_limit = o.dense_limit;
    const TopSingular top = top_singular(p, r, so);
    const MatrixR<T> v = top.right.template cast<T>();
    this->set_factors(p.apply(v), v, false);
    return Status::Success;
  }
};

/// c indices of [0, n) without replacement, with probability ∝ weights (Efraimidis–Spirakis keys u^{1/w}).
std::vector<Index> weighted_sample(const VectorX<double>& w, Index c, Rng& rng) {
  std::vector<std::pair<double, Index>> keys;
  for (Index j = 0; j < w.size(); ++j) {
    const double u = std::max(rng.uniform(), 1e-300);
    keys.emplace_back(w(j) > 0 ? std::log(u) / w(j) : -std::numeric_limits<double>::infinity(), j);
  }
  std::partial_sort(keys.begin(), keys.begin() + c, keys.end(), std::greater<>());
  std::vector<Index> idx;
  for (Index i = 0; i < c; ++i) idx.push_back(keys[std::size_t(i)].second);
  std::sort(idx.begin(), idx.end());
  return idx;
}

template <typename T>
class CurMethod final : public LowRankMethod<T> {
 public:
  using LowRankMethod<T>::LowRankMethod;

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override {
    const CurOptions o = CurOptions::from(this->params());  // the spec's values, typed
    const Index c = o.columns;
    require(c <= std::min(q.rows(), k.rows()),
            fmt::format("cur: columns = {} exceeds min(n_q, n_k) = {}", c, std::min(q.rows(), k.rows())));
    const ExactOperator<T> p(q, k, opts);
    Rng rng(o.seed);
    std::vector<Index> cols, rows;
    if (o.select == "uniform") {
      cols = sample_without_replacement(k.rows(), c, rng);
      rows = q.rows() == k.rows() ? cols : sample_without_replacement(q.rows(), c, rng);
    } else {
      // Leverage scores of the rank-c singular subspaces: ‖V_c[j,:]‖² for columns, ‖U_c[i,:]‖² for rows.
      const TopSingular top = top_singular(p, c);
      cols = weighted_sample(top.right.rowwise().squaredNorm(), c, rng);
      if (q.rows() == k.rows()) {
        rows = cols;
      } else {
        MatrixR<double> u = p.apply(top.right.template cast<T>()).template cast<double>();
        for (Index i = 0; i < c; ++i) u.col(i) /= std::max(top.values(i), 1e-300);
        rows = weighted_sample(u.rowwise().squaredNorm(), c, rng);
      }
    }
    // C = P[:, J] from the row log-sum-exp: exp(s·q_iᵀk_j − ℓ_i).
    const MatrixR<T> kj = take_rows<T>(k, cols);
    MatrixR<T> cm = (q * kj.transpose()) * T(opts.scale);
    cm = (cm.array().colwise() - p.row_lse().array()).exp().matrix();
    MatrixR<T> rm(c, k.rows());
    for (Index i = 0; i < c; ++i) rm.row(i) = p.row_block(rows[std::size_t(i)], 1);
    MatrixR<T> w(c, c);
    for (Index j = 0; j < c; ++j) w.col(j) = rm.col(cols[std::size_t(j)]);
    // pinv(P[I,J]) with singular values below rcond·σ_max dropped: with rcond at rounding level (the formula
    // as written) a nearly singular P[I,J] — clustered attention has rank ≈ clusters < C — amplifies noise.
    MatrixR<T> a = cm * svd_pinv<T>(w, o.rcond);
    this->set_factors(std::move(a), rm.transpose(), false);
    return Status::Success;
  }
};

}  // namespace

MethodDescriptor SvdOptions::descriptor() {
  return describe<SvdMethod>(
      kName, "best rank-R approximation of the exact P (Eckart–Young floor; non-causal)",
      "Eckart & Young 1936; P_R = U_RΣ_RV_Rᵀ", Causal::refused("a rank-R approximation of all of P"),
      {ParamSpec::integer("rank", 64, 1, 1 << 20, "rank R").budget(),
       ParamSpec::integer("dense_limit", 512, 1, 1 << 20,
                          "n_k up to which a dense SVD is used; above, the matrix-free solver"),
       ParamSpec::choice("solver", {"auto", "block", "lanczos", "dense"},
                         "top-R solver: auto (dense up to dense_limit, else block Krylov), block, lanczos "
                         "(Spectra on PᵀP), dense")})
      .with_memory([](const Params& p, const ProblemSize& s) -> std::uint64_t {
        const std::string& solver = p.choice("solver");
        const bool dense = solver == "dense" ||
                           (solver == "auto" && (s.n_k <= p.integer("dense_limit") || p.integer("rank") > s.n_k / 2));
        // The dense path: P in T, its float64 copy and the SVD's working copy; the factors are n × R.
        const std::uint64_t factors = matrix_bytes(std::uint64_t(s.n_q + s.n_k), std::uint64_t(p.integer("rank")),
                                                   s.elem);
        return add_bytes(dense ? matrix_bytes(s.n_q, s.n_k, s.elem + 16) : 0, factors);
      })
      .with_size_check([](const Params& p, const ProblemSize& s) {
        require_budget_within("svd", "rank", p.integer("rank"), std::min(s.n_q, s.n_k), "min(n_q, n_k)");
      });
}

MethodDescriptor CurOptions::descriptor() {
  return describe<CurMethod>(
      kName, "classical Nyström / CUR of the exact P: P[:,J]·pinv(P[I,J])·P[I,:] (non-causal)",
      "Drineas, Mahoney & Muthukrishnan 2008 (CUR, leverage-score sampling); the Nyström form of Xiong et al. 2021",
      Causal::refused("columns and rows of all of P"),
      {ParamSpec::integer("columns", 64, 1, 1 << 20, "number of sampled columns (and rows) C").budget(),
       ParamSpec::choice("select", {"uniform", "leverage"}, "sampling of J (and I)"),
       ParamSpec::real("rcond", 1e-10, 0, 1, "relative singular-value cutoff of pinv(P[I,J]) (0: eps·C)"),
       ParamSpec::seed()})
      .with_memory([](const Params& p, const ProblemSize& s) -> std::uint64_t {
        // Leverage scores come from the top C singular vectors: a dense SVD of P (in T, float64 and the SVD's
        // copy) where top_singular's defaults choose it (n_k ≤ 512, or C > n_k/2). The factors are n × C.
        const Index c = p.integer("columns");
        const bool dense = p.choice("select") == "leverage" && (s.n_k <= 512 || c > s.n_k / 2);
        return add_bytes(dense ? matrix_bytes(s.n_q, s.n_k, s.elem + 16) : 0,
                         matrix_bytes(std::uint64_t(2 * (s.n_q + s.n_k)), std::uint64_t(c), s.elem));
      })
      .with_size_check([](const Params& p, const ProblemSize& s) {
        require_budget_within("cur", "columns", p.integer("columns"), std::min(s.n_q, s.n_k), "min(n_q, n_k)");
      });
}

ATTNLAB_TYPED_METHOD_DEFINE(Svd)

ATTNLAB_TYPED_METHOD_DEFINE(Cur)

}  // namespace attnlab
