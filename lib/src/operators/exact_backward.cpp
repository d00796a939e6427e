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

#include <omp.h>

#include <algorithm>
#include <vector>

namespace attnlab {

template <typename T>
void exact_backward_add(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& out,
                        const VectorX<T>& row_lse, const ConstRef<T>& d_out, const AttentionOptions& opts,
                        MutRef<T> dq, MutRef<T> dk, MutRef<T> dv, ExactBackwardWorkspace<T>& ws, Index tile,
                        const QueryLayout& layout, const Rounding& rounding) {
  detail::validate(q.rows(), q.cols(), k.rows(), k.cols(), opts, layout);
  validate_v(k.rows(), v.rows());
  detail::checked_tile(tile);
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), dv_cols = v.cols();
  require(out.rows() == nq && out.cols() == dv_cols && d_out.rows() == nq && d_out.cols() == dv_cols,
          "exact backward: O and dO must be {}×{} (n_q × d_v), got {}×{} and {}×{}", nq, dv_cols,
          out.rows(), out.cols(), d_out.rows(), d_out.cols());
  require(row_lse.size() == nq, "exact backward: {} row log-sum-exps for {} queries", row_lse.size(), nq);
  require(dq.rows() == nq && dq.cols() == d && dk.rows() == nk && dk.cols() == d && dv.rows() == nk &&
              dv.cols() == dv_cols,
          "exact backward: dQ, dK, dV must have the shapes of Q, K, V");
  detail::Tiler<T> t(q, k, opts, layout);
  t.rounding = rounding;  // eager: the logits stored as formed (the forward's Tiler::logits)
  const T scale = t.scale;
  ws.dsum.resize(nq);
  ws.dsum = (d_out.array() * out.array()).rowwise().sum();  // D_i
  rounding(ws.dsum, Held::accumulator, "D = rowsum(dO ∘ O)");
  const VectorX<T>& dsum = ws.dsum;
  // Emulated storage: a block of rows rounded row by row (the blocks of dq, dk, dv may be strided).
  const auto store = [&](auto block, Held h, const char* what) {
    if (!rounding.rounds(h)) return;
    for (Index r = 0; r < block.rows(); ++r) rounding.span(&block(r, 0), std::size_t(block.cols()), h, what);
  };

  const Index ntiles = (nk + tile - 1) / tile;
  const Index groups = std::min<Index>(kBackwardGroups, ntiles);
  ws.dq.resize(std::size_t(std::max<Index>(groups - 1, 0)));
  ws.threads.resize(std::size_t(std::max(1, omp_get_max_threads())));
#pragma omp parallel
  {
    auto& th = ws.threads[std::size_t(omp_get_thread_num())];
    MatrixR<T>& p = th.p;
    MatrixR<T>& dp = th.dp;
#pragma omp for schedule(dynamic)
    for (Index grp = 0; grp < groups; ++grp) {
      // Group 0 adds into dq itself; the others into their own partial, added in group order below.
      MatrixR<T>* part = grp == 0 ? nullptr : &ws.dq[std::size_t(grp - 1)];
      if (part) part->setZero(nq, d);
      MutRef<T> dq_g = part ? MutRef<T>(*part) : dq;
      // Key tiles grp, grp + groups, ...: interleaved, so that under a causal mask (early keys are seen by more
      // queries) the groups carry similar work.
      for (Index jt = grp; jt < ntiles; jt += groups) {
        if (cancel_requested()) break;  // thrown after the parallel region
        const Index j0 = jt * tile, bj = std::min(tile, nk - j0);
        for (Index i0 = t.query_begin(j0); i0 < nq; i0 += tile) {
          const Index bi = std::min(tile, nq - i0);
          t.logits(i0, bi, j0, bj, p);
          for (Index r = 0; r < bi; ++r) t.exp_row(p, r, i0 + r, j0, row_lse(i0 + r));  // masked entries: 0
          rounding(p, Held::tensor, "probabilities P");
          dv.middleRows(j0, bj).noalias() += p.transpose() * d_out.middleRows(i0, bi);
          store(dv.middleRows(j0, bj), Held::accumulator, "running dQ, dK, dV");
          dp.resize(bi, bj);
          dp.noalias() = d_out.middleRows(i0, bi) * v.middleRows(j0, bj).transpose();
          rounding(dp, Held::accumulator, "dP = dO·Vᵀ");
          // dS = P ∘ (dP − D), scaled by s here once instead of on both products.
          p.array() *= (dp.array().colwise() - dsum.segment(i0, bi).array()) * scale;
          rounding(p, Held::tensor, "dS = P ∘ (dP − D)");
          dq_g.middleRows(i0, bi).noalias() += p * k.middleRows(j0, bj);
          store(dq_g.middleRows(i0, bi), Held::accumulator, "running dQ, dK, dV");
          dk.middleRows(j0, bj).noalias() += p.transpose() * q.middleRows(i0, bi);
          store(dk.middleRows(j0, bj), Held::accumulator, "running dQ, dK, dV");
        }
      }
    }
  }
  throw_if_cancelled();
  for (Index grp = 1; grp < groups; ++grp) {
    dq += ws.dq[std::size_t(grp - 1)];
    store(dq, Held::accumulator, "running dQ, dK, dV");
  }
}

template <typename T>
Gradients<T> exact_backward(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& out,
                            const VectorX<T>& row_lse, const ConstRef<T>& d_out, const AttentionOptions& opts,
                            Index tile, const QueryLayout& layout, const Rounding& rounding) {
  Gradients<T> g;
  g.dq.setZero(q.rows(), q.cols());
  g.dk.setZero(k.rows(), k.cols());
  g.dv.setZero(v.rows(), v.cols());
  ExactBackwardWorkspace<T> ws;
  exact_backward_add<T>(q, k, v, out, row_lse, d_out, opts, g.dq, g.dk, g.dv, ws, tile, layout, rounding);
  return g;
}

namespace {

/// Rows per block of exact_backward_few_keys: a block's logits (rows × n_k) about 64 Ki entries, 32 to 512 rows — a
/// function of n_k alone, so the blocks (and the sums) do not depend on the thread count.
Index few_keys_rows(Index nk) { return std::clamp<Index>(Index(65536) / std::max<Index>(nk, 1), 32, 512); }

}  // namespace

template <typename T>
void exact_backward_few_keys(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                             const ConstRef<T>& d_out, const AttentionOptions& opts, MutRef<T> dq, MutRef<T> dk,
                             MutRef<T> dv, ExactBackwardWorkspace<T>& ws) {
  require(!opts.causal, "exact backward over few keys: non-causal only");
  detail::validate(q.rows(), q.cols(), k.rows(), k.cols(), opts);
  validate_v(k.rows(), v.rows());
  const Index nq = q.rows(), nk = k.rows(), d = q.cols(), dv_cols = v.cols();
  require(d_out.rows() == nq && d_out.cols() == dv_cols,
          "exact backward: dO must be {}×{} (n_q × d_v), got {}×{}", nq, dv_cols, d_out.rows(),
          d_out.cols());
  require(dq.rows() == nq && dq.cols() == d && dk.rows() == nk && dk.cols() == d && dv.rows() == nk &&
              dv.cols() == dv_cols,
          "exact backward: dQ, dK, dV must have the shapes of Q, K, V");
  const T scale = T(opts.resolved_scale(d));
  const Index rows = few_keys_rows(nk), blocks = (nq + rows - 1) / rows;
  const Index groups = std::max<Index>(1, std::min(kFewKeysGroups, blocks));
  ws.dk.resize(std::size_t(groups));
  ws.dv.resize(std::size_t(groups));
  ws.threads.resize(std::size_t(std::max(1, omp_get_max_threads())));
#pragma omp parallel
  {
    auto& th = ws.threads[std::size_t(omp_get_thread_num())];
    th.p.resize(rows, nk);  // kept from call to call: a resize to the same size allocates nothing
    th.dp.resize(rows, nk);
    th.d.resize(rows);
#pragma omp for schedule(dynamic)
    for (Index grp = 0; grp < groups; ++grp) {
      MatrixR<T>& dk_g = ws.dk[std::size_t(grp)];
      MatrixR<T>& dv_g = ws.dv[std::size_t(grp)];
      dk_g.setZero(nk, d);
      dv_g.setZero(nk, dv_cols);
      for (Index b = grp; b < blocks; b += groups) {
        if (cancel_requested()) break;  // thrown after the parallel region
        const Index i0 = b * rows, bi = std::min(rows, nq - i0);
        auto p = th.p.topRows(bi);
        auto dp = th.dp.topRows(bi);
        auto dsum = th.d.head(bi);
        const auto qb = q.middleRows(i0, bi);
        const auto dob = d_out.middleRows(i0, bi);
        // P = softmax(s·Q_b Kᵀ) row by row, its max subtracted first (as the forward's stable softmax).
        p.noalias() = qb * k.transpose();
        p *= scale;
        dsum = p.rowwise().maxCoeff();
        p.array().colwise() -= dsum.array();
        p = p.array().exp();
        dsum = p.rowwise().sum();
        p.array().colwise() /= dsum.array();
        dv_g.noalias() += p.transpose() * dob;
        dp.noalias() = dob * v.transpose();
        dsum = (p.array() * dp.array()).rowwise().sum();
        // dS = P ∘ (dP − D), scaled by s here once instead of on both products.
        p.array() *= (dp.array().colwise() - dsum.array()) * scale;
        dq.middleRows(i0, bi).noalias() = p * k;
        dk_g.noalias() += p.transpose() * qb;
      }
    }
  }
  throw_if_cancelled();
  dk = ws.dk[0];
  dv = ws.dv[0];
  for (Index grp = 1; grp < groups; ++grp) {
    dk += ws.dk[std::size_t(grp)];
    dv += ws.dv[std::size_t(grp)];
  }
}

template <typename T>
void exact_backward_set(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const ConstRef<T>& d_out,
                        const AttentionOptions& opts, MutRef<T> dq, MutRef<T> dk, MutRef<T> dv,
                        ExactBackwardWorkspace<T>& ws) {
  if (k.rows() <= kFewKeys) {
    exact_backward_few_keys<T>(q, k, v, d_out, opts, dq, dk, dv, ws);
    return;
  }
  ws.out = exact_output<T>(q, k, v, opts, kDefaultTile, {}, &ws.lse);
  dq.setZero();
  dk.setZero();
  dv.setZero();
  exact_backward_add<T>(q, k, v, ws.out, ws.lse, d_out, opts, dq, dk, dv, ws);
}

#define ATTNLAB_INSTANTIATE_EXACT_BACKWARD(T)                                                                   \
  template Gradients<T> exact_backward<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&,         \
                                          const ConstRef<T>&, const VectorX<T>&, const ConstRef<T>&,          \
                                          const AttentionOptions&, Index, const QueryLayout&,                 \
                                          const Rounding&);                                                   \
  template void exact_backward_add<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&,             \
                                      const ConstRef<T>&, const VectorX<T>&, const ConstRef<T>&,              \
                                      const AttentionOptions&, MutRef<T>, MutRef<T>, MutRef<T>,               \
                                      ExactBackwardWorkspace<T>&, Index, const QueryLayout&,                  \
                                      const Rounding&);                                                       \
  template void exact_backward_few_keys<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&,        \
                                           const ConstRef<T>&, const AttentionOptions&, MutRef<T>, MutRef<T>, \
                                           MutRef<T>, ExactBackwardWorkspace<T>&);                            \
  template void exact_backward_set<T>(const ConstRef<T>&, const ConstRef<T>&, const ConstRef<T>&,             \
                                      const ConstRef<T>&, const AttentionOptions&, MutRef<T>, MutRef<T>,      \
                                      MutRef<T>, ExactBackwardWorkspace<T>&);
ATTNLAB_INSTANTIATE_EXACT_BACKWARD(float)
ATTNLAB_INSTANTIATE_EXACT_BACKWARD(double)

}  // namespace attnlab
