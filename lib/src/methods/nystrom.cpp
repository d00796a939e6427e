// `nystrom` — Nyströmformer (Xiong et al. 2021, eq. (14)):
//   P̃ = softmax(s·QK̃ᵀ) · Z · softmax(s·Q̃Kᵀ),  Z ≈ A⁺,  A = softmax(s·Q̃K̃ᵀ),
// with landmarks Q̃, K̃ the segment means of Q and K (select=segments, Xiong et al. 2021 §3.3) or uniformly sampled
// rows (select=random), and Z from the order-3 iteration (Razavi et al. 2014; Xiong et al. 2021 eq. (16)),
// Newton–Schulz, or the SVD. Pooling mixes every position into every landmark, so a causal mask cannot be honoured:
// it is refused.
#include "attnlab/methods/nystrom.hpp"

#include "attnlab/components/landmarks.hpp"
#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "detail/tall_products.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <exception>
#include <type_traits>

namespace attnlab {

MethodDescriptor NystromOptions::registry_entry() {
  return describe<NystromMethod, NystromOptions>(
      "Nyströmformer: softmax(QK̃ᵀ)·pinv(softmax(Q̃K̃ᵀ))·softmax(Q̃Kᵀ) with m landmarks (non-causal)",
      "Xiong et al. 2021 (Nyströmformer) eq. (14), landmarks by segment means; the order-3 pseudo-inverse "
      "iteration of Razavi et al. 2014",
      Causal::refused("landmarks pool every position"))
      .with_backward(Backward::yes(
          "random landmarks' rows held fixed; through the segment means, the softmaxes and every pinv iteration "
          "(incl. Z0's scaling, its argmax column/row held fixed); pinv=svd: d(A⁻¹)"))
      .with_storage(StorageEmulation::both(
          "as the reference code's form (softmax(QK̃ᵀ) @ iterative_inv(softmax(Q̃K̃ᵀ))) @ (softmax(Q̃Kᵀ) @ V): both "
          "policies store Q, K, V, the landmarks Q̃, K̃, the three kernels F, A, B (n × m, m × m, m × n, "
          "materialised), F·Z, B·V and O in the format; eager also every kernel's logits and Z₀, every product and "
          "iterate of the pseudo-inverse iteration (pinv=svd: Z, from a float32 SVD, as a transcription casts for "
          "torch.linalg.pinv); careful keeps the logits and the pseudo-inverse in float32")
          .with_backward("autograd's backward of that form: V, dO, ∂L/∂(F·Z), ∂L/∂(B·V), ∂L/∂F, ∂L/∂B, each "
                         "softmax's dS, the landmarks' gradients, Q's and K's two gradients and dQ, dK, dV stored "
                         "under both policies; eager also s·dS, ∂L/∂Z and every product and sum of the pseudo-"
                         "inverse's reverse steps (its iterates formed again as stored); careful keeps those in "
                         "float32 (pinv=svd: the SVD's derivative in float64)"));
}

template <typename T>
Status NystromMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  const Index m = this->o_.landmarks;  // ≤ min(n_q, n_k): its declared limit (nystrom.hpp), checked by compute()
  MatrixR<T>& ql = ql_;
  MatrixR<T> kl;
  iq_.clear();
  ik_.clear();
  const Rounding r = this->rounding_hook();  // a no-op unless a reduced storage is emulated
  if (this->o_.select == LandmarkSelect::Segments) {
    ql = segment_means<T>(q, m);
    kl = segment_means<T>(k, m);
    r(ql, Held::tensor, "landmarks Q̃, K̃");
    r(kl, Held::tensor, "landmarks Q̃, K̃");
  } else {
    Rng rng(this->o_.seed);
    iq_ = sample_without_replacement(q.rows(), m, rng);
    ik_ = q.rows() == k.rows() ? iq_ : sample_without_replacement(k.rows(), m, rng);
    ql = take_rows<T>(q, iq_);
    kl = take_rows<T>(k, ik_);
  }
  AttentionOptions plain = opts;
  plain.causal = false;
  q_ = q;
  k_ = k;
  kl_ = kl;
  plain_ = plain;
  a_ = exact_matrix<T>(ql, kl, plain, r);  // m × m
  const MatrixR<T>& a = a_;
  b_ = exact_matrix<T>(ql, k, plain, r);   // m × n_k
  Pseudoinverse<T> pinv;
  pinv.setMethod(this->o_.pinv).setIterations(this->o_.iters).setRounding(r).compute(a);
  residual_ = pinv.residuals().back();
  pinv_iterations_ = pinv.iterations();
  z_ = pinv.pseudoinverse();
  if (this->o_.pinv == PinvMethod::Svd) r(z_, Held::accumulator, "pseudo-inverse iterates");
  this->defer_factors(m, false);  // F·Z has negative entries
  return pinv.info() == Status::NumericalIssue ? Status::NumericalIssue : Status::Success;
}

/// O = F·(Z·(B·V)) with F = softmax(s·QK̃ᵀ): m×d intermediates only (the factored form (F·Z)·(B·V) adds an n·m²
/// product), and F·W is exact attention over the m landmark keys with values W = Z·B·V, so the streaming kernel
/// computes it tile by tile without forming F.
template <typename T>
MatrixR<T> NystromMethod<T>::do_output(const ConstRef<T>& v) const {
  if (plain_.storage != Storage::native) {
    // Emulated half storage: the reference's association (F·Z)·(B·V), F materialised, each product stored.
    const Rounding r = this->rounding_hook();
    MatrixR<T> fz = exact_matrix<T>(q_, kl_, plain_, r) * z_;
    r(fz, Held::tensor, "products F·Z, B·V");
    MatrixR<T> bv = b_ * v;
    r(bv, Held::tensor, "products F·Z, B·V");
    return fz * bv;
  }
  const MatrixR<T> bv = detail::tall_transpose_product<T>(b_.transpose(), v);  // m × d, summed over n
  const MatrixR<T> w = z_ * bv;
  return exact_output<T>(q_, kl_, w, plain_);
}

template <typename T>
std::pair<MatrixR<T>, MatrixR<T>> NystromMethod<T>::make_factors() const {
  return {exact_matrix<T>(q_, kl_, plain_) * z_, b_.transpose()};
}

template <typename T>
void NystromMethod<T>::spread(const MatrixR<T>& dl, const std::vector<Index>& idx, Index n, Index r0,
                              MutRef<T> dx) const {
  const Index m = dl.rows(), r1 = r0 + dx.rows();
  if (idx.empty()) {
    // Segment means (components/landmarks.hpp: segment s is rows [⌊s·n/m⌋, ⌊(s+1)·n/m⌋)): each row of segment s
    // receives dX̃_s / |segment s|. From the segment holding row r0 on.
    Index s = std::min<Index>(m - 1, Index((__int128)r0 * m / n));
    while (s > 0 && segment_begin(s, n, m) > r0) --s;
    while (s + 1 < m && segment_begin(s + 1, n, m) <= r0) ++s;
    for (; s < m; ++s) {
      const Index b = segment_begin(s, n, m), e = segment_begin(s + 1, n, m);
      if (b >= r1) break;
      const auto g = (dl.row(s) / T(e - b)).eval();
      for (Index i = std::max(b, r0); i < std::min(e, r1); ++i) dx.row(i - r0) += g;
    }
  } else {
    // Sampled rows (ascending): each receives its landmark's gradient.
    for (auto it = std::lower_bound(idx.begin(), idx.end(), r0); it != idx.end() && *it < r1; ++it)
      dx.row(*it - r0) += dl.row(Index(it - idx.begin()));
  }
}

/// Reverse mode through O = F·(Z·(B·V)) (Xiong et al. 2021, eq. (14)):
///   F·W = softmax(s·QK̃ᵀ)·W:  exact attention's backward → dQ, dK̃, dW;   W = Z·BV:  dZ = dW·(BV)ᵀ, d(BV) = Zᵀ·dW;
///   Z = pinv(A): pinv_backward → dA (eq. (16));
///   A = softmax(s·Q̃K̃ᵀ):     dS = A ∘ (dA − rowsum(A ∘ dA)), dQ̃ += s·dS·K̃, dK̃ += s·dSᵀ·Q̃;
///   BV = B·V, B = softmax(s·Q̃Kᵀ) kept by the forward:  dV = Bᵀ·d(BV), dB = d(BV)·Vᵀ, dS = B ∘ (dB − D) with
///                            D = rowsum(B ∘ dB) = rowsum(BV ∘ d(BV)), dQ̃ += s·dS·K, dK = s·dSᵀ·Q̃;
///   Q̃, K̃ from Q, K:         the segment means' adjoint (or the sampled rows').
/// B's pass needs only d(BV): it runs beside the pseudo-inverse's backward (serial m × m work), and the landmark
/// gradients are spread onto dQ and dK after both.
template <typename T>
Gradients<T> NystromMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  if (plain_.storage != Storage::native) return emulated_backward(v, d_out);
  BackwardWorkspace& ws = ws_;
  const Index m = ql_.rows(), nq = q_.rows(), nk = k_.rows(), d = q_.cols(), dv = v.cols();
  const T scale = T(plain_.scale);
  // The forward's intermediates, formed again as do_output forms them.
  ws.bv = detail::tall_transpose_product<T>(b_.transpose(), v);  // m × d_v
  ws.w.noalias() = z_ * ws.bv;
  Gradients<T> g;
  g.dq.resize(nq, d);
  g.dk.resize(nk, d);
  g.dv.resize(nk, dv);
  ws.dkl.resize(m, d);
  ws.dw.resize(m, dv);
  exact_backward_set<T>(q_, kl_, ws.w, d_out, plain_, g.dq, ws.dkl, ws.dw, ws.exact);
  const MatrixR<T> dz = ws.dw * ws.bv.transpose();
  ws.dbv.noalias() = z_.transpose() * ws.dw;
  ws.dsum = (ws.bv.array() * ws.dbv.array()).rowwise().sum();  // B's D_i

  // One thread takes the pseudo-inverse's backward (serial m × m products, K steps) and A's, while the others start on
  // B's softmax backward on the kept B, in fixed blocks of keys: each block's rows of dV and dK written, its dQ̃
  // added to its group's; the groups summed in group order (the bits independent of the thread count).
  MatrixR<T> ds;
  std::exception_ptr failed;
  const Index cols = std::clamp<Index>(Index(65536) / m, 32, 512), blocks = (nk + cols - 1) / cols;
  const Index groups = std::max<Index>(1, std::min(kFewKeysGroups, blocks));
  ws.dql_parts.resize(std::size_t(groups));
  ws.db.resize(std::size_t(std::max(1, omp_get_max_threads())));
#pragma omp parallel
  {
#pragma omp single nowait
    {
      try {
        const MatrixR<T> da = pinv_backward<T>(a_, dz, this->o_.pinv, pinv_iterations_);
        // The dense softmax backward of A (m × m), dLogits = s·dS.
        const VectorX<T> rows = (a_.array() * da.array()).rowwise().sum();
        ds = (a_.array() * (da.array().colwise() - rows.array()) * scale).matrix();
        ws.dkl.noalias() += ds.transpose() * ql_;
      } catch (...) {
        failed = std::current_exception();  // rethrown after the parallel region
      }
    }
    MatrixR<T>& db = ws.db[std::size_t(omp_get_thread_num())];
    db.resize(m, cols);  // kept from call to call
#pragma omp for schedule(dynamic)
    for (Index grp = 0; grp < groups; ++grp) {
      MatrixR<T>& part = ws.dql_parts[std::size_t(grp)];
      part.setZero(m, d);
      for (Index b = grp; b < blocks; b += groups) {
        if (cancel_requested()) break;  // thrown after the parallel region
        const Index j0 = b * cols, bj = std::min(cols, nk - j0);
        const auto bb = b_.middleCols(j0, bj);
        auto dsb = db.leftCols(bj);
        g.dv.middleRows(j0, bj).noalias() = bb.transpose() * ws.dbv;
        dsb.noalias() = ws.dbv * v.middleRows(j0, bj).transpose();
        dsb.array() = bb.array() * (dsb.array().colwise() - ws.dsum.array()) * scale;
        g.dk.middleRows(j0, bj).noalias() = dsb.transpose() * ql_;
        part.noalias() += dsb * k_.middleRows(j0, bj);
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
  throw_if_cancelled();
  ws.dql = ws.dql_parts[0];
  for (Index grp = 1; grp < groups; ++grp) ws.dql += ws.dql_parts[std::size_t(grp)];
  ws.dql.noalias() += ds * kl_;
  // dK̃ and dQ̃ onto the rows of K and Q, in fixed blocks of rows (parallel).
  const Index rb = 1024, rblocks = (std::max(nq, nk) + rb - 1) / rb;
#pragma omp parallel for schedule(static)
  for (Index b = 0; b < rblocks; ++b) {
    const Index r0 = b * rb;
    if (r0 < nk) spread(ws.dkl, ik_, nk, r0, g.dk.middleRows(r0, std::min(rb, nk - r0)));
    if (r0 < nq) spread(ws.dql, iq_, nq, r0, g.dq.middleRows(r0, std::min(rb, nq - r0)));
  }
  return g;
}

/// Reverse mode through the emulated forward's form O = (F·Z)·(B·V) (do_output under a reduced storage) as autograd
/// runs it on a half-precision transcription, V and dO stored by Method::backward: d(FZ) = dO·(BV)ᵀ, d(BV) =
/// (FZ)ᵀ·dO, dF = d(FZ)·Zᵀ, dB = d(BV)·Vᵀ stored; dZ = Fᵀ·d(FZ) with the pseudo-inverse (stored under eager,
/// float32 under careful, as Z), pinv_backward_emulated → dA; each softmax's backward as exact attention's
/// materialised one (dS = P ∘ (dP − rowsum(P ∘ dP)) stored, s·dS stored again under eager); the landmarks'
/// gradients stored, then spread onto the rows they average; Q's and K's two gradients (direct and through the
/// landmarks) each stored before their sum.
template <typename T>
Gradients<T> NystromMethod<T>::emulated_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  if constexpr (!std::is_same_v<T, float>) {
    throw Error("nystrom: the reduced-storage emulation runs in float32");
  } else {
    const Rounding r = this->rounding_hook();
    const Rounding again = r.untallied();  // the forward's tensors formed again (tallied by the forward)
    const T s = T(plain_.scale);
    const Index nq = q_.rows(), nk = k_.rows();
    const MatrixR<T> f = exact_matrix<T>(q_, kl_, plain_, again);  // n_q × m, as do_output stored it
    MatrixR<T> fz = f * z_;
    again(fz, Held::tensor, "");
    MatrixR<T> bv = b_ * v;
    again(bv, Held::tensor, "");
    const char* prod = "backward: ∂L/∂(F·Z), ∂L/∂(B·V), ∂L/∂F, ∂L/∂B";
    MatrixR<T> dfz = d_out * bv.transpose();
    r(dfz, Held::tensor, prod);
    MatrixR<T> dbv = fz.transpose() * d_out;
    r(dbv, Held::tensor, prod);
    MatrixR<T> df = dfz * z_.transpose();
    r(df, Held::tensor, prod);
    MatrixR<T> dz = f.transpose() * dfz;
    r(dz, Held::accumulator, "backward: ∂L/∂Z, ∂L/∂A");
    MatrixR<T> db = dbv * v.transpose();
    r(db, Held::tensor, prod);
    Gradients<T> g;
    g.dv = b_.transpose() * dbv;
    // A softmax's backward (rows of P), into the logits' gradient s·dS.
    const auto softmax_backward = [&](const MatrixR<T>& p, const MatrixR<T>& dp) {
      const VectorX<T> rows = (p.array() * dp.array()).rowwise().sum();
      MatrixR<T> ds = (p.array() * (dp.array().colwise() - rows.array())).matrix();
      r(ds, Held::tensor, "backward: the softmaxes' dS");
      ds *= s;
      r(ds, Held::accumulator, "backward: the softmaxes' s·dS");
      return ds;
    };
    MatrixR<T> da = pinv_backward_emulated(a_, dz, this->o_.pinv, pinv_iterations_, r);
    r(da, Held::accumulator, "backward: ∂L/∂Z, ∂L/∂A");
    const MatrixR<T> dsf = softmax_backward(f, df), dsb = softmax_backward(b_, db), dsa = softmax_backward(a_, da);
    MatrixR<T> dq = dsf * kl_, dk = dsb.transpose() * ql_;
    r(dq, Held::tensor, "backward: ∂L/∂Q, ∂L/∂K through the logits");
    r(dk, Held::tensor, "backward: ∂L/∂Q, ∂L/∂K through the logits");
    MatrixR<T> dql = dsb * k_ + dsa * kl_, dkl = dsf.transpose() * q_ + dsa.transpose() * ql_;
    r(dql, Held::tensor, "backward: ∂L/∂Q̃, ∂L/∂K̃");
    r(dkl, Held::tensor, "backward: ∂L/∂Q̃, ∂L/∂K̃");
    MatrixR<T> sq = MatrixR<T>::Zero(nq, q_.cols()), sk = MatrixR<T>::Zero(nk, k_.cols());
    spread(dql, iq_, nq, 0, sq);
    spread(dkl, ik_, nk, 0, sk);
    r(sq, Held::tensor, "backward: ∂L/∂Q, ∂L/∂K through the landmarks");
    r(sk, Held::tensor, "backward: ∂L/∂Q, ∂L/∂K through the landmarks");
    g.dq = dq + sq;
    g.dk = dk + sk;
    return g;
  }
}

template class NystromMethod<float>;
template class NystromMethod<double>;

}  // namespace attnlab
