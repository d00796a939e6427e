// Exact attention's backward pass in O(n) memory (Dao 2023, FlashAttention-2, Algorithm 2), on the tiler the forward
// kernels use (detail/exact_tiler.hpp), so that it masks and scales exactly as they do. With S = s·QKᵀ (+ mask),
// P = softmax(S) row-wise and O = PV:
//   dV = Pᵀ dO,   dP = dO Vᵀ,   dS_ij = P_ij (dP_ij − D_i) with D_i = Σ_j P_ij dP_ij = rowsum(dO ∘ O)_i,
//   dQ = s·dS K,  dK = s·dSᵀ Q.
// P is formed again tile by tile from the forward's row log-sum-exp ℓ (P_ij = exp(S_ij − ℓ_i)), never stored.
#include "attnlab/operators/exact.hpp"

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "detail/exact_tiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace attnlab {

template <typename T>
Gradients<T> exact_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& out,
                            const VectorX<T>& row_lse, const ConstRef<T>& d_out, const AttentionOptions& opts,
                            Index tile, const QueryLayout& layout) {
  detail::validate(q.rows(), q.cols(), k.rows(), k.cols(), opts, layout);
  validate_v(k.rows(), v.rows());
  detail::checked_tile(tile);
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), dv = v.cols();
  require(out.rows() == nq && out.cols() == dv && d_out.rows() == nq && d_out.cols() == dv,
          fmt::format("exact backward: O and dO must be {}×{} (n_q × d_v), got {}×{} and {}×{}", nq, dv, out.rows(),
                      out.cols(), d_out.rows(), d_out.cols()));
  require(row_lse.size() == nq, fmt::format("exact backward: {} row log-sum-exps for {} queries", row_lse.size(), nq));
  const detail::Tiler<T> t(q, k, opts, layout);
  const T scale = t.scale;
  const VectorX<T> dsum = (d_out.array() * out.array()).rowwise().sum();  // D_i

  Gradients<T> g;
  g.dk.setZero(nk, d);
  g.dv.setZero(nk, dv);
  const Index ntiles = (nk + tile - 1) / tile;
  const Index groups = std::min<Index>(kBackwardGroups, ntiles);
  std::vector<MatrixR<T>> dq(std::size_t(std::max<Index>(groups, 1)));
#pragma omp parallel
  {
    MatrixR<T> p, dp;
#pragma omp for schedule(dynamic)
    for (Index grp = 0; grp < groups; ++grp) {
      MatrixR<T>& dq_g = dq[std::size_t(grp)];
      dq_g.setZero(nq, d);
      // Key tiles grp, grp + groups, ...: interleaved, so that under a causal mask (early keys are seen by more
      // queries) the groups carry similar work.
      for (Index jt = grp; jt < ntiles; jt += groups) {
        if (cancel_requested()) break;  // thrown after the parallel region
        const Index j0 = jt * tile, bj = std::min(tile, nk - j0);
        for (Index i0 = t.query_begin(j0); i0 < nq; i0 += tile) {
          const Index bi = std::min(tile, nq - i0);
          t.logits(i0, bi, j0, bj, p);
          for (Index r = 0; r < bi; ++r) t.exp_row(p, r, i0 + r, j0, row_lse(i0 + r));  // masked entries: 0
          g.dv.middleRows(j0, bj).noalias() += p.transpose() * d_out.middleRows(i0, bi);
          dp.resize(bi, bj);
          dp.noalias() = d_out.middleRows(i0, bi) * v.middleRows(j0, bj).transpose();
          // dS = P ∘ (dP − D), scaled by s here once instead of on both products.
          p.array() *= (dp.array().colwise() - dsum.segment(i0, bi).array()) * scale;
          dq_g.middleRows(i0, bi).noalias() += p * k.middleRows(j0, bj);
          g.dk.middleRows(j0, bj).noalias() += p.transpose() * q.middleRows(i0, bi);
        }
      }
    }
  }
  throw_if_cancelled();
  g.dq = groups > 0 ? std::move(dq[0]) : MatrixR<T>::Zero(nq, d);
  for (Index grp = 1; grp < groups; ++grp) g.dq += dq[std::size_t(grp)];
  return g;
}

#define ATTNLAB_INSTANTIATE_EXACT_BACKWARD(T)                                                                   \
  template Gradients<T> exact_backward<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&,         \
                                          const ConstRef<T>&, const VectorX<T>&, const ConstRef<T>&,          \
                                          const AttentionOptions&, Index, const QueryLayout&);
ATTNLAB_INSTANTIATE_EXACT_BACKWARD(float)
ATTNLAB_INSTANTIATE_EXACT_BACKWARD(double)

}  // namespace attnlab
