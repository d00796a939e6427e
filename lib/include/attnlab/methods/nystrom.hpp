// `nystrom` — Nyströmformer (Xiong et al. 2021, eq. (14)): P̃ = softmax(s·QK̃ᵀ) · Z · softmax(s·Q̃Kᵀ) with m landmarks
// Q̃, K̃ and Z ≈ pinv(softmax(s·Q̃K̃ᵀ)) by the order-3 iteration of Razavi et al. 2014 (Xiong et al. 2021, eq. (16)).
// Non-causal: the landmarks pool every position.
//   attnlab::NystromOptions o;  o.landmarks = 64;
//   attnlab::NystromMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "nystrom:landmarks=64" builds the same class (make_method reads the spec into NystromOptions).
#pragma once

#include "attnlab/components/pinv.hpp"
#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/lowrank_method.hpp"

#include <cstdint>

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
    p.integer("landmarks", &NystromOptions::landmarks, 1, 1 << 20, "number of landmarks m (≤ n)").budget();
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

 protected:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  MatrixR<T> do_output(const ConstRef<T>& v) const override;
  std::pair<MatrixR<T>, MatrixR<T>> make_factors() const override;

 private:
  double residual_ = 0;
  MatrixR<T> q_, kl_;  // the queries (kept for the output) and the key landmarks K̃
  MatrixR<T> z_, b_;   // Z ≈ A⁺ (m × m), softmax(s·Q̃Kᵀ) (m × n_k)
  AttentionOptions plain_;
};

extern template class NystromMethod<float>;
extern template class NystromMethod<double>;

}  // namespace attnlab
