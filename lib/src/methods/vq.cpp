// `vq` — Transformer-VQ (Lingle 2023): keys quantized to a codebook C learned by k-means, K̂ = ΔC, and the
// VQ-attention factorization exp(s·QK̂ᵀ)V = exp(s·QCᵀ)(ΔᵀV) (Lingle 2023, Fig. 2): exact attention on K̂ in O(n·c·d).
//   assign=hard: Δ one-hot (nearest code). P̃_ij = exp(s·q_iᵀc_a(j) − L_i), L_i = log Σ_y N_y exp(s·q_iᵀc_y).
//   assign=soft: Δ → the Gaussian-mixture responsibilities R_jy = softmax_y(−‖k_j − c_y‖²/(2T)); T → 0 recovers hard
//                VQ. attnlab's variant, not in Lingle 2023 (after Su 2023, who reads the Performer as a soft
//                Transformer-VQ). Non-causal.
//   quantize=both: attnlab's mean-field form, q·k ≈ q·⟨k⟩ + ⟨q⟩·k − ⟨q⟩·⟨k⟩ with ⟨q⟩ from a second codebook on
//                the queries: logits s(q_i·c_a(j) + c'_b(i)·(k_j − c_a(j))), still linear. Non-causal.
// Causal (hard, keys): running per-code sums of values and counts, so output i reads only keys j ≤ i. With
// codebook=window the codebook itself is fitted on all keys before the pass — a look-ahead in the codebook, not in
// the attention; with codebook=PATH.npy it is fixed (fitted on other windows, as Transformer-VQ's is trained), read
// from the file, and nothing looks ahead.
// Backward (do_backward below): the codebook and the assignments held fixed, dQ and dV exact, dK = dK̂ by the
// straight-through estimator (Lingle 2023); soft: responsibilities differentiated at the fixed codebook; both: dQ
// also through the query codebook's cluster means.
#include "attnlab/methods/vq.hpp"

#include "attnlab/components/codebook_attention.hpp"
#include "attnlab/components/kmeans.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/io/npy.hpp"
#include "attnlab/operators/codebook.hpp"
#include "attnlab/operators/low_rank.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>
#include <tuple>

namespace attnlab {
namespace {

/// A fixed codebook's dimension against the keys': before any work (the size check) and on compute()'s inputs.
void require_codebook_d(const std::string& file, Index codebook_d, Index keys_d) {
  require(codebook_d == keys_d, "vq: the codebook '{}' has d = {}, but the keys have d = {}", file, codebook_d,
          keys_d);
}

}  // namespace

template <typename T>
KMeansResult<T> vq_fit_codebook(const ConstRef<T>& keys, Index codes, Index iters, std::uint64_t seed) {
  require(codes >= 1, "vq: codes = {}; a codebook needs at least one code", codes);
  require(codes <= keys.rows(), "vq: codes = {} exceeds the {} keys", codes, keys.rows());
  Rng rng(seed);
  return kmeans<T>(keys, codes, iters, rng);
}

std::shared_ptr<const MatrixR<double>> vq_codebook_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec_size, ec_time;
  const auto size = fs::file_size(path, ec_size);
  const auto time = fs::last_write_time(path, ec_time);
  if (ec_size || ec_time)
    throw Error(fmt::format("vq: cannot read the codebook '{}': {}", path, (ec_size ? ec_size : ec_time).message()));
  // Keyed by the absolute path; a rewritten file (another size or modification time) is read again.
  std::error_code ec_abs;
  std::string key = fs::absolute(path, ec_abs).string();
  if (ec_abs || key.empty()) key = path;
  using Key = std::tuple<std::uintmax_t, fs::file_time_type>;
  static std::mutex vq_cache_mutex;
  static std::map<std::string, std::pair<Key, std::shared_ptr<const MatrixR<double>>>> vq_cache;
  const std::lock_guard<std::mutex> lock(vq_cache_mutex);
  const auto hit = vq_cache.find(key);
  if (hit != vq_cache.end() && hit->second.first == Key{size, time}) return hit->second.second;
  const NpyArray a = NpyArray::read(path);  // its messages name the file
  require(a.ndim() == 2, "vq: the codebook '{}' must be a (codes, d) array, got {} dimensions", path,
                         a.ndim());
  require(a.rows() >= 1 && a.cols() >= 1, "vq: the codebook '{}' is empty", path);
  a.check_finite();
  auto c = std::make_shared<const MatrixR<double>>(a.head_as<double>(0));
  vq_cache[key] = {Key{size, time}, c};
  return c;
}

template <typename T>
VqMethod<T>::VqMethod(const VqOptions& options) : ConfiguredMethod<VqOptions, Method<T>>(options) {
  if (!options.fixed_codebook()) return;
  require(options.assign == VqAssign::Hard && options.quantize == VqQuantize::Keys,
          "vq: a fixed codebook (codebook=PATH.npy) takes assign=hard, quantize=keys; assign=soft and quantize=both "
          "fit by k-means (codebook=window)");
  given_ = vq_codebook_file(options.codebook);
  require(given_->rows() == options.codes,
          "vq: the codebook '{}' holds {} codes, but codes = {}; give codes={}", options.codebook,
          given_->rows(), options.codes, given_->rows());
}

MethodDescriptor VqOptions::registry_entry() {
  return describe<VqMethod, VqOptions>(
      "Transformer-VQ: keys quantized to a codebook (k-means on the keys, or a fixed .npy), exp(QCᵀ)(ΔᵀV); causal "
      "with assign=hard",
      "Lingle 2023 (Transformer-VQ): K ≈ ΔC, exp(QCᵀ)(ΔᵀV); soft (GMM) assignment after Su 2023, blog "
      "'Traces of Transformer-VQ in the Performer'",
      Causal::conditional("assign=hard, quantize=keys: the attention is causal; codebook=PATH.npy (fitted on other "
                          "windows, held fixed) leaks nothing; codebook=window fits it on all keys of the call (a "
                          "look-ahead in the codebook, stated by lookahead(): not a causal verdict)"))
      .with_backward(Backward::yes(
          "codebook and assignments held fixed; dK = dK̂ by the straight-through estimator (Lingle 2023); "
          "soft: responsibilities differentiated at the fixed codebook; both: dQ through the query codebook's means"))
      .with_storage(StorageEmulation::both(
          "every variant; the codebooks fitted by k-means in float32 on the stored keys (and queries), the "
          "assignments from them; both policies: Q, K, V, the codebook C, the weights "
          "exp(ℓ − max ℓ) over the codes and O in the format; eager also the logits QCᵀ and s·QCᵀ, the per-code key "
          "counts and value sums ΔᵀV (Transformer-VQ's cache), the numerators and the normalisers, divided "
          "unguarded; careful keeps those in float32. Soft: the responsibilities R = softmax(z) stored under both, "
          "z = (2KCᵀ − ‖k‖² − ‖c‖²)/(2T) with KCᵀ and the norms, and the masses Rᵀ1 with RᵀV, under eager. Both: "
          "per query code a Transformer-VQ over the key codes; the query codebook C', the residuals K − ΔC, the key "
          "weights exp(g − max) stored under both, g = s·C'(K − ΔC)ᵀ, the per-query-code sums and the joint logits "
          "λ + m under eager. "
          "Causal: Transformer-VQ's blockwise form (Lingle 2023 §3.3), "
          "blocks of 64 queries each over its own keys under the mask (their weights those of their codes) and the "
          "cache of every earlier key, the cache stored after every block under eager")
          .with_backward("the transcription's reverse mode, codebook and assignments fixed, dK straight-through: V, "
                         "dO, ∂L/∂weights and dQ, dK, dV stored under both policies; eager also the division's "
                         "gradients, ∂L/∂logits and its ·s, ∂L/∂ΔᵀV and each code's key-gradient sums; careful "
                         "keeps those in float32. Soft: dK through R at the fixed codebook, ∂L/∂R stored under both, "
                         "∂L/∂RᵀV, ∂L/∂masses and ∂L/∂z under eager. Both: ∂L/∂key weights stored under both, ∂L/∂g, "
                         "the per-query-code sums' gradients and the per-(query code, key code) key-gradient sums "
                         "under eager. Causal: the blockwise form's reverse mode, the blocks last to "
                         "first: the same tensors per block, and under eager also the cache's gradient and the "
                         "per-code key-gradient sums after every block and the block's per-key logit gradients"));
}

void VqOptions::check_size(const ProblemSize& s) const {
  // A fixed codebook: any number of keys, but the keys' dimension.
  if (fixed_codebook()) require_codebook_d(codebook, vq_codebook_file(codebook)->cols(), s.d);
}

template <typename T>
Status VqMethod<T>::do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) {
  if (given_) {
    // A fixed codebook: no k-means, each key its nearest code (codebook_attention), nothing fitted on these keys.
    require_codebook_d(this->o_.codebook, given_->cols(), k.cols());
    q_ = q;
    centroids_ = given_->template cast<T>();
    op_ = codebook_attention<T>(q, k, centroids_, opts);
    const std::vector<Index>& a = static_cast<const CodebookOperator<T>&>(*op_).assignment();
    inertia_ = 0;
    for (Index j = 0; j < k.rows(); ++j)
      inertia_ += double((k.row(j) - centroids_.row(a[std::size_t(j)])).squaredNorm());
    iterations_ = 0;
    return Status::Success;
  }
  const Index codes = this->o_.codes;  // ≤ n_k (and n_q): its declared limits (vq.hpp), checked by compute()
  Rng rng(this->o_.seed);
  const Index iters = this->o_.iters;
  const KMeansResult<T> km = kmeans<T>(k, codes, iters, rng);
  inertia_ = km.inertia;
  iterations_ = km.iterations;
  const T s = T(opts.scale);
  MatrixR<T> logits = (q * km.centroids.transpose()) * s;  // ℓ = s·QCᵀ
  q_ = q;
  centroids_ = km.centroids;
  if (this->o_.quantize == VqQuantize::Both) {
    const KMeansResult<T> kq = kmeans<T>(q, codes, iters, rng);
    MatrixR<T> resid = k;  // r_j = k_j − c_a(j)
    for (Index j = 0; j < k.rows(); ++j) resid.row(j) -= km.centroids.row(km.assignment[std::size_t(j)]);
    resid_ = resid;
    q_formed_from_ = kq.formed_from;
    q_copy_of_ = kq.copy_of;
    // The query codebook and both codes: what vq_both_rounding_bound reads of each run, and under an emulated
    // storage (with K) what the transcription forms again in the format.
    qcentroids_ = kq.centroids;
    key_codes_ = km.assignment;
    query_codes_ = kq.assignment;
    if (opts.storage != Storage::native) k_ = k;
    const MatrixR<T> g = (kq.centroids * resid.transpose()) * s;  // c_q × n_k
    op_ = std::make_unique<MeanFieldOperator<T>>(logits, g, km.assignment, kq.assignment);
  } else if (this->o_.assign == VqAssign::Hard) {
    op_ = codebook_attention<T>(q, k, km.centroids, opts);
  } else {
    // Responsibilities R_jy = softmax_y(−‖k_j − c_y‖²/(2T)) (the posterior of an isotropic Gaussian mixture with
    // equal weights and variance T), then P̃_ij = Σ_y exp(ℓ_iy − L_i) R_jy with L_i = log Σ_y exp(ℓ_iy)·Σ_j R_jy.
    const T temp = T(this->o_.temperature);
    MatrixR<T> r = (k * km.centroids.transpose()) * T(2);
    r.colwise() -= k.rowwise().squaredNorm();
    r.rowwise() -= km.centroids.rowwise().squaredNorm().transpose();  // −‖k − c‖²
    r /= T(2) * temp;
    for (Index j = 0; j < r.rows(); ++j) {
      r.row(j) = (r.row(j).array() - r.row(j).maxCoeff()).exp();
      r.row(j) /= r.row(j).sum();
    }
    const VectorX<T> mass = r.colwise().sum().transpose();
    MatrixR<T> e(logits.rows(), logits.cols());
    k_ = k;
    lse_.resize(logits.rows());
    for (Index i = 0; i < logits.rows(); ++i) {
      T mx = -std::numeric_limits<T>::infinity();
      for (Index y = 0; y < logits.cols(); ++y)
        if (mass(y) > 0) mx = std::max(mx, logits(i, y));
      const T lse = mx + std::log(((logits.row(i).array() - mx).exp() * mass.transpose().array()).sum());
      // exp(ℓ_iy − L_i) ≤ 1/m_y, not ≤ 1: it exceeds 1 where a code of mass m_y < 1 dominates the query (no clamp:
      // clamping at 1 was wrong by up to 5% there, Gaussian keys with more codes than keys per code at T = 2).
      e.row(i) = (logits.row(i).array() - lse).exp();
      lse_(i) = lse;
    }
    logits_ = logits;
    op_ = std::make_unique<LowRankOperator<T>>(std::move(e), std::move(r), true);
  }
  return Status::Success;
}

/// The backward given the codebook C and the assignments (Lingle 2023: K̂ = ΔC, the codebook not differentiated).
///  hard, keys: exact attention on (Q, K̂, V) through per-code sums (CodebookOperator::backward), dK = dK̂ (the
///              straight-through estimator: Transformer-VQ's keys receive the gradient of their codes).
///  soft:       O = E (RᵀV), E_iy = exp(min(0, ℓ_iy − L_i)), L_i = log Σ_y exp(ℓ_iy) m_y, m_y = Σ_j R_jy,
///              R_jy = softmax_y(z_jy), z_jy = −‖k_j − c_y‖²/(2T). With W = RᵀV, D_i = dO_i·O_i:
///                g_iy = E_iy (dO_i·W_y),
///                dℓ_iy = g_iy − E_iy m_y Σ_y' g_iy',  dm_y = −Σ_i E_iy Σ_y' g_iy',
///                dQ = s·dℓ C,  dV = R (Eᵀ dO),  dR_jy = v_j·(Eᵀ dO)_y + dm_y,
///                dz_jy = R_jy (dR_jy − Σ_y' R_jy' dR_jy'),  dk_j = Σ_y dz_jy (c_y − k_j)/T  (C fixed).
///              At small T the responsibilities are nearly one-hot and dK is small against its terms (a
///              conditioning of the soft form itself: z_jy is formed as (2k·c − ‖k‖² − ‖c‖²)/(2T), so R carries
///              u·|z| relative error in float32); dR is shifted by its dominant code's value to avoid one more
///              cancellation.
///  both:       MeanFieldOperator::backward → dλ, dg, dV and the straight-through dK; λ = s·QCᵀ gives dQ = s·dλ C,
///              g = s·C'Rᵀ gives dC' = s·dg R, and C' (the query codebook, each centroid the mean of the queries it
///              was formed from, or one copied query) passes dC'_b / |cluster b| to each of its queries.
template <typename T>
Gradients<T> VqMethod<T>::do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  if (this->options().storage != Storage::native) {
    if (this->o_.quantize == VqQuantize::Both) return emulated_both_backward(v, d_out);
    return this->options().causal ? emulated_causal_backward(v, d_out) : emulated_backward(v, d_out);
  }
  const T s = T(this->options().scale);
  if (this->o_.quantize == VqQuantize::Both) {
    const auto& op = static_cast<const MeanFieldOperator<T>&>(*op_);
    typename MeanFieldOperator<T>::Backward b = op.backward(q_, v, d_out, this->options().scale);
    Gradients<T> g;
    g.dq.noalias() = b.dlambda * centroids_;
    g.dq *= s;
    MatrixR<T> dcq;
    dcq.noalias() = b.dg * resid_;  // c_q × d
    dcq *= s;
    add_query_codebook_gradient(dcq, g.dq);
    g.dk = std::move(b.dk);
    g.dv = std::move(b.dv);
    return g;
  }
  if (this->o_.assign == VqAssign::Hard) {
    const auto& op = static_cast<const CodebookOperator<T>&>(*op_);
    return op.backward(q_, centroids_, v, d_out, this->options().scale);  // dk = dK̂: straight-through
  }
  const auto& op = static_cast<const LowRankOperator<T>&>(*op_);
  const MatrixR<T>& e = op.left();   // n_q × c
  const MatrixR<T>& r = op.right();  // n_k × c
  const Index nq = e.rows(), c = e.cols();
  const VectorX<T> mass = r.colwise().sum().transpose();
  MatrixR<T> w;
  w.noalias() = r.transpose() * v;  // c × d_v
  MatrixR<T> gl;
  gl.noalias() = d_out * w.transpose();  // dO_i·W_y
  MatrixR<T> dl(nq, c);
  VectorX<T> dm = VectorX<T>::Zero(c);
  for (Index i = 0; i < nq; ++i) {
    T gsum = 0;
    for (Index y = 0; y < c; ++y) {
      gl(i, y) = e(i, y) * gl(i, y);
      gsum += gl(i, y);
    }
    for (Index y = 0; y < c; ++y) {
      const T et = std::exp(logits_(i, y) - lse_(i));
      dl(i, y) = gl(i, y) - et * mass(y) * gsum;
      dm(y) -= et * gsum;
    }
  }
  Gradients<T> g;
  g.dq.noalias() = dl * centroids_;
  g.dq *= s;
  MatrixR<T> ed;
  ed.noalias() = e.transpose() * d_out;  // c × d_v
  g.dv.noalias() = r * ed;
  MatrixR<T> dz;
  dz.noalias() = v * ed.transpose();  // n_k × c: v_j·(Eᵀ dO)_y
  dz.rowwise() += dm.transpose();     // dR
  // dz_jy = R_jy (dR_jy − Σ_y' R_jy' dR_jy'), with dR shifted by its value at the row's most responsible code y*
  // (Σ_y' R_jy' = 1): at small T the rows are nearly one-hot and the unshifted difference cancels for y*.
  for (Index j = 0; j < dz.rows(); ++j) {
    Index top;
    r.row(j).maxCoeff(&top);
    dz.row(j).array() -= dz(j, top);
    const T rd = r.row(j).dot(dz.row(j));
    dz.row(j) = r.row(j).array() * (dz.row(j).array() - rd);
  }
  const T temp = T(this->o_.temperature);
  g.dk.noalias() = dz * centroids_;
  g.dk -= (k_.array().colwise() * dz.rowwise().sum().array()).matrix();
  g.dk /= temp;
  return g;
}

template KMeansResult<float> vq_fit_codebook<float>(const ConstRef<float>&, Index, Index, std::uint64_t);
template KMeansResult<double> vq_fit_codebook<double>(const ConstRef<double>&, Index, Index, std::uint64_t);
/// The emulated forward's first steps, shared by every emulated path: C stored (into c), then ℓ = s·QCᵀ with QCᵀ and
/// its ·s each stored as accumulators (eager). With an untallied `r` the backward forms them again as stored.
template <typename T>
MatrixR<T> VqMethod<T>::stored_logits(const Rounding& r, MatrixR<T>& c) const {
  c = centroids_;
  r(c, Held::tensor, "codebook C");
  MatrixR<T> logits = q_ * c.transpose();
  r(logits, Held::accumulator, "logits s·QCᵀ");
  logits *= T(this->options().scale);
  r(logits, Held::accumulator, "logits s·QCᵀ");
  return logits;
}

namespace {

/// The division's gradients of O = num / den, which every emulated VQ form divides as a transcription does:
/// wn_i = dO_i / D_i and wd_i = −dO_i·num_i / D_i², each stored under eager.
template <typename T, typename Derived>
void division_gradients(const Rounding& r, const Eigen::MatrixBase<Derived>& d_out, const MatrixR<T>& num,
                        const VectorX<T>& den, MatrixR<T>& wn, VectorX<T>& wd) {
  wn = d_out.array().colwise() / den.array();
  wd = -((d_out.array() * num.array()).rowwise().sum() / den.array().square()).matrix();
  r(wn, Held::accumulator, "∂L/∂numerators, ∂L/∂normalisers");
  r(wd, Held::accumulator, "∂L/∂numerators, ∂L/∂normalisers");
}

}  // namespace

/// What the non-causal emulated forward keeps for its backward: the codebook, the weights and the per-code sums as
/// stored, the numerators and normalisers, and (assign=soft) the responsibilities R as stored.
template <typename T>
struct VqMethod<T>::Tape {
  MatrixR<T> c, w, sums, num, resp;
  VectorX<T> counts, den;
};

/// The soft assignment's responsibilities as a transcription stores them (assign=soft): z = (2K·Cᵀ − ‖k‖² − ‖c‖²)/(2T)
/// with K·Cᵀ, the squared norms, each subtraction and the division stored as accumulators (eager; the doubling is
/// exact), R = softmax_y(z) row by row (max subtracted, float32 inside, as a framework's softmax kernel) stored as a
/// tensor under both policies.
template <typename T>
MatrixR<T> VqMethod<T>::stored_responsibilities(const Rounding& r, const MatrixR<T>& c) const {
  const char* what = "responsibility logits −‖k − c‖²/(2T)";
  MatrixR<T> z = k_ * c.transpose();
  r(z, Held::accumulator, what);
  VectorX<T> kn = k_.rowwise().squaredNorm(), cn = c.rowwise().squaredNorm();
  r(kn, Held::accumulator, what);
  r(cn, Held::accumulator, what);
  z *= T(2);
  z.colwise() -= kn;
  r(z, Held::accumulator, what);
  z.rowwise() -= cn.transpose();
  r(z, Held::accumulator, what);
  z /= T(2) * T(this->o_.temperature);
  r(z, Held::accumulator, what);
  for (Index j = 0; j < z.rows(); ++j) {
    z.row(j) = (z.row(j).array() - z.row(j).maxCoeff()).exp();
    z.row(j) /= z.row(j).sum();
  }
  r(z, Held::tensor, "responsibilities R");
  return z;
}

/// Emulated half storage, non-causal (Lingle 2023 Fig. 2 written as a transcription computes it): C stored;
/// ℓ = s·QCᵀ; per code the value sum and the key count ΔᵀV, Δᵀ1 (hard) or RᵀV and the masses Rᵀ1 (soft, R stored:
/// stored_responsibilities); W = exp(ℓ − max_y ℓ) over the codes that hold keys; O = (W·sums) / (W·counts), divided
/// as the transcription divides (a normaliser that overflowed gives 0, one that is 0 gives NaN). Which of these each
/// policy stores: the registry entry's note. The tape keeps them for emulated_backward.
template <typename T>
MatrixR<T> VqMethod<T>::emulated_output(const ConstRef<T>& v, const Rounding& r, Tape& t) const {
  t.w = stored_logits(r, t.c);
  const Index codes = t.c.rows();
  if (this->o_.assign == VqAssign::Soft) {
    t.resp = stored_responsibilities(r, t.c);
    t.sums.noalias() = t.resp.transpose() * v;
    t.counts = t.resp.colwise().sum().transpose();
    r(t.sums, Held::accumulator, "per-code value sums RᵀV, masses");
    r(t.counts, Held::accumulator, "per-code value sums RᵀV, masses");
  } else {
    const std::vector<Index>& a = static_cast<const CodebookOperator<T>&>(*op_).assignment();
    t.sums = MatrixR<T>::Zero(codes, v.cols());
    t.counts = VectorX<T>::Zero(codes);
    for (Index j = 0; j < v.rows(); ++j) {
      t.sums.row(a[std::size_t(j)]) += v.row(j);
      t.counts(a[std::size_t(j)]) += T(1);
    }
    r(t.sums, Held::accumulator, "per-code value sums ΔᵀV, counts");
    r(t.counts, Held::accumulator, "per-code value sums ΔᵀV, counts");
  }
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  for (Index i = 0; i < t.w.rows(); ++i) {
    T mx = neg_inf;
    for (Index y = 0; y < codes; ++y)
      if (t.counts(y) > 0) mx = std::max(mx, t.w(i, y));
    for (Index y = 0; y < codes; ++y) t.w(i, y) = t.counts(y) > 0 ? std::exp(t.w(i, y) - mx) : T(0);
  }
  r(t.w, Held::tensor, "weights exp(ℓ − max)");
  // Formed as new matrices, then moved into the tape: assigned to the tape's members directly (Eigen evaluates an
  // assigned product through a temporary), the precision experiment's VQ values moved in their last bits (measured).
  MatrixR<T> num = t.w * t.sums;
  r(num, Held::accumulator, "numerators, normalisers");
  VectorX<T> den = t.w * t.counts;
  r(den, Held::accumulator, "numerators, normalisers");
  t.num = std::move(num);
  t.den = std::move(den);
  return (t.num.array().colwise() / t.den.array()).matrix();
}

template <typename T>
MatrixR<T> VqMethod<T>::do_output(const ConstRef<T>& v) const {
  const AttentionOptions& opts = this->options();
  if (opts.storage == Storage::native) return op_->apply(v);
  if (opts.causal) return emulated_causal_output(v, this->rounding_hook(), nullptr);
  if (this->o_.quantize == VqQuantize::Both) {
    BothTape t;
    return emulated_both_output(v, this->rounding_hook(), t);
  }
  Tape t;
  return emulated_output(v, this->rounding_hook(), t);
}

/// C' (the query codebook: each centroid the mean of the queries it was formed from, or one copied query) passes
/// ∂L/∂C'_b / |cluster b| to each of its queries, or all of it to the query it copies (quantize=both).
template <typename T>
void VqMethod<T>::add_query_codebook_gradient(const MatrixR<T>& dcq, MatrixR<T>& dq) const {
  std::vector<Index> count(q_copy_of_.size(), 0);
  for (Index x : q_formed_from_)
    if (x >= 0) ++count[std::size_t(x)];
  for (Index i = 0; i < Index(q_formed_from_.size()); ++i) {
    const Index c = q_formed_from_[std::size_t(i)];
    if (c >= 0 && q_copy_of_[std::size_t(c)] < 0) dq.row(i) += dcq.row(c) / T(count[std::size_t(c)]);
  }
  for (std::size_t c = 0; c < q_copy_of_.size(); ++c)
    if (q_copy_of_[c] >= 0) dq.row(q_copy_of_[c]) += dcq.row(Index(c));
}

/// What the mean-field form's emulated forward keeps for its backward: the key and query codebooks and the
/// residuals as stored, the logits λ, the key weights G̃ and the query weights E as stored, per query code b the
/// per-key-code value sums W_b (c × d_v) and key-weight sums H_b (a row of h), the numerators and normalisers.
template <typename T>
struct VqMethod<T>::BothTape {
  MatrixR<T> c, cq, resid, lam, gt, h, e, num;
  std::vector<MatrixR<T>> w;
  VectorX<T> den;
};

/// quantize=both (attnlab's mean-field form, MeanFieldOperator) as a transcription computes it, per query code b a
/// Transformer-VQ over the key codes: C, C' and the residuals R = K − ΔC stored (both policies); λ = s·QCᵀ and
/// g = s·C'Rᵀ (each product and its ·s stored under eager); m_by = max_{a(j)=y} g_bj, the key weights
/// G̃_bj = exp(g_bj − m_b,a(j)) stored (both); per query code the sums W_b = Σ_j G̃_bj e_a(j) v_jᵀ and
/// H_by = Σ_{a(j)=y} G̃_bj (eager); the joint logits λ_iy + m_b(i),y (eager) and the query weights E_iy = exp(λ_iy +
/// m_b(i),y − max) over the codes that hold keys, stored (both); O_i = (E_i·W_b(i)) / (E_i·H_b(i)), numerators and
/// normalisers stored under eager, divided unguarded.
template <typename T>
MatrixR<T> VqMethod<T>::emulated_both_output(const ConstRef<T>& v, const Rounding& r, BothTape& t) const {
  const T s = T(this->options().scale);
  t.lam = stored_logits(r, t.c);
  t.cq = qcentroids_;
  r(t.cq, Held::tensor, "query codebook C', residuals K − ΔC");
  const std::vector<Index>&a = key_codes_, &b = query_codes_;
  const Index c = t.c.rows(), cq = t.cq.rows(), nk = v.rows(), nq = q_.rows(), dv = v.cols();
  t.resid = k_;
  for (Index j = 0; j < nk; ++j) t.resid.row(j) -= t.c.row(a[std::size_t(j)]);
  r(t.resid, Held::tensor, "query codebook C', residuals K − ΔC");
  MatrixR<T> g = t.cq * t.resid.transpose();
  r(g, Held::accumulator, "key logits s·C'Rᵀ");
  g *= s;
  r(g, Held::accumulator, "key logits s·C'Rᵀ");
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  MatrixR<T> m = MatrixR<T>::Constant(cq, c, neg_inf);
  for (Index j = 0; j < nk; ++j)
    for (Index bq = 0; bq < cq; ++bq) m(bq, a[std::size_t(j)]) = std::max(m(bq, a[std::size_t(j)]), g(bq, j));
  t.gt.resize(cq, nk);
  for (Index j = 0; j < nk; ++j)
    for (Index bq = 0; bq < cq; ++bq) t.gt(bq, j) = std::exp(g(bq, j) - m(bq, a[std::size_t(j)]));
  r(t.gt, Held::tensor, "key weights exp(g − max)");
  t.h = MatrixR<T>::Zero(cq, c);
  t.w.assign(std::size_t(cq), MatrixR<T>::Zero(c, dv));
  for (Index j = 0; j < nk; ++j)
    for (Index bq = 0; bq < cq; ++bq) {
      t.w[std::size_t(bq)].row(a[std::size_t(j)]) += t.gt(bq, j) * v.row(j);
      t.h(bq, a[std::size_t(j)]) += t.gt(bq, j);
    }
  const char* sums = "per-code value sums and key-weight sums, per query code";
  for (MatrixR<T>& x : t.w) r(x, Held::accumulator, sums);
  r(t.h, Held::accumulator, sums);
  t.e.resize(nq, c);
  for (Index i = 0; i < nq; ++i) t.e.row(i) = t.lam.row(i) + m.row(b[std::size_t(i)]);
  r(t.e, Held::accumulator, "joint logits λ + m");
  for (Index i = 0; i < nq; ++i) {
    const Index bq = b[std::size_t(i)];
    T mx = neg_inf;
    for (Index y = 0; y < c; ++y)
      if (t.h(bq, y) > 0) mx = std::max(mx, t.e(i, y));
    for (Index y = 0; y < c; ++y) t.e(i, y) = t.h(bq, y) > 0 ? std::exp(t.e(i, y) - mx) : T(0);
  }
  r(t.e, Held::tensor, "weights exp(ℓ − max)");
  t.num.resize(nq, dv);
  t.den.resize(nq);
  for (Index i = 0; i < nq; ++i) {
    const Index bq = b[std::size_t(i)];
    t.num.row(i).noalias() = t.e.row(i) * t.w[std::size_t(bq)];
    t.den(i) = t.e.row(i).dot(t.h.row(bq));
  }
  r(t.num, Held::accumulator, "numerators, normalisers");
  r(t.den, Held::accumulator, "numerators, normalisers");
  return (t.num.array().colwise() / t.den.array()).matrix();
}

/// Reverse mode through emulated_both_output, the codes fixed (the maxima m cancel between E and G̃): the division's
/// gradients wn_i = dO_i/D_i, wd_i = −dO_i·num_i/D_i² (eager); ∂L/∂E_i = wn_i·W_bᵀ + wd_i·H_b (both); ∂L/∂λ = E ∘ ∂L/∂E
/// and its ·s (eager), dQ = s·∂L/∂λ·C; per query code ∂L/∂W_b = Σ_{b(i)=b} E_iᵀwn_i, ∂L/∂H_b = Σ_{b(i)=b} wd_i E_i
/// (eager); ∂L/∂G̃_bj = ∂L/∂W_b,a(j)·v_j + ∂L/∂H_b,a(j) (both); dV_j = Σ_b G̃_bj ∂L/∂W_b,a(j); ∂L/∂g = G̃ ∘ ∂L/∂G̃ and
/// its ·s (eager), ∂L/∂C' = s·∂L/∂g·R to the queries C' was formed from; dK straight-through as the native backward
/// (s·Σ_i ∂L/∂ℓ_ij q_i), per key from its codes' sums G_by = Σ_{b(i)=b} E_iy q_i [wn_i, wd_i] (eager).
template <typename T>
Gradients<T> VqMethod<T>::emulated_both_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  const Rounding r = this->rounding_hook(), again = r.untallied();
  const T s = T(this->options().scale);
  BothTape t;
  emulated_both_output(v, again, t);
  const std::vector<Index>&a = key_codes_, &b = query_codes_;
  const Index c = t.c.rows(), cq = t.cq.rows(), nk = v.rows(), nq = q_.rows(), dv = v.cols(), d = q_.cols();
  MatrixR<T> wn;
  VectorX<T> wd;
  division_gradients(r, d_out, t.num, t.den, wn, wd);
  MatrixR<T> de(nq, c);
  for (Index i = 0; i < nq; ++i) {
    const Index bq = b[std::size_t(i)];
    de.row(i).noalias() = wn.row(i) * t.w[std::size_t(bq)].transpose();
    de.row(i) += wd(i) * t.h.row(bq);
  }
  r(de, Held::tensor, "backward: ∂L/∂weights");
  MatrixR<T> dl = t.e.cwiseProduct(de);
  r(dl, Held::accumulator, "backward: ∂L/∂logits");
  dl *= s;
  r(dl, Held::accumulator, "backward: ∂L/∂logits");
  Gradients<T> g;
  g.dq.noalias() = dl * t.c;
  std::vector<MatrixR<T>> dw(static_cast<std::size_t>(cq), MatrixR<T>::Zero(c, dv));
  MatrixR<T> dh = MatrixR<T>::Zero(cq, c);
  for (Index i = 0; i < nq; ++i) {
    const Index bq = b[std::size_t(i)];
    dw[std::size_t(bq)].noalias() += t.e.row(i).transpose() * wn.row(i);
    dh.row(bq) += wd(i) * t.e.row(i);
  }
  const char* dsums = "backward: ∂L/∂per-code sums, per query code";
  for (MatrixR<T>& x : dw) r(x, Held::accumulator, dsums);
  r(dh, Held::accumulator, dsums);
  MatrixR<T> dgt(cq, nk);
  g.dv = MatrixR<T>::Zero(nk, dv);
  for (Index j = 0; j < nk; ++j) {
    const Index y = a[std::size_t(j)];
    for (Index bq = 0; bq < cq; ++bq) {
      const auto dwy = dw[std::size_t(bq)].row(y);
      dgt(bq, j) = dwy.dot(v.row(j)) + dh(bq, y);
      g.dv.row(j) += t.gt(bq, j) * dwy;
    }
  }
  r(dgt, Held::tensor, "backward: ∂L/∂key weights");
  MatrixR<T> dg = t.gt.cwiseProduct(dgt);
  r(dg, Held::accumulator, "backward: ∂L/∂key logits");
  dg *= s;
  r(dg, Held::accumulator, "backward: ∂L/∂key logits");
  MatrixR<T> dcq = dg * t.resid;
  add_query_codebook_gradient(dcq, g.dq);
  // Straight-through dK̂: per query code b and key code y, G_by = Σ_{b(i)=b} E_iy q_i [wn_i, wd_i] (d × (d_v + 1));
  // dk_j = s·Σ_b G̃_bj G_b,a(j) [v_j; 1] — one query code at a time (c matrices held, as the native backward).
  std::vector<std::vector<Index>> queries_of(static_cast<std::size_t>(cq));
  for (Index i = 0; i < nq; ++i) queries_of[std::size_t(b[std::size_t(i)])].push_back(i);
  std::vector<MatrixR<T>> gy(static_cast<std::size_t>(c));
  g.dk = MatrixR<T>::Zero(nk, d);
  for (Index bq = 0; bq < cq; ++bq) {
    const auto& qi = queries_of[std::size_t(bq)];
#pragma omp parallel for schedule(dynamic)
    for (Index y = 0; y < c; ++y) {
      MatrixR<T>& G = gy[std::size_t(y)];
      G = MatrixR<T>::Zero(d, dv + 1);
      if (t.h(bq, y) == 0) continue;
      for (Index i : qi) {
        if (t.e(i, y) == T(0)) continue;
        G.leftCols(dv).noalias() += (t.e(i, y) * q_.row(i)).transpose() * wn.row(i);
        G.col(dv) += (t.e(i, y) * wd(i)) * q_.row(i).transpose();
      }
      r(G, Held::accumulator, "backward: per-code key-gradient sums");
    }
#pragma omp parallel for schedule(static)
    for (Index j = 0; j < nk; ++j) {
      const MatrixR<T>& G = gy[std::size_t(a[std::size_t(j)])];
      g.dk.row(j) += t.gt(bq, j) * (G.leftCols(dv) * v.row(j).transpose() + G.col(dv)).transpose();
    }
  }
  g.dk *= s;
  return g;
}

/// Reverse mode through the emulated forward's transcription O = (W·S) / (W·N) (emulated_output; W = exp(ℓ − max ℓ),
/// S, N the per-code sums and counts or masses), codebook (and hard: assignments) held fixed, V and dO stored by
/// Method::backward: the division's gradients w_i = dO_i/D_i and −dO_iᵀO_i/D_i (stored under eager), ∂L/∂W =
/// w·[S, N]ᵀ (stored under both), ∂L/∂ℓ = W ∘ ∂L/∂W and its ·s (eager), dQ = s·∂L/∂ℓ·C; ∂L/∂S = Wᵀw (eager).
///  hard: dV_j = (∂L/∂S)_{a(j)}; dK by the straight-through estimator, per key from its code's sums
///        Σ_i W_iy q_i [w_i, −D_i'] (the per-key logits' gradient s·Σ_i W_iy (w_i·v_j − D_i') q_i; stored under eager).
///  soft: ∂L/∂N = Wᵀ(−D') (eager, with ∂L/∂S); dV = R·∂L/∂S; ∂L/∂R = V·∂L/∂Sᵀ + 1·∂L/∂Nᵀ (stored under both); the
///        softmax's reverse as autograd forms it, ∂L/∂z = R ∘ (∂L/∂R − rowsum(R ∘ ∂L/∂R)) (eager); dK =
///        (∂L/∂z·C − rowsum(∂L/∂z) ∘ K)/T, from z = (2K·Cᵀ − ‖k‖² − ‖c‖²)/(2T) at the fixed codebook.
template <typename T>
Gradients<T> VqMethod<T>::emulated_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  const AttentionOptions& opts = this->options();
  const Rounding r = this->rounding_hook(), again = r.untallied();
  const T s = T(opts.scale);
  // The forward's stored tensors, formed again as do_output forms them.
  Tape t;
  emulated_output(v, again, t);
  const MatrixR<T>&c = t.c, &w = t.w, &sums = t.sums;
  const VectorX<T>& counts = t.counts;
  const Index codes = c.rows(), nq = q_.rows(), dv = v.cols(), d = q_.cols();
  // The division's gradients, then the weights'.
  MatrixR<T> wn;
  VectorX<T> wd;
  division_gradients(r, d_out, t.num, t.den, wn, wd);
  MatrixR<T> dw = wn * sums.transpose();
  dw.noalias() += wd * counts.transpose();
  r(dw, Held::tensor, "backward: ∂L/∂weights");
  MatrixR<T> dl = w.cwiseProduct(dw);
  r(dl, Held::accumulator, "backward: ∂L/∂logits");
  dl *= s;
  r(dl, Held::accumulator, "backward: ∂L/∂logits");
  Gradients<T> g;
  g.dq.noalias() = dl * c;
  MatrixR<T> dsums = w.transpose() * wn;
  if (this->o_.assign == VqAssign::Soft) {
    const char* what = "backward: ∂L/∂RᵀV, ∂L/∂masses";
    r(dsums, Held::accumulator, what);
    VectorX<T> dmass = w.transpose() * wd;
    r(dmass, Held::accumulator, what);
    const MatrixR<T>& resp = t.resp;
    g.dv.noalias() = resp * dsums;
    MatrixR<T> dz = v * dsums.transpose();  // ∂L/∂R
    dz.rowwise() += dmass.transpose();
    r(dz, Held::tensor, "backward: ∂L/∂responsibilities");
    const VectorX<T> rd = resp.cwiseProduct(dz).rowwise().sum();
    dz = (resp.array() * (dz.colwise() - rd).array()).matrix();
    r(dz, Held::accumulator, "backward: ∂L/∂responsibility logits");
    g.dk.noalias() = dz * c;
    g.dk -= (k_.array().colwise() * dz.rowwise().sum().array()).matrix();
    g.dk /= T(this->o_.temperature);
    return g;
  }
  const std::vector<Index>& a = static_cast<const CodebookOperator<T>&>(*op_).assignment();
  r(dsums, Held::accumulator, "backward: ∂L/∂ΔᵀV");
  g.dv.resize(v.rows(), dv);
  for (Index j = 0; j < v.rows(); ++j) g.dv.row(j) = dsums.row(a[std::size_t(j)]);
  // Straight-through dK̂: per code y, G_y = Σ_i W_iy q_i [wn_i, wd_i] (d × (d_v + 1)); dk_j = s·G_y [v_j; 1].
  MatrixR<T> wt(nq, dv + 1);
  wt.leftCols(dv) = wn;
  wt.col(dv) = wd;
  g.dk.resize(v.rows(), d);
  std::vector<MatrixR<T>> gy(static_cast<std::size_t>(codes));
#pragma omp parallel for schedule(dynamic)
  for (Index y = 0; y < codes; ++y) {
    if (counts(y) == 0) continue;
    MatrixR<T>& G = gy[std::size_t(y)];
    G.noalias() = q_.transpose() * (w.col(y).asDiagonal() * wt);
    r(G, Held::accumulator, "backward: per-code key-gradient sums");
  }
  for (Index j = 0; j < v.rows(); ++j) {
    const MatrixR<T>& G = gy[std::size_t(a[std::size_t(j)])];
    g.dk.row(j) = s * (G.leftCols(dv) * v.row(j).transpose() + G.col(dv)).transpose();
  }
  return g;
}

/// What emulated_causal_output keeps for its backward: the codebook as stored and, per block of queries, the weights
/// exp(ℓ − max) as stored (rows × codes) and the block's keys' weights under the mask (rows × rows), the cache before
/// the block (per-code value sums and counts, as stored), and the block's numerators and normalisers as stored.
template <typename T>
struct VqMethod<T>::CausalTape {
  MatrixR<T> c;  // the codebook as stored
  std::vector<MatrixR<T>> w, el, u, num;
  std::vector<VectorX<T>> cnt, den;
};

/// Transformer-VQ's blockwise causal form (Lingle 2023 §3.3) as a transcription computes it, every stored tensor
/// rounded by `r`: C stored, ℓ = s·QCᵀ (QCᵀ and ·s stored under eager); the cache starts with the keys every query
/// sees (those before the first query's own, n_k > n_q); per block of kCausalBlock queries, row i's weights
/// w_iy = exp(ℓ_iy − max) over the codes present among the keys it sees (the cache's and the block's up to its own),
/// stored; the block's keys enter with their codes' weights under the causal mask, so row i's numerator is
/// w_i·U + Σ_{t ≤ i} w_{i,a(t)} v_t and its normaliser w_i·N + Σ_{t ≤ i} w_{i,a(t)} (stored under eager), O = num /
/// den unguarded; then the block's keys join the cache (U, N stored under eager).
template <typename T>
MatrixR<T> VqMethod<T>::emulated_causal_output(const ConstRef<T>& v, const Rounding& r, CausalTape* tape) const {
  const std::vector<Index>& a = static_cast<const CodebookOperator<T>&>(*op_).assignment();
  MatrixR<T> c;
  const MatrixR<T> logits = stored_logits(r, c);
  if (tape) tape->c = c;
  const Index nq = q_.rows(), nk = v.rows(), off = nk - nq, codes = c.rows(), dv = v.cols();
  MatrixR<T> u = MatrixR<T>::Zero(codes, dv);
  VectorX<T> cnt = VectorX<T>::Zero(codes);
  for (Index j = 0; j < off; ++j) {  // the keys every query sees: the cache before the first block
    u.row(a[std::size_t(j)]) += v.row(j);
    cnt(a[std::size_t(j)]) += T(1);
  }
  r(u, Held::accumulator, "cache: per-code value sums, counts");
  r(cnt, Held::accumulator, "cache: per-code value sums, counts");
  MatrixR<T> out(nq, dv);
  std::vector<char> present(static_cast<std::size_t>(codes));
  for (Index i0 = 0; i0 < nq; i0 += kCausalBlock) {
    const Index len = std::min(kCausalBlock, nq - i0), k0 = i0 + off;  // the block's keys: k0 .. k0 + len − 1
    for (Index y = 0; y < codes; ++y) present[std::size_t(y)] = cnt(y) > 0;
    MatrixR<T> w(len, codes);
    for (Index t = 0; t < len; ++t) {
      present[std::size_t(a[std::size_t(k0 + t)])] = 1;  // row t sees the block's keys up to its own
      T mx = -std::numeric_limits<T>::infinity();
      for (Index y = 0; y < codes; ++y)
        if (present[std::size_t(y)]) mx = std::max(mx, logits(i0 + t, y));
      for (Index y = 0; y < codes; ++y)
        w(t, y) = present[std::size_t(y)] ? std::exp(logits(i0 + t, y) - mx) : T(0);
    }
    r(w, Held::tensor, "weights exp(ℓ − max)");
    MatrixR<T> el = MatrixR<T>::Zero(len, len);  // the block's keys' weights under the mask
    for (Index t = 0; t < len; ++t)
      for (Index x = 0; x <= t; ++x) el(t, x) = w(t, a[std::size_t(k0 + x)]);
    MatrixR<T> num = w * u;
    num.noalias() += el * v.middleRows(k0, len);
    VectorX<T> den = w * cnt;
    den += el.rowwise().sum();
    r(num, Held::accumulator, "numerators, normalisers");
    r(den, Held::accumulator, "numerators, normalisers");
    out.middleRows(i0, len) = (num.array().colwise() / den.array()).matrix();
    if (tape) {
      tape->w.push_back(w);
      tape->el.push_back(el);
      tape->u.push_back(u);
      tape->cnt.push_back(cnt);
      tape->num.push_back(std::move(num));
      tape->den.push_back(std::move(den));
    }
    for (Index t = 0; t < len; ++t) {
      u.row(a[std::size_t(k0 + t)]) += v.row(k0 + t);
      cnt(a[std::size_t(k0 + t)]) += T(1);
    }
    r(u, Held::accumulator, "cache: per-code value sums, counts");
    r(cnt, Held::accumulator, "cache: per-code value sums, counts");
  }
  return out;
}

/// Reverse mode through emulated_causal_output (its tensors formed again untallied, then the blocks last to first),
/// codebook and assignments fixed. Per block, with wn_i = dO_i/den_i and wd_i = −dO_iᵀnum_i/den_i²: ∂L/∂w =
/// wn·Uᵀ + wd·Nᵀ plus the block's keys' ∂L/∂el_it = wn_i·v_t + wd_i added at their codes (stored), ∂L/∂ℓ = w ∘ ∂L/∂w
/// and its ·s, dQ = s·∂L/∂ℓ·C; dV of the block's keys = elᵀ·wn plus the cache's gradient from later blocks
/// (Σ wᵀ·wn, stored under eager after every block); dK̂ of the block's keys, straight-through as the native backward
/// defines it (every query that sees the key): the block's own pairs s·(el ∘ ∂L/∂el)ᵀQ, and the later blocks' by
/// code, s·G_y [v_j; 1] with G_y = Σ_i w_iy q_i [wn_i, wd_i] (stored under eager after every block).
template <typename T>
Gradients<T> VqMethod<T>::emulated_causal_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const {
  const Rounding r = this->rounding_hook(), again = r.untallied();
  CausalTape tape;
  emulated_causal_output(v, again, &tape);
  const MatrixR<T>& c = tape.c;
  const std::vector<Index>& a = static_cast<const CodebookOperator<T>&>(*op_).assignment();
  const T s = T(this->options().scale);
  const Index nq = q_.rows(), nk = v.rows(), off = nk - nq, codes = c.rows(), dv = v.cols(), d = q_.cols();
  Gradients<T> g;
  g.dq.resize(nq, d);
  g.dk.resize(nk, d);
  g.dv.resize(nk, dv);
  MatrixR<T> du = MatrixR<T>::Zero(codes, dv);  // ∂L/∂(the cache's value sums) from the blocks after the current one
  std::vector<MatrixR<T>> gy(static_cast<std::size_t>(codes), MatrixR<T>::Zero(d, dv + 1));
  const auto straight_through = [&](Index j) {  // the later blocks' share of key j's dK̂
    const MatrixR<T>& G = gy[std::size_t(a[std::size_t(j)])];
    return (G.leftCols(dv) * v.row(j).transpose() + G.col(dv)).transpose();
  };
  const Index blocks = Index(tape.w.size());
  for (Index b = blocks - 1; b >= 0; --b) {
    const Index i0 = b * kCausalBlock, len = std::min(kCausalBlock, nq - i0), k0 = i0 + off;
    const MatrixR<T>& w = tape.w[std::size_t(b)];
    const VectorX<T>& den = tape.den[std::size_t(b)];
    const auto dob = d_out.middleRows(i0, len);
    MatrixR<T> wn;
    VectorX<T> wd;
    division_gradients(r, dob, tape.num[std::size_t(b)], den, wn, wd);
    const auto vb = v.middleRows(k0, len);
    const MatrixR<T>& el = tape.el[std::size_t(b)];
    MatrixR<T> del = wn * vb.transpose();  // ∂L/∂el_it = wn_i·v_t + wd_i, t ≤ i
    del.colwise() += wd;
    del.template triangularView<Eigen::StrictlyUpper>().setZero();
    MatrixR<T> dw = wn * tape.u[std::size_t(b)].transpose();
    dw.noalias() += wd * tape.cnt[std::size_t(b)].transpose();
    for (Index t = 0; t < len; ++t)
      for (Index x = 0; x <= t; ++x) dw(t, a[std::size_t(k0 + x)]) += del(t, x);
    r(dw, Held::tensor, "backward: ∂L/∂weights");
    MatrixR<T> dl = w.cwiseProduct(dw);
    r(dl, Held::accumulator, "backward: ∂L/∂logits");
    dl *= s;
    r(dl, Held::accumulator, "backward: ∂L/∂logits");
    g.dq.middleRows(i0, len).noalias() = dl * c;
    // The block's keys: their pairs with the block's queries, then the later blocks' share (the cache, by code).
    g.dv.middleRows(k0, len).noalias() = el.transpose() * wn;
    MatrixR<T> dlog = el.cwiseProduct(del);
    r(dlog, Held::accumulator, "backward: the block's per-key logit gradients");
    g.dk.middleRows(k0, len).noalias() = dlog.transpose() * q_.middleRows(i0, len);
    for (Index t = 0; t < len; ++t) {
      g.dv.row(k0 + t) += du.row(a[std::size_t(k0 + t)]);
      g.dk.row(k0 + t) += straight_through(k0 + t);
    }
    g.dk.middleRows(k0, len) *= s;
    // This block's share for the earlier keys.
    du.noalias() += w.transpose() * wn;
    r(du, Held::accumulator, "backward: the cache's gradient");
    MatrixR<T> x(len, dv + 1);
    x.leftCols(dv) = wn;
    x.col(dv) = wd;
#pragma omp parallel for schedule(dynamic)
    for (Index y = 0; y < codes; ++y) {
      if (!(w.col(y).array() != T(0)).any()) continue;
      MatrixR<T>& G = gy[std::size_t(y)];
      G.noalias() += q_.middleRows(i0, len).transpose() * (w.col(y).asDiagonal() * x);
      r(G, Held::accumulator, "backward: per-code key-gradient sums");
    }
  }
  for (Index j = 0; j < off; ++j) {  // the keys every query sees: every block's share
    g.dv.row(j) = du.row(a[std::size_t(j)]);
    g.dk.row(j) = s * straight_through(j);
  }
  return g;
}

template class VqMethod<float>;
template class VqMethod<double>;

}  // namespace attnlab
