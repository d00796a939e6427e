// A rounding-error bound for softmax attention under an emulated storage format (issue "Reduced precision", item 3):
// how far the emulation of exact attention (core/precision.hpp; methods/exact) can be from exact attention computed
// in exact arithmetic on the same inputs, entry by entry. Worst case and rigorous (not first order), given float32
// products and sums with unit roundoff u₃₂ = 2⁻²⁴ and an exp within 2 ulp; the analysis follows Blanchard, Higham &
// Higham 2021 ("Accurately computing the log-sum-exp and softmax functions", IMA J. Numer. Anal. 41(4)): a shifted
// softmax is well conditioned in the logits' absolute error, p'_j / p_j ∈ [e^{−2D}, e^{2D}] when every logit moves by
// at most D, and its float32 evaluation adds a relative γ_{n+O(1)}.
//
// With u the format's unit roundoff (bf16 2⁻⁸, fp16 2⁻¹¹), η half its smallest subnormal (bf16 2⁻¹³⁴, fp16 2⁻²⁵),
// x̄ = |x| + η/u (so |fl(x) − x| ≤ u·x̄), γ_m = m·u₃₂/(1 − m·u₃₂) and s the scale, per query i:
//   logits    |ẑ_ij − z_ij| ≤ D_ij = s·(q̄_iᵀk̄_j)·[(1+u)^{2+2e}(1+γ_d)(1+u₃₂) − 1] + 2u₃₂·|ẑ|max,
//             e = 1 under eager (QKᵀ and s·QKᵀ each stored), 0 under careful (Q, K stored; logits in float32);
//             D_i = max over the visible j;
//   weights   each normalised weight w_ij the kernel applies to v̂_j lies in [p_ij/R_i, p_ij·R_i] up to
//             a = 2⁻¹²⁶(1+u) + η per entry (float32's exp floor — Eigen's vectorised exp clamps its argument at
//             −88.72 —, the storing),
//             R_i = e^{2D_i}·(1+u)^{2+2T}·(1+γ_{n+8})²: P stored (materialised: once; streaming: each tile of P before
//             its product with V, and the sums from the stored tile), and under eager streaming the running sums ℓ
//             and the running accumulator stored after each of the T key tiles (careful: T = 0);
//   output    |Ô_ic − O_ic| ≤ (1+u)·[(R_i(1+u)(1+γ_n) − 1)·(P·V̄)_ic + n·a·(1+u)·max_j v̄_jc] + u·|O_ic| + η,
//             O stored at the end (both policies).
// Under fp16 a logit or a running value can overflow; where q̄ᵀk̄ or s·q̄ᵀk̄ (eager: both are stored; careful: the
// float32 product, formed before the scale) could pass the format's (careful: float32's) largest finite value or,
// eager streaming, ℓ the format's, the bound is +inf for that row: no guarantee, and the tallies report the overflow.
// The bound is worst case over every rounding: random rounding errors cancel, so measurements sit well below it; it
// is what they must never exceed (tests/test_precision.cpp's RoundingBound tests, the precision experiment's `bound_*`
// metrics). Every bound takes, in float64, the float32 values the emulation was given (exact's and the pattern
// methods' analysis assumes them; the other bounds round a double input to float32 first, as a caller's cast does).
#pragma once

#include "attnlab/core/options.hpp"
#include "attnlab/core/precision.hpp"
#include "attnlab/core/types.hpp"

#include <vector>

namespace attnlab {

struct SoftmaxRoundingBound {
  double u = 0, eta = 0;  // the format's unit roundoff and half its smallest subnormal
  double p_abs = 0;       // each probability's absolute error: float32's exp floor 2⁻¹²⁶(1+u), then η
  VectorX<double> logit;  // D_i, per query
  VectorX<double> ratio;  // R_i, per query (+inf: no guarantee)
  MatrixR<double> output; // the componentwise bound on |Ô − O|, n_q × d_v
  /// ‖output‖_F: a bound on ‖Ô − O‖_F.
  double output_norm() const;
  /// The bound on |p̂_ij − p_ij| for a materialised P: (R_i − 1)·p_ij + p_abs.
  double probability(Index i, double p) const;
};

/// The float64 work the bound needs, done once for every format, policy and path: per query the largest q̄ᵀk̄ over
/// the visible keys (the products |Q|·|K|ᵀ in blocks, O(n_q·n_k·d)), exact attention O and P·V̄ (float64, streaming).
/// x̄ is taken with fp16's η/u = 2⁻¹⁴, which is larger than bf16's: a bound for both.
struct SoftmaxRoundingAnalysis {
  SoftmaxRoundingAnalysis(const ConstRef<double>& q, const ConstRef<double>& k, const ConstRef<double>& v,
                          const AttentionOptions& opts);
  /// The same for a softmax over a pattern — row i sees the keys pattern[i] only: the local window and the sparse
  /// patterns, whose emulation (local_output, pattern_softmax) is the materialised transcription restricted to the
  /// pattern (logits stored under eager, P stored, the sums in float32), so the materialised bound holds with the
  /// pattern's largest row in place of n_k. O and P·V̄ over the pattern in float64; bound() then takes
  /// streaming = false only.
  SoftmaxRoundingAnalysis(const ConstRef<double>& q, const ConstRef<double>& k, const ConstRef<double>& v,
                          const std::vector<std::vector<Index>>& pattern, double scale);
  bool over_pattern = false;
  Index n_k = 0, d = 0;
  double scale = 0, input_max = 0;
  VectorX<double> qk_max;                       // max over the visible j of q̄_iᵀk̄_j
  std::vector<Index> visible;                   // keys each query sees
  VectorX<double> vbar_visible_max;             // the largest v̄ entry over each query's visible keys
  MatrixR<double> o, pv;                        // exact O and P·V̄
  Eigen::Matrix<double, 1, Eigen::Dynamic> vbar_col_max;  // max_j v̄_jc
  /// The bound under opts.storage (bf16 or fp16) and opts.policy: `streaming` for exact_output's tiles of `tile` keys
  /// (impl=streaming), else the materialised P (impl=materialized). O(n_q·d_v).
  SoftmaxRoundingBound bound(const AttentionOptions& opts, bool streaming, Index tile = 256) const;
  /// The same for a softmax streamed in at most `pieces` pieces per query (an online softmax whose running sums and
  /// accumulator, under eager, are stored after each piece; 0: materialised) — over a pattern too: Reformer's rounds.
  SoftmaxRoundingBound bound_in_pieces(const AttentionOptions& opts, Index pieces) const;
};

/// Linformer's bound (Wang et al. 2020 eq. (7): O = softmax(s·Q(EK)ᵀ)·(FV), E, F: k × n), as its emulation computes
/// it (linformer.cpp): Q, K, V and E, F stored (E, F from the float32 method's own draws, e32 and f32, within 4u₃₂ of
/// the float64 e and f the reference uses), EK and FV summed in float32 over the n positions and stored, then exact
/// attention's materialised transcription over the k projected keys (logits stored under eager, P stored, P·FV in
/// float32, O stored). The stored inputs are known exactly (round to nearest even: round_to), so the projected keys'
/// error is bounded entry by entry without a worst case for the inputs' rounding:
///   |EK_stored − E·K| ≤ ΔK' = |Ê·K̂ − E·K| + γ_n·|Ê|·|K̂| + u·(|Ê·K̂| + γ_n·|Ê|·|K̂|) + η + n·η₃₂ (the float32 sum in
///   any order, its underflowing products, then the storing), and ΔV' for FV the same;
///   logits    |ẑ_ij − z_ij| ≤ D_ij = s·[|Q̂ − Q|_iᵀ(|K'| + ΔK')_j + |Q|_iᵀΔK'_j] + s·e_z·A_ij + 2u₃₂·|ẑ|max, with
///             A_ij = |Q̂|_iᵀ(|K'| + ΔK')_j ≥ |q̂ᵀk̂'| and e_z = (1+γ_d)(1+u)^{2e}(1+u₃₂) − 1 (e = 1 eager: the product
///             and the scaled product stored); D_i = max_j D_ij (taken as the sum of the two terms' maxima);
///   weights   R_i = e^{2D_i}(1+u)²(1+γ_{k+8})², as exact's materialised bound;
///   output    |Ô_ic − O_ic| ≤ (1+u)·[(R_i(1+γ_k) − 1)·(P|V'|)_ic + R_i(1+γ_k)·(P·ΔV')_ic
///             + k·η·(1+γ_k)·max_j(|V'| + ΔV')_jc] + u·|O_ic| + η,
/// from P̂V̂' − PV' = P(r − 1)V' + P·r·δ with r ∈ [1/R, R], |δ| ≤ ΔV'. +inf where |K'| + ΔK', |V'| + ΔV' or (eager)
/// a logit may reach the format's largest value. O is the float64 method's own output (e, f). The projected keys'
/// envelopes depend on the format: one call per format and policy (O(n·k·d) float64 work).
SoftmaxRoundingBound linformer_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                              const ConstRef<double>& v, const ConstRef<double>& e,
                                              const ConstRef<double>& f, const ConstRef<double>& e32,
                                              const ConstRef<double>& f32, const AttentionOptions& opts);

/// Both steps at once, for exact attention on (q, k, v) given in float64 (the unrounded inputs).
SoftmaxRoundingBound softmax_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                            const ConstRef<double>& v, const AttentionOptions& opts, bool streaming,
                                            Index tile = 256);

/// Linear attention's bound (Katharopoulos et al. 2020 eq. (6): O_i = φ(q_i)ᵀS / φ(q_i)ᵀz, S = Σ_j φ(k_j)v_jᵀ,
/// z = Σ_j φ(k_j)), non-causal, as streamed_kernel_output emulates it (operators/kernel.cpp; linear's note): Q, K, V
/// stored; the features φ formed in float32 from the stored inputs and stored; S and z summed in float32 (stored
/// under eager); the numerators φ̂ᵀŜ and normalisers φ̂ᵀẑ in float32 (stored under eager); divided (eager) or
/// multiplied by the normaliser's float32 reciprocal (careful); O stored. Worst case and rigorous, the same unit
/// roundoffs as above, sums of m terms within γ_m whatever their order (Higham 2002 §3.1), and float32's underflow:
/// every product within η₃₂ = 2⁻¹⁴⁹ absolute beside its relative error:
///   features  each entry's upper envelope Φ⁺ = φ + Δφ with |φ̂ − φ| ≤ Δφ = a + (φ + a)((1+2u₃₂)(1+u) − 1) + η
///             + 2⁻¹²⁶: a bounds φ(x̂) − φ(x) for the stored input, |x̂ − x| ≤ u·x̄: elu + 1 is 1-Lipschitz and e^x
///             below 0, so a = u·x̄·min(1, e^{min(x,0) + u·x̄}); relu keeps x ≤ 0 at 0, a = u·x̄·[x > 0]; elu's exp
///             within 2 ulp where float32 holds e^x as a normal number, and within 2⁻¹²⁶ absolute below (float32's
///             underflow, and Eigen's vectorised exp, which clamps its argument at −88.72: e^x ≈ 2.9e-39 there);
///   sums      every term φ̂_im ψ̂_jm v̂_jc of the numerator passes at most ρ = (1+γ_{n+2})(1+γ_{M+1})(1+u)^{2e}
///             (e = 1 eager: S and N stored), and since φ, ψ ≥ 0 and the envelopes are upper ones,
///             |N̂ − N| ≤ E_N = ρ·Φ⁺(Ψ⁺ᵀ|V|⁺) − Φ(Ψᵀ|V|) + e·η·((1+γ_{M+1})(1+u)·Φ⁺1 + 1), |V|⁺ = |V|(1+u) + η;
///             the normaliser's E_D the same with V = 1 (exact, not stored);
///             E_N and E_D also carry (n + M + 4)·η₃₂·(1 + 2·Φ⁺1) for float32's underflowing products;
///   output    |N̂/D̂ − O| ≤ (E_N + |O|·E_D) / (D − E_D) while D > E_D; the division (eager) or reciprocal and
///             product (careful) add (1+u₃₂)^{1 or 2}, storing O (1+u) and η.
/// +inf where no guarantee holds: an input at the format's largest value; a sum S, z, numerator or normaliser whose
/// envelope reaches the largest value of what holds it (the format under eager — fp16's 65504: the key sum of about
/// a thousand elu + 1 features, the all-zero rows the emulation reproduces —, float32 under careful); D ≤ E_D
/// (relu's vanishing rows), or under careful D − E_D below twice float32's smallest normal value (the guarded
/// reciprocal clamps there); a row of O whose envelope reaches the format's largest value.
struct KernelRoundingBound {
  double u = 0, eta = 0;
  MatrixR<double> output;  // the componentwise bound on |Ô − O|, n_q × d_v (+inf in a row without a guarantee)
  MatrixR<double> reference;  // O, in float64 from the features the bound is built around (the method's own output)
  Index rows_without_guarantee = 0;
  double output_norm() const { return output.norm(); }
};

enum class LinearFeature;
/// The bound for linear attention with feature map `feature` on (q, k, v) given in float64 (the unrounded inputs),
/// under opts.storage and opts.policy. Under a causal mask, the chunked transcription the emulation runs (either
/// causal form; `chunk`, the method's chunk option): queries in chunks, each reading the state S, z of every earlier
/// key — absorbed chunk by chunk in float32 and stored after every absorb under eager, so a term absorbed a chunks
/// before passes a more roundings ((1+γ_{L+1})(1+u)^e each) — and its own chunk's keys through the masked scores
/// A = φ̂ψ̂ᵀ, stored under both policies (η each, and no guarantee where one may overflow); the rest as above.
KernelRoundingBound linear_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                          const ConstRef<double>& v, LinearFeature feature,
                                          const AttentionOptions& opts, Index chunk = 64);

/// Performer's bound (Choromanski et al. 2021 Lemma 1: positive features φ(x)_m = e^{ω_mᵀx_s − ‖x_s‖²/2}/√M,
/// x_s = s^½x), non-causal. Careful policy, as its emulation computes it (methods/performer.cpp, operators/kernel.cpp):
/// Q, K, V stored; the features formed in float32 from the stored rows with the float32 method's ω (omega32; omega is
/// the float64 method's, the reference), each query's divided by its largest (e^{p − max p}), each key's with its
/// log-scale g = max p − ‖x_s‖²/2 − ½log M apart; the features stored; a key's weight e^{g − m_c} (its chunk's
/// largest) and its chunk's e^{m_c − max} in float32; the sums, numerators and normalisers in float32 (the guarded
/// reciprocal); O stored. The stored rows are known exactly (round_to), so the projections' error is bounded entry
/// by entry: Δp = |s^½x̂ᵀω₃₂ − s^½xᵀω| + ((1+u₃₂)²(1+γ_d) − 1)·s^½|x̂|ᵀ|ω₃₂|, the half squared norm's likewise. Each
/// feature's exponent then moves by at most θ: queries Δp + max_m Δp (the row's stabiliser) + u₃₂|p − max p + …|;
/// keys Δp + Δ(‖x_s‖²/2) + Δ(½log M) + ΔG (the global stabiliser, the largest log-scale's own error) + u₃₂ times each
/// rounded subtraction's operands — the key's row and chunk stabilisers cancel in the exponents the emulation adds
/// (its f·w·c), apart from those roundings. With each exp within 4u₃₂ (2 ulp) and 2⁻¹²⁶ absolute (underflow and
/// Eigen's clamp), the features' upper envelopes Φ⁺ = (φe^θ(1+4u₃₂) + 2⁻¹²⁶)(1+u) + η, Ψ⁺ likewise through the weight
/// products, enter linear attention's sums and division (the same derivation as linear_rounding_bound, over n + the
/// key chunks' count of terms). The query's stabiliser is a common factor that cancels exactly; counting its error in
/// θ is conservative. A key chunk's sums are formed in float32 before its factor scales them: where a chunk's Σ|V̂|
/// may pass float32's largest value there is no guarantee. Eager policy (the reference code's features, every step
/// stored: s^½x, ωᵀx, x∘x, ‖x‖², ‖x‖²/2, the exponent, less the maximum — a query's largest projection, every key's
/// largest): each stored step's distance from its float64 value bounded in turn from the stored row and ω̂ (known
/// exactly), the exponent's total move θ, then linear attention's eager sums and division (rounding_bound.cpp,
/// performer_eager_bound). Causal — linear attention's chunked transcription in chunks of `chunk`, the method's, as
/// emulated_causal_kernel_output runs it for either causal form: under eager the same features (keys against the
/// largest projection over every key, as the reference code takes it); under careful the same stored features, each
/// key weighted in float32 against the running maximum of the log-scales and the state rescaled whenever a chunk
/// raises it (at most ⌈n_q/chunk⌉ times: rounding_bound.cpp, performer_careful_causal — the maxima telescope, so a
/// key's exponent moves by Δa + Δg + ΔG plus the subtractions' roundings, at most 2u₃₂(C − g + ΔG + Δg)). The
/// hyperbolic kernel (careful: the one policy that emulates it) is the positive one over the 2M projections [p, −p]:
/// the same derivation. The trigonometric kernel (careful, both masks: rounding_bound.cpp, performer_trig_careful):
/// the signed features [sin p, cos p] move by at most min(Δp, 2) plus float32's sin or cos error (2⁻²² below 65536,
/// checked in tests/test_precision.cpp), the keys' weights e^{½‖s^½k‖² − C} as the positive kernel's, then linear
/// attention's sums and division in their signed form (Taylor's); a row whose normaliser may vanish has none. Causal:
/// the keys' weights against the running maximum as the positive kernel's careful causal form, then the chunked
/// transcription in its signed form.
/// Taylor attention's bound (taylor.hpp: φ(x) = [1, x/‖x‖], sim = 1 + cos ≥ 0), non-causal, both policies, as its
/// emulation computes it (linear's kernel path with signed features): each direction x/‖x‖ formed in float32 from the
/// stored row (known exactly: round_to) — the squared norm within γ_d, the square root and the division within u₃₂ —
/// and stored; then linear attention's sums and division, the error terms from the features' magnitudes
/// (|φ̂ψ̂ − φψ| ≤ Φ⁺Ψ⁺ − |φ||ψ|) and the normaliser from the signed features; careful's guarded reciprocal clamps
/// where |D̂| < max(2⁻²³·Σ|φ̂||ψ̂|, 2⁻¹²⁶) (no guarantee there). Causal: the chunked form, as linear's.
KernelRoundingBound taylor_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                          const ConstRef<double>& v, const AttentionOptions& opts, Index chunk = 64);

/// Efficient attention's bound (Shen et al. 2021: O = softmax₂(Q)·(softmax₁(K)ᵀV)), both policies, as its emulation
/// computes it (methods/efficient.cpp): Q, K, V stored (known exactly: round_to); each softmax in float32 from the
/// stored values — within a ratio R = e^{2u₃₂·w}(1+4u₃₂)²(1+γ_m)(1+u₃₂) of the softmax of the stored values (w the
/// widest shifted entry, m the softmax's length), which is within e^{±2Δ} of the exact one's (Δ the largest input
/// change: the softmax's conditioning, Blanchard, Higham & Higham 2021) — then stored (1+u, η); C = BᵀV summed in
/// float32 over n (stored under eager); O = A·C in float32, stored: |Ô − O| ≤ (1+u)·[ΔA·C⁺ + A·ΔC + γ_d(A + ΔA)C⁺]
/// + u|O| + η with C⁺ the stored C's envelope and ΔC = C⁺ − |B|ᵀ|V|. +inf where an input, the stored C (eager) or a
/// row of O may reach the format's largest value.
KernelRoundingBound efficient_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                             const ConstRef<double>& v, const AttentionOptions& opts);

/// ProbSparse's bound (Zhou et al. 2021 eq. (3): exact rows for the top-u queries, mean(V) for the others), given
/// the choices of both runs: `selected` the float64 method's top-u queries, `chosen` the emulated run's (ascending).
/// Its choice is discrete, and rounding can flip it (the measure M moves): a row chosen differently gets +inf — no
/// rounding bound covers a flip; rows_without_guarantee counts them. Where the choices agree: an exact row has exact
/// attention's streaming bound (`exact`, the analysis of the same Q, K, V under the call's mask; the emulation's tiles
/// of kDefaultTile keys — the split-KV path is not taken under a reduced storage); a lazy row is mean(V) from the
/// stored V (known exactly) summed in float32 (γ_n) and scaled by fl(1/n), stored. Causal (Informer's decoder): a
/// lazy row is the prefix over its visible keys — a running float32 sum, within γ_m of its m terms' magnitudes —
/// times fl(1/m), or as it stands under `cumsum` (lazy=cumsum, Informer's own choice), stored; +inf where that value
/// may reach the format's largest (fp16: a long cumsum row).
KernelRoundingBound probsparse_rounding_bound(const SoftmaxRoundingAnalysis& exact, const ConstRef<double>& v,
                                              const std::vector<Index>& selected, const std::vector<Index>& chosen,
                                              const AttentionOptions& opts, bool cumsum = false);

/// Reformer's bound (Kitaev et al. 2020 §2–3), given the key sets of both runs: `analysis` the pattern form over the
/// float64 method's key sets (`selected`, its P̃'s row_keys), `chosen` the emulated run's. Hashing is discrete, and
/// rounding can move a key to another bucket (the float32 rotations of the stored rows), which shifts the sorted
/// chunks: a row whose key set differs gets +inf — no rounding bound covers it; rows_without_guarantee counts them.
/// Where the sets agree: non-causal, the emulation streams the union round by round (reformer.cpp: per round the
/// chunk's logits s·(qkᵀ) in float32 (Eigen takes the scale out of the product), stored under eager; its
/// probabilities exp(ℓ − m) stored before their product with V; the running sum and accumulator stored after each
/// round under eager), which is exact attention's streaming transcription with at most `rounds` pieces per query —
/// its bound (bound_in_pieces) over the pattern, the logits' single storing counted as exact's two; causal, the
/// pattern softmax (materialised), the pattern methods' bound. O is the float64 method's own output (analysis.o).
KernelRoundingBound reformer_rounding_bound(const SoftmaxRoundingAnalysis& analysis,
                                            const std::vector<std::vector<Index>>& selected,
                                            const std::vector<std::vector<Index>>& chosen, Index rounds,
                                            const AttentionOptions& opts);

/// Transformer-VQ's bound (Lingle 2023 Fig. 2: O_i = Σ_y w_iy S_y / Σ_y w_iy N_y, w_iy = e^{s·q_iᵀc_y − M_i}, S_y
/// and N_y the value sum and key count of code y), assign=hard, keys quantized, causal too (below), given a codebook
/// both runs share (codebook=PATH.npy, float32-representable) and the assignments of both runs: `assigned` the float64
/// method's, `chosen` the emulated run's. An assignment is discrete and rounding can flip it (the stored key nearer
/// another code): non-causal, every query sees every code, so one flipped key leaves the whole output without a
/// guarantee. With a k-means codebook (codebook=window) each run fits its own — the emulated run on the stored keys,
/// in float32 — and the overload below takes both: the bound of the attention given the two codebooks, where the
/// runs assigned every key to the same code (then each code's keys are the same set). The fit's own drift is not
/// bounded a priori: it enters exactly, through the logits' computed move |s·q̂ᵀĉ − s·qᵀc| (ĉ the emulated run's
/// codebook as stored, c the float64 run's), as a rounding of a fixed codebook does.
/// As its emulation computes it (VqMethod::do_output): Q, V and C stored (known exactly: round_to); the logits
/// s·QĈᵀ in float32 (stored twice under eager); S and N summed in float32 (stored under eager); the weights
/// e^{ℓ − max ℓ} in float32 and stored (both policies); num = W·S and den = W·N in float32 over the codes (stored
/// under eager), divided, O stored. Per query, with D the largest logit move |ℓ̂ − ℓ| ≤ s|q̂ᵀĉ − qᵀc| + e_z·s·|q̂|ᵀ|ĉ|
/// (+ eager's η and float32's underflow): each weight lies within ρ = e^{θ}(1+4u₃₂)(1+u) of its reference times the
/// row's common factor e^{M − M̂} (which cancels in num/den), θ = D + u₃₂·2(max|ℓ| + D), plus an absolute floor
/// (2⁻¹²⁶(1+u) + η) scaled by e^{D}; then the kernel bounds' sums and division (|N̂/D̂ − N/D| ≤
/// (E_N + |O|E_D)/(D − E_D) with E from the upper envelopes ρW + floor and |S| + ΔS). +inf where an input, a stored
/// logit, sum, count, numerator or normaliser, or a row of O may reach the largest value of what holds it.
/// Causal (Lingle 2023 §3.3, as VqMethod::emulated_causal_output computes it, in blocks of kCausalBlock queries): row
/// i sees the cache — the keys before its block, their float32 per-code sums and counts stored under eager once
/// filled and after every block, K = 1 + ⌊i/64⌋ times — and its block's keys up to its own, which enter as products
/// with their codes' weights. The same derivation per row over what it sees: the cache's sums within
/// ((1+γ_N)(1+u)^K − 1)·Σ|v̂| + K·η(1+u)^K(1+γ_N) of the stored values' sums, its counts within (1+u)^K; the
/// numerator and normaliser as sums of the codes' and the block's products (γ_{codes+len+1}). A flipped assignment
/// leaves only the rows that see that key without a guarantee; an overflow only the rows whose sums may reach it.
KernelRoundingBound vq_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& v,
                                      const ConstRef<double>& codebook, const std::vector<Index>& assigned,
                                      const std::vector<Index>& chosen, const AttentionOptions& opts);
/// The same with each run's own codebook: `codebook` the float64 run's, `codebook32` the emulated run's before it
/// is stored (its float32 values; VqMethod<float>::codebook()), the same rows and columns.
KernelRoundingBound vq_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& v,
                                      const ConstRef<double>& codebook, const ConstRef<double>& codebook32,
                                      const std::vector<Index>& assigned, const std::vector<Index>& chosen,
                                      const AttentionOptions& opts);
/// Soft Transformer-VQ's bound (assign=soft, attnlab's own: the one-hot assignment replaced by the responsibilities
/// R_jy = softmax_y((2k_jᵀc_y − ‖k_j‖² − ‖c_y‖²)/(2T)), S = RᵀV and N = Rᵀ1 in place of the codes' value sums and
/// counts), non-causal, both policies, given both runs' codebooks (k-means on each run's keys: the fit's drift enters
/// through the logits' computed moves, as the hard bound's), as VqMethod::emulated_output computes it: K̂, Ĉ stored
/// (known exactly); the logits z in float32 — KĈᵀ, the norms, each subtraction and the division by 2T stored under
/// eager — each within D_jy = |z̃ − z| (the stored inputs', computed) + the float32 and storing roundings of the
/// magnitudes 2|K̂||Ĉ|ᵀ + ‖k̂‖² + ‖ĉ‖² over 2T; R a float32 softmax of them, stored (both policies): every entry within
/// [R/ρ_jy, R·ρ_jy] ± (2⁻¹²⁶(1+u) + η), ρ_jy = e^{D_jy + L_j + 4u₃₂·max|ẑ|}(1+4u₃₂)(1+γ_{c+2})²(1+u) with L_j =
/// min(D, e^{2D}·Σ_y R_jy D_jy) (D = max_y D_jy) bounding the log-sum-exp's move; S and N summed in
/// float32 over n_k (stored under eager) by the product rule; then the hard bound's weights, numerators, normalisers
/// and division over the codes. The codes are paired by the keys' nearest codes in each run (O does not depend on the
/// numbering). No guarantee anywhere where a logit may overflow what holds it, where a code's stored mass may be 0
/// (the emulation drops a code without mass), or as the hard bound.
KernelRoundingBound vq_soft_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v, const ConstRef<double>& codebook,
                                           const ConstRef<double>& codebook32, double temperature,
                                           const AttentionOptions& opts);

/// What the two-codebook bound reads of one run of quantize=both: its key codebook C (the emulated run's before it
/// is stored: its float32 values), its query codebook C', each key's code a(j) and each query's code b(i)
/// (VqMethod's codebook(), query_codebook(), key_codes(), query_codes()).
struct VqBothRun {
  MatrixR<double> codebook, query_codebook;
  std::vector<Index> key_codes, query_codes;
};
/// Transformer-VQ's two-codebook form's bound (quantize=both, attnlab's mean-field form: P̃_ij ∝ e^{λ_i,a(j) +
/// g_b(i),j}, λ = s·QCᵀ, g = s·C'(K − ΔC)ᵀ; operators/codebook.hpp), non-causal, both policies, given both runs'
/// k-means codebooks and codes, as VqMethod::emulated_both_output computes it: per query code b a Transformer-VQ over
/// the key codes with the key weights G_bj = e^{g_bj − m_b,a(j)} in place of the counts and the joint logits λ_iy +
/// m_by. The stored Q, K, V, C, C' and residuals K̂ − ΔĈ known exactly; g's move the stored factors' (computed), the
/// float32 product and scaling and eager's two storings of s·|Ĉ'||R̂|ᵀ (as λ's); m's move at most its code's largest
/// g move; each Ĝ within [G/ρ, G·ρ] ± (2⁻¹²⁶(1+u) + η), ρ = e^{δ}(1+4u₃₂)(1+u), δ = the g and m moves plus the
/// float32 subtraction's u₃₂; the per-code sums S_b = Σ G v and N_b = Σ G summed in float32 over the keys (stored
/// under eager) by the product rule; the joint logits' move λ's plus m's plus the float32 sum's (and eager's storing);
/// then the hard bound's weights, numerators, normalisers and division. The maxima cancel between E and Ĝ in both
/// runs; the bound counts their move twice (in the logits and in the weights), an overestimate of at most 2·max|m̂ −
/// m| in the exponent. The codes are renumbered as the float64 run's where the partitions agree. No guarantee
/// anywhere where a key's code moved or g, a sum or a logit may overflow what holds it; none for a query whose code
/// moved; else as the hard bound.
KernelRoundingBound vq_both_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v, const VqBothRun& run64,
                                           const VqBothRun& run32, const AttentionOptions& opts);

enum class PerformerKernel;
KernelRoundingBound performer_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                             const ConstRef<double>& v, const ConstRef<double>& omega,
                                             const ConstRef<double>& omega32, PerformerKernel kernel,
                                             const AttentionOptions& opts, Index chunk = 64);

/// Scatterbrain's bound (Chen et al. 2021 §3: O_i = (Σ_j Ã_ij v_j) / Σ_j Ã_ij with Ã the Performer estimate
/// φ(q_i)ᵀφ(k_j) off the band |j − c_i| ≤ W and the exact e^{s·q_iᵀk_j} on it), both policies, non-causal, as its
/// emulation computes it (methods/scatterbrain.cpp): Q, K, V stored (known exactly: round_to); s^½Q, s^½K in float32;
/// the positive features from them with the float32 method's ω (omega32; omega the float64 method's) — each query's
/// e^{p − max p} stored, each key's e^{lk − gk}·e^{p − max p} (its log-scale lk = max p − ‖s^½k‖²/2 − ½log M against
/// the largest, gk) stored —; per row the reference R̂ = max(b̂ase, the band's largest logit), base = lq + gk, and
/// est_scale = e^{b̂ase − R̂}; the band's logits s^½q·s^½k in float32 (stored under eager), its corrections Ĉ_ij =
/// e^{ℓ̂ − R̂} − est_scale·φ̂ᵀψ̂_j in float32, stored; the key sum and state Σψ̂, Σψ̂v̂ᵀ, the row sums est_scale·φ̂ᵀΣψ̂
/// + ΣĈ and numerators (φ̂ᵀΨ̂ᵀV̂)·est_scale + ĈV̂ in float32 (each stored under eager); divided; O stored. A factor
/// e^{R − R̂} is common to a row's numerators and row sum and cancels: every quantity is bounded in units of e^{R} (R
/// from the exact values), the absolute terms (underflows, η) grown by e^{ΔR}, ΔR the largest move of b̂ase or a band
/// logit. The features' pivots (a row's largest projection, gk) cancel in each product term φψ apart from the
/// subtractions' roundings, so a term's exponent moves by θ = Δp_q + Δp_k + Δ(‖·‖²/2)_q + Δ(‖·‖²/2)_k + 2Δ(½log M) plus
/// u₃₂ times each rounded subtraction's operands (the projections' bound Δp as Performer's); each exp within 4u₃₂ and
/// 2⁻¹²⁶ absolute. The estimate's sums then follow the kernel bounds (upper envelopes Φ⁺Ψ⁺), each correction within |Ĉ
/// − C| ≤ |ê − e^{ℓ−R}| + |est_scale·φ̂ᵀψ̂ − φᵀψ| + its subtraction's and storing's roundings, the band's sums within
/// γ_{W'+1} of their magnitudes, and |N̂/D̂ − N/D| ≤ (E_N + |O|E_D)/(D − E_D). +inf where an input, a stored feature,
/// correction, logit, sum or row of O, or a float32 sum, may reach the largest value of what holds it, or where D ≤
/// E_D.
KernelRoundingBound scatterbrain_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                                const ConstRef<double>& v, const ConstRef<double>& omega,
                                                const ConstRef<double>& omega32, Index window,
                                                const AttentionOptions& opts);

/// Nyström's bound (Xiong et al. 2021 eq. (14): O = softmax(s·QK̃ᵀ)·Z·softmax(s·Q̃Kᵀ)·V, Z ≈ pinv(softmax(s·Q̃K̃ᵀ)),
/// landmarks the segment means), both policies, **given both runs' pseudo-inverses**: `z` the float64 run's Z, `z32`
/// the emulated run's as it multiplied with it. The pseudo-inverse iteration's own propagation of the rounding is not
/// bounded a priori (the converged inverse amplifies a rounded landmark kernel by its condition number, the
/// unconverged iteration does not; no useful worst case follows from norms alone): the difference Ẑ − Z enters as
/// computed, as Transformer-VQ's codebook fits do. The rest as the emulation computes it (NystromMethod::do_output
/// under a reduced storage, the reference code's association (F·Z)·(B·V)): Q, K, V stored (known exactly:
/// round_to); the landmarks Q̃, K̃ as float32 segment means of the stored rows, stored (within ΔX̃ = |mean(X̂) −
/// mean(X)| + γ_{len+1}·mean|X̂| and the storing); F = softmax(s·QK̃ᵀ) and B = softmax(s·Q̃Kᵀ) materialised (the logits
/// in float32, stored twice under eager; P stored): each logit moves by at most D = s·[|Q̂ − Q|ᵀ(|K̃| + ΔK̃) +
/// |Q|ᵀΔK̃] + e_z·s·|Q̂|ᵀ(|K̃| + ΔK̃) + 2u₃₂·|ẑ|max (e_z counting the float32 scale's rounding too; B: the landmark
/// queries' ΔQ̃ against the stored keys), so each
/// probability lies within [p/R, p·R] ± (2⁻¹²⁶(1+u) + η), R = e^{2D_i}(1+u)²(1+γ_{n+8})² (exact's materialised
/// bound); then B·V over n_k, F·Ẑ over m (each stored) and their product over m (O stored), each within the product
/// rule |âb̂ − ab| ≤ Δa|b̂| + |a|Δb plus γ of the magnitudes. Non-causal; +inf where a logit before or after the
/// scale (eager), a stored product or O may reach the format's largest value, or a float32 partial sum float32's (the
/// magnitudes' product bounds it) (B·V anywhere: every row).
/// select=random: `rows_q`, `rows_k` the sampled rows the landmarks are (the stored rows themselves, known exactly);
/// empty for segment means.
KernelRoundingBound nystrom_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k,
                                           const ConstRef<double>& v, Index landmarks, const ConstRef<double>& z,
                                           const ConstRef<double>& z32, const AttentionOptions& opts,
                                           const std::vector<Index>& rows_q = {},
                                           const std::vector<Index>& rows_k = {});

/// CUR's bound (Drineas, Mahoney & Muthukrishnan 2008: O = C·Z·(R·V), C = P[:, J], R = P[I, :], Z = pinv(P[I, J])),
/// both policies, **given both runs' pseudo-inverses** as Nyström's (`z` the float64 run's, `z32` the emulated run's;
/// the same sampled rows I and columns J in both). The rest as the emulation computes it (CurMethod::do_compute in
/// float32 from the stored Q, K, then LowRankMethod's emulated output): every entry of C and R is float32's exp(ℓ̂_ij −
/// L̂_i), the logits s·q̂·k̂ (each within D_ij = s·[|Q̂ − Q||K̂|ᵀ + |Q||K̂ − K|ᵀ] + ((1+γ_d)(1+u₃₂)² − 1)·s|Q̂||K̂|ᵀ of
/// exact's, the scale itself rounded to float32) and L̂ the streaming log-sum-exp over every key
/// (ExactOperator::row_lse: the tiles' running maxima and rescaled sums, the log and the addition): so each probability
/// lies within [p/ρ_i, p·ρ_i] ± 2⁻¹²⁶(1 + u₃₂) + η₃₂, ρ_i = e^{2 max_j D_ij + ε_i}(1 + 4u₃₂), ε_i = 2γ_{2n_k+8} +
/// u₃₂·(8·z_i + 4·ln n_k + 4) with z_i the row's largest computed |logit| (the subtractions' and the log's roundings,
/// each relative to what it subtracts); R then stored (×(1+u), + η); A = C·Ẑ summed in float32 over the c columns and
/// stored (both policies); R·V over n_k, stored under eager; O = A·(R·V) over c, stored — each by the product rule with
/// γ of the magnitudes. Non-causal; +inf on every row where R·V (eager) may reach the format's largest value, on a row
/// where a logit (before or after the scale) may reach float32's, or A's or O's row the format's, and where a float32
/// partial sum may pass float32's largest value (the magnitudes' product |Ĉ||Ẑ|, |R̂||V̂| or |Â||R̂V̂| bounds it).
KernelRoundingBound cur_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k, const ConstRef<double>& v,
                                       const std::vector<Index>& rows, const std::vector<Index>& cols,
                                       const ConstRef<double>& z, const ConstRef<double>& z32,
                                       const AttentionOptions& opts);

/// The SVD oracle's bound (svd.hpp: P_R = (P·V_R)·V_Rᵀ, V_R the top R right singular vectors of P; Eckart & Young
/// 1936), both policies, **given both runs' singular vectors**: `vr` the float64 run's V_R, `vr32` the emulated run's
/// as it multiplied with them (n_k × R). The solver's own propagation of the rounding is not bounded a priori (a
/// singular subspace moves by the perturbation over the gap σ_R − σ_{R+1}, which attention's clustered tails make
/// tiny): V̂_R − V_R enters as computed, as Nyström's and CUR's pseudo-inverses do, with the float64 run's basis
/// rotated to the emulated run's (P·V_R·V_Rᵀ is the same for V_R·G, G orthogonal: G the nearest such, orthogonal
/// Procrustes), so that a sign flip or a rotation among close singular values is not counted. The rest as the emulation
/// computes it (SvdMethod::do_compute in float32 from the stored Q, K, then LowRankMethod's emulated output): A =
/// P̂·V̂_R by ExactOperator::apply — P's entries as in CUR's bound, within [p/ρ_i, p·ρ_i] ± 2⁻¹²⁶(1 + u₃₂) + η₃₂ —
/// summed in float32 over n_k and stored (both policies); V̂_R stored (both; known exactly); W = V̂_Rᵀ·V̂ over n_k,
/// stored under eager; O = A·W over R, stored — each by the product rule with γ of the magnitudes. Non-causal; +inf on
/// every row where W (eager) may reach the format's largest value, on a row where a logit may reach float32's, or A's
/// or O's row the format's, and where a float32 partial sum may pass float32's largest value.
KernelRoundingBound svd_rounding_bound(const ConstRef<double>& q, const ConstRef<double>& k, const ConstRef<double>& v,
                                       const ConstRef<double>& vr, const ConstRef<double>& vr32,
                                       const AttentionOptions& opts);

}  // namespace attnlab
