// Which derived rounding bound (analysis/rounding_bound.hpp) holds a method as its emulation ran, declared once for
// every method and option (issue "Reduced precision": "under bf16/fp16 the error against the method's fp64 within a
// bound you derive per method"): the conformance test holds every method to it, the precision experiment tabulates
// it. A method, option or mask without a derived bound says why (`why`), so that the gap is listed, not hidden.
//
// Derived (analysis/rounding_bound.hpp has each derivation): exact attention (streaming, any tile, and materialised;
// causal too), the pattern methods local and sparse (exact's materialised bound over their pattern; causal too),
// Linformer, linear attention (both feature maps, both causal forms), Performer's positive features (both masks, both
// policies), hyperbolic and trigonometric ones (careful, both masks), Taylor attention (causal too), efficient
// attention, Scatterbrain (both policies), ProbSparse (either lazy form, causal too; conditional on both runs choosing
// the same queries), Reformer (conditional on both runs' key sets; causal too) and Transformer-VQ (hard, keys
// quantized, causal too; conditional on the keys a row sees keeping their codes; with a k-means codebook, given the
// codebook each run fitted; soft, non-causal, given both codebooks; the two-codebook form, quantize=both, non-causal,
// given both runs' codebooks and codes, a query whose code moved without a guarantee), and Nyström (either
// landmarks; given both runs' pseudo-inverses: a pseudo-inverse of a rounded landmark kernel — the converged inverse
// amplifies the storage rounding by the kernel's condition number, the unconverged iteration does not, and no useful
// worst case follows from norms alone — so their difference enters as computed; true but loose, F·Z's cancellation
// unseen), and CUR (its C and R read through the streaming log-sum-exp; given both runs' pseudo-inverses of P[I,J] as
// Nyström's, and conditional on both runs sampling the same rows and columns), and the SVD oracle (given both runs'
// singular vectors, the float64 basis rotated to the emulated one's). Every spec the conformance test runs has one
// under each mask it supports; any other without says why.
#pragma once

#include "attnlab/core/method.hpp"
#include "attnlab/core/options.hpp"
#include "attnlab/core/types.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace attnlab {

struct SoftmaxRoundingAnalysis;

/// One method's bound on one problem, format and policy.
struct MethodRoundingBound {
  /// The componentwise bound on |Ô − reference|, n_q × d_v; +inf on a row without a guarantee (rowwise bounds only).
  MatrixR<double> output;
  /// What it bounds the distance to: exact attention's float64 output for the exact method, else the float64 method's
  /// own output.
  MatrixR<double> reference;
  /// true: a kernel-form bound (KernelRoundingBound), which gives up on a row where the format may overflow or a
  /// discrete choice moved (rows_without_guarantee counts them); false: a softmax-form bound (SoftmaxRoundingBound).
  bool rowwise = false;
  Index rows_without_guarantee = 0;
  /// The entries of `emulated` (its float32 output, in float64) outside the bound; +inf entries (no guarantee) never
  /// count, NaN against a finite bound does.
  Index outside(const MatrixR<double>& emulated) const;
};

/// The bounds on one problem (q, k, v in float64, float32-representable: what the float32 method was given), with the
/// float64 analyses they share (exact attention's, a pattern method's) formed once per problem and mask.
class MethodRoundingBounds {
 public:
  MethodRoundingBounds(const ConstRef<double>& q, const ConstRef<double>& k, const ConstRef<double>& v);
  ~MethodRoundingBounds();
  MethodRoundingBounds(const MethodRoundingBounds&) = delete;
  MethodRoundingBounds& operator=(const MethodRoundingBounds&) = delete;

  /// The bound for `emulated` (a float32 method computed on this problem's q, k under a reduced storage) against
  /// `reference` (the same spec and seed in float64, computed on q, k with the same mask) and `own`, its output on v.
  /// nullopt where none is derived, and then *why (if given) says why. Throws Error where the two disagree (names,
  /// masks, shapes) or the storage is native.
  std::optional<MethodRoundingBound> bound(const Method<double>& reference, const MatrixR<double>& own,
                                           const Method<float>& emulated, std::string* why = nullptr);

 private:
  const SoftmaxRoundingAnalysis& exact_analysis(const AttentionOptions& mask);
  const SoftmaxRoundingAnalysis& pattern_analysis(const Method<double>& reference);

  MatrixR<double> q_, k_, v_;
  std::map<std::string, std::unique_ptr<SoftmaxRoundingAnalysis>> analyses_;  // by mask, or by spec and mask
  std::map<std::string, std::vector<std::vector<Index>>> patterns_;           // a pattern analysis' key sets
};

}  // namespace attnlab
