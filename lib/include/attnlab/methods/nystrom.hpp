// `nystrom` — Nyströmformer (Xiong et al. 2021, eq. (14)): P̃ = softmax(s·QK̃ᵀ) · Z · softmax(s·Q̃Kᵀ) with m landmarks
// Q̃, K̃ and Z ≈ pinv(softmax(s·Q̃K̃ᵀ)) by the order-3 iteration of Razavi et al. 2014 (Xiong et al. 2021, eq. (16)).
// Non-causal: the landmarks pool every position.
// Backward: the exact derivative of this forward (not of the converged pseudo-inverse): through the segment means,
// the three softmaxes and every step of the iterative pseudo-inverse, its initial scaling Z₀ = Aᵀ/(‖A‖₁‖A‖∞)
// included (the maximizing column and row of the two norms held fixed); pinv=svd: the derivative of A⁻¹ (of the
// truncation's pseudo-inverse, the kept singular values held fixed, when the cutoff drops some). Random landmarks:
// the sampled rows are held fixed.
//   attnlab::NystromOptions o;  o.landmarks = 64;
//   attnlab::NystromMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "nystrom:landmarks=64" builds the same class (make_method reads the spec into NystromOptions).
#pragma once

#include "attnlab/components/pinv.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/lowrank_method.hpp"
#include "attnlab/operators/exact.hpp"

#include <cstdint>
#include <vector>

namespace attnlab {

/// How Nyström's landmarks are chosen.
enum class LandmarkSelect { Segments, Random };

struct NystromOptions : MethodOptions<NystromOptions> {
  static constexpr const char* kName = "nystrom";
  Index landmarks = 64;
  PinvMethod pinv = PinvMethod::Order3;
  Index iters = 6;
  LandmarkSelect select = LandmarkSelect::Segments;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("landmarks", &NystromOptions::landmarks, 1, 1 << 20, "number of landmarks m (≤ n)")
        .budget(Study("nystrom", {8, 16, 32, 64, 128}).simplicity(3).listed(1),
                Study("nystrom_svd", {8, 16, 32, 64, 128}).with("pinv=svd").simplicity(4).listed(2))
        .within_min_n();
    p.choice("pinv", &NystromOptions::pinv,
             {{PinvMethod::Order3, "iterative"}, {PinvMethod::NewtonSchulz, "newton"}, {PinvMethod::Svd, "svd"}},
             "pseudo-inverse: order-3 iteration (Razavi et al. 2014, as Nyströmformer), Newton–Schulz, or SVD");
    p.integer("iters", &NystromOptions::iters, 0, 10000,
              "iterations of the iterative pseudo-inverses (the paper uses 6)");
    p.choice("select", &NystromOptions::select,
             {{LandmarkSelect::Segments, "segments"}, {LandmarkSelect::Random, "random"}},
             "landmarks: segment means, or uniformly sampled rows");
    p.seed(&NystromOptions::seed);
  }
  /// The method's entry in the registry (lib/src/methods/nystrom.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class NystromMethod final : public ConfiguredMethod<NystromOptions, LowRankMethod<T>> {
 public:
  using ConfiguredMethod<NystromOptions, LowRankMethod<T>>::ConfiguredMethod;
  /// ‖I − AZ‖_F of the pseudo-inverse used: how far the iteration is from converged.
  std::vector<std::pair<std::string, double>> diagnostics() const override { return {{"pinv_residual", residual_}}; }
  /// Z ≈ pinv(A) (m × m) as the last compute() formed it (under a reduced storage: as the output multiplies with it).
  const MatrixR<T>& pseudoinverse() const { return z_; }
  /// select=random: the sampled rows of Q and K the landmarks are (ascending); empty for segment means.
  const std::vector<Index>& query_landmark_rows() const { return iq_; }
  const std::vector<Index>& key_landmark_rows() const { return ik_; }

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  std::pair<MatrixR<T>, MatrixR<T>> make_factors() const override;
  /// O = F·W, W = Z·(B·V): F·W by exact attention's backward over the m landmark keys (exact_backward_few_keys for
  /// m ≤ kFewKeys: blocks of queries, the softmax formed whole), B·V by the softmax backward on the B the forward
  /// kept (m × n_k), in fixed blocks of keys, Z by pinv_backward (every iteration), A by a dense softmax backward,
  /// then the landmark gradients spread back onto the rows they average (or were sampled from). Its buffers are
  /// kept in the method: only the gradients are new.
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;
  /// do_backward under an emulated reduced storage: autograd's backward of the reference form the emulated forward
  /// computes, (F·Z)·(B·V), every gradient tensor stored (nystrom.cpp).
  Gradients<T> emulated_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const;

  /// dX[r0, r0 + rows) += the gradient of the landmarks X̃ = means of m segments of X's n rows (or X's rows `idx`),
  /// given dX̃; dx holds those rows.
  void spread(const MatrixR<T>& d_landmarks, const std::vector<Index>& idx, Index n, Index r0, MutRef<T> dx) const;

  double residual_ = 0;
  Index pinv_iterations_ = 0;  // the iterations the pseudo-inverse ran (its backward differentiates those)
  MatrixR<T> q_, kl_;  // the queries (kept for the output) and the key landmarks K̃
  MatrixR<T> z_, b_;   // Z ≈ A⁺ (m × m), softmax(s·Q̃Kᵀ) (m × n_k)
  MatrixR<T> k_, ql_, a_;         // for the backward: the keys, the query landmarks Q̃, A = softmax(s·Q̃K̃ᵀ)
  std::vector<Index> iq_, ik_;    // select=random: the sampled rows of Q and K (empty for segments)
  AttentionOptions plain_;
  /// The backward's buffers, kept across calls (a cache behind const calls: one method object is not to be used
  /// from several threads at once).
  struct BackwardWorkspace {
    ExactBackwardWorkspace<T> exact;      // F·W's backward
    MatrixR<T> bv, w, dw, dbv, dkl, dql;  // B·V, W, dW, d(BV): m × d_v; dK̃, dQ̃: m × d
    VectorX<T> dsum;                      // rowsum(BV ∘ d(BV)): B's D_i
    std::vector<MatrixR<T>> dql_parts;    // dQ̃ of each group of key blocks
    std::vector<MatrixR<T>> db;           // per thread: a block's dB (then dS), m × block
  };
  mutable BackwardWorkspace ws_;
};

extern template class NystromMethod<float>;
extern template class NystromMethod<double>;

}  // namespace attnlab
