// `local` — sliding-window attention (Beltagy et al. 2020, Longformer §3.1): keys with |j − c_i| ≤ W around the
// aligned position c_i = i + (n_k − n_q) (causal: c_i − W ≤ j ≤ c_i), softmax over the band only; O(n·W·d).
#include "attnlab/methods/local.hpp"

#include "attnlab/core/error.hpp"
#include "base/band.hpp"

#include <algorithm>

namespace attnlab {

MethodDescriptor LocalOptions::registry_entry() {
  return describe<LocalMethod, LocalOptions>(
      "sliding-window attention, |j − i| ≤ W", "Beltagy et al. 2020 (Longformer) §3.1, sliding window", Causal::yes())
      .with_backward(Backward::yes("softmax over each query's band, O(n·W·d) in blocks"))
      .with_storage(StorageEmulation::both(
          "causal too; blocks of 64 queries against the keys their bands span: Q, K, V, each block's band softmax P "
          "and O in the format under both policies; eager also the block's logits (QKᵀ, then s·QKᵀ), careful keeps "
          "them in float32; the softmax's internals in float32")
                        .with_backward("V, dO and dQ, dK, dV in the format; the pattern softmax's backward in "
                                       "autograd's form: the forward's stored P, dP = dO·Vᵀ and dS under both "
                                       "policies, s·dS under eager; D and the products' sums in float32"));
}

namespace {

/// The logits of queries [i0, i0 + rows) against keys [lo, lo + cols) → the band's softmax in place: each row's
/// keys |j − c_i| ≤ W (causal: c_i − W ≤ j ≤ c_i), c_i = i + off, stable (max subtracted), exactly 0 off the band.
template <typename T>
void band_softmax(MatrixR<T>& logits, Index i0, Index lo, Index off, Index nk, Index w, bool causal) {
  const Index bj = logits.cols();
  for (Index r = 0; r < logits.rows(); ++r) {
    const Index c = i0 + r + off;
    const Index first = std::max<Index>(0, c - w) - lo;
    const Index last = (causal ? std::min(c, nk - 1) : std::min(c + w, nk - 1)) - lo;
    auto row = logits.row(r);
    const T mx = row.segment(first, last - first + 1).maxCoeff();
    row.head(first).setZero();
    row.segment(first, last - first + 1) = (row.segment(first, last - first + 1).array() - mx).exp();
    row.tail(bj - last - 1).setZero();
    row /= row.sum();
  }
}

/// Sliding-window attention as dense blocks: a block of queries [i0, i0 + B) against the keys its bands span,
/// [c_i0 − W, c_{i0+B−1} + W] (causal: up to c_{i0+B−1}): one GEMM for the logits, the band mask, a stable row
/// softmax, one GEMM with V. O(n·(B + 2W)·d) work, O(B·(B + 2W)) memory per thread; the same P̃ as the pattern.
template <typename T>
MatrixR<T> local_output(const MatrixR<T>& q, const MatrixR<T>& k, const ConstRef<T>& v, const AttentionOptions& opts,
                        Index w, const Rounding& rounding = {}) {
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq, dv = v.cols();
  const Index block = 64, blocks = (nq + block - 1) / block;
  const T s = T(opts.scale);
  MatrixR<T> out(nq, dv);
#pragma omp parallel
  {
    MatrixR<T> logits;
#pragma omp for schedule(static)
    for (Index b = 0; b < blocks; ++b) {
      const Index i0 = b * block, bi = std::min(block, nq - i0);
      const Index lo = std::max<Index>(0, i0 + off - w);
      const Index hi = opts.causal ? std::min(nk - 1, i0 + bi - 1 + off) : std::min(nk - 1, i0 + bi - 1 + off + w);
      const Index bj = hi - lo + 1;
      if (rounding.active()) {
        // Emulated half storage: the logits in the eager transcription's order, q @ k.T then · s, each stored.
        logits.noalias() = q.middleRows(i0, bi) * k.middleRows(lo, bj).transpose();
        rounding(logits, Held::accumulator, "logits QKᵀ");
        logits *= s;
        rounding(logits, Held::accumulator, "logits s·QKᵀ");
      } else {
        logits.noalias() = (q.middleRows(i0, bi) * s) * k.middleRows(lo, bj).transpose();
      }
      band_softmax(logits, i0, lo, off, nk, w, opts.causal);
      rounding(logits, Held::tensor, "probabilities P");
      out.middleRows(i0, bi).noalias() = logits * v.middleRows(lo, bj);
    }
  }
  return out;
}

/// The backward of local_output on the same blocks (the softmax of each row formed again from the logits, as
/// FlashAttention-2 Alg. 2 does from ℓ): with P̃ the band softmax, dP = dO Vᵀ, D_i = Σ_j P̃_ij dP_ij,
/// dS = P̃ ∘ (dP − D); dQ_I = s·dS K_J, dK_J += s·dSᵀ Q_I, dV_J += P̃ᵀ dO_I (Dao 2023, Alg. 2, restricted to the band).
/// Blocks b and b + G with G = 1 + ⌈2W/B⌉ touch disjoint keys: G passes, each parallel over its blocks, so every
/// key's row sums its blocks' terms in the same order whatever the thread count. Returns false (nothing written)
/// when a band can be empty (n_k < n_q): the pattern's backward takes that case.
template <typename T>
bool local_backward(const MatrixR<T>& q, const MatrixR<T>& k, const ConstRef<T>& v, const ConstRef<T>& d_out,
                    const AttentionOptions& opts, Index w, Gradients<T>& g) {
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq, dv = v.cols(), d = q.cols();
  if (off < 0) return false;
  const Index block = 64, blocks = (nq + block - 1) / block;
  const Index groups = std::min<Index>(blocks, 1 + (2 * w + block - 1) / block);
  const T s = T(opts.scale);
  g.dq.resize(nq, d);
  g.dk.setZero(nk, d);
  g.dv.setZero(nk, dv);
  for (Index r = 0; r < groups; ++r) {
#pragma omp parallel
    {
      MatrixR<T> p, dp;
#pragma omp for schedule(static)
      for (Index b = r; b < blocks; b += groups) {
        const Index i0 = b * block, bi = std::min(block, nq - i0);
        const Index lo = std::max<Index>(0, i0 + off - w);
        const Index hi = opts.causal ? std::min(nk - 1, i0 + bi - 1 + off) : std::min(nk - 1, i0 + bi - 1 + off + w);
        const Index bj = hi - lo + 1;
        p.noalias() = (q.middleRows(i0, bi) * s) * k.middleRows(lo, bj).transpose();
        band_softmax(p, i0, lo, off, nk, w, opts.causal);  // P̃ of the block, as local_output forms it
        g.dv.middleRows(lo, bj).noalias() += p.transpose() * d_out.middleRows(i0, bi);
        dp.noalias() = d_out.middleRows(i0, bi) * v.middleRows(lo, bj).transpose();
        const VectorX<T> dsum = (p.array() * dp.array()).rowwise().sum();
        p.array() *= (dp.array().colwise() - dsum.array()) * s;  // s·dS; zero off the band (P̃ is)
        g.dq.middleRows(i0, bi).noalias() = p * k.middleRows(lo, bj);
        g.dk.middleRows(lo, bj).noalias() += p.transpose() * q.middleRows(i0, bi);
      }
    }
  }
  return true;
}

}  // namespace

template <typename T>
Gradients<T> LocalMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  if (this->rounding_hook().active()) return PatternMethod<T>::do_backward(v, d_out);  // the emulated pattern form
  Gradients<T> g;
  if (local_backward<T>(this->queries(), this->keys(), v, d_out, this->options(), this->o_.window, g)) return g;
  return PatternMethod<T>::do_backward(v, d_out);
}

template <typename T>
MatrixR<T> LocalMethod<T>::do_output(const ConstRef<T>& v) const {
  // (compute() only keeps Q and K: the bands are first needed here, and in pattern() for every other path)
  require_band_reaches_keys("local", this->queries().rows(), this->keys().rows(), this->o_.window,
                            this->options().causal);
  return local_output<T>(this->queries(), this->keys(), v, this->options(), this->o_.window, this->rounding_hook());
}

template <typename T>
Pattern LocalMethod<T>::pattern(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) const {
  const Index w = this->o_.window;
  require_band_reaches_keys("local", q.rows(), k.rows(), w, opts.causal);
  Pattern p(static_cast<std::size_t>(q.rows()));
  add_band(p, q.rows(), k.rows(), w, opts.causal);
  return p;
}

template class LocalMethod<float>;
template class LocalMethod<double>;

}  // namespace attnlab
