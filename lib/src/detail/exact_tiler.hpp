// The tiler shared by the exact kernels (forward: operators/exact.cpp; backward: operators/exact_backward.cpp): it
// forms scale·Q_I K_Jᵀ for a query tile I and a key tile J and applies the causal mask, so that every kernel masks
// and scales identically.
#pragma once

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab::detail {

template <typename T>
struct Tiler {
  const ConstRef<T>& q;
  const ConstRef<T>& k;
  T scale;
  bool causal;
  Index offset;                // query at position p sees keys j <= p + offset when causal
  const std::vector<Index>* pos;  // positions of the rows in the full query sequence (null: row = position)
  /// A reduced storage's rounding of the logits (eager: the product QKᵀ and the scaled product, each stored as an
  /// eager `q @ k.T * s` stores them); native by default.
  Rounding rounding{};

  Tiler(const ConstRef<T>& q_, const ConstRef<T>& k_, const AttentionOptions& o, const QueryLayout& layout = {})
      : q(q_), k(k_), scale(T(o.resolved_scale(q_.cols()))), causal(o.causal),
        offset(causal_offset(layout.positions.empty() ? q_.rows() : layout.n_q_full, k_.rows())),
        pos(layout.positions.empty() ? nullptr : &layout.positions) {}

  Index position(Index i) const { return pos ? (*pos)[std::size_t(i)] : i; }
  /// One past the last key any query of [i0, i0 + bi) may see (positions ascend).
  Index key_end(Index i0, Index bi) const {
    return causal ? std::min<Index>(k.rows(), position(i0 + bi - 1) + offset + 1) : k.rows();
  }
  /// First query that may see key j0.
  Index query_begin(Index j0) const {
    if (!causal) return 0;
    if (!pos) return std::max<Index>(0, j0 - offset);
    return Index(std::lower_bound(pos->begin(), pos->end(), j0 - offset) - pos->begin());
  }

  /// s = scale·Q[i0:i0+bi] K[j0:j0+bj]ᵀ (unmasked; the kernels read only each row's visible prefix).
  void logits(Index i0, Index bi, Index j0, Index bj, MatrixR<T>& s) const {
    s.resize(bi, bj);
    s.noalias() = q.middleRows(i0, bi) * k.middleRows(j0, bj).transpose();
    rounding(s, Held::accumulator, "logits QKᵀ");
    s *= scale;
    rounding(s, Held::accumulator, "logits s·QKᵀ");
  }
  /// How many of the keys [j0, j0 + bj) query i sees: the mask keeps a prefix of every row.
  Index visible(Index i, Index j0, Index bj) const {
    return causal ? std::clamp<Index>(position(i) + offset + 1 - j0, 0, bj) : bj;
  }
  /// Row r of a logit tile for query i → exp(s − shift) on the visible keys, exactly 0 on masked ones.
  /// (Eigen's vectorized exp(−∞) is ~1e-39, not 0: masked entries are never exponentiated.)
  void exp_row(MatrixR<T>& s, Index r, Index i, Index j0, T shift) const {
    const Index vis = visible(i, j0, s.cols());
    s.row(r).head(vis) = (s.row(r).head(vis).array() - shift).exp();
    s.row(r).tail(s.cols() - vis).setZero();
  }
  /// Max of the visible logits of row r (−∞ when none is visible).
  T row_max(const MatrixR<T>& s, Index r, Index i, Index j0) const {
    const Index vis = visible(i, j0, s.cols());
    return vis ? s.row(r).head(vis).maxCoeff() : -std::numeric_limits<T>::infinity();
  }

  /// The forward kernels' walk over the rows of P: tiles of `tile` queries in parallel (OpenMP, dynamic schedule),
  /// each thread with its own `state = make()` (buffers kept across its tiles); on_tile(state, i0, bi) for the
  /// queries [i0, i0 + bi). A cancel request skips the tiles not yet begun and throws once the region is over.
  template <class Make, class OnTile>
  void for_query_tiles(Index tile, const Make& make, const OnTile& on_tile) const {
    const Index nq = q.rows(), ntiles = (nq + tile - 1) / tile;
#pragma omp parallel
    {
      auto state = make();
#pragma omp for schedule(dynamic)
      for (Index it = 0; it < ntiles; ++it) {
        if (cancel_requested()) continue;  // skipped; thrown after the parallel region
        const Index i0 = it * tile;
        on_tile(state, i0, std::min(tile, nq - i0));
      }
    }
    throw_if_cancelled();
  }
  /// The key tiles the queries [i0, i0 + bi) may see, in order: s = the logits of each (logits()), then
  /// on_block(s, j0, bj) for the keys [j0, j0 + bj).
  template <class OnBlock>
  void for_key_tiles(Index i0, Index bi, Index tile, MatrixR<T>& s, const OnBlock& on_block) const {
    const Index kend = key_end(i0, bi);
    for (Index j0 = 0; j0 < kend; j0 += tile) {
      const Index bj = std::min(tile, kend - j0);
      logits(i0, bi, j0, bj, s);
      on_block(s, j0, bj);
    }
  }
};

inline Index checked_tile(Index tile) {
  require(tile >= 1, "tile must be positive, got {}", tile);
  return tile;
}

inline void validate(Index nq, Index dq, Index nk, Index dk, const AttentionOptions& opts,
                     const QueryLayout& layout = {}) {
  if (layout.positions.empty()) {
    validate_qk(nq, dq, nk, dk, opts);
    return;
  }
  require(Index(layout.positions.size()) == nq, "query layout: one position per query row");
  require(std::is_sorted(layout.positions.begin(), layout.positions.end()) &&
              (nq == 0 || (layout.positions.front() >= 0 && layout.positions.back() < layout.n_q_full)),
          "query layout: positions must ascend within [0, n_q_full)");
  validate_qk(layout.n_q_full, dq, nk, dk, opts);
}

}  // namespace attnlab::detail
