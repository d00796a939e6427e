// `cur` — the classical Nyström / CUR approximation of the exact P (Drineas & Mahoney 2005):
//   P ≈ P[:,J]·pinv(P[I,J])·P[I,:]
// with C columns J and rows I (I = J for square P) sampled uniformly or by the leverage scores of the rank-C singular
// subspaces (Drineas, Mahoney & Muthukrishnan 2008). Xiong et al. 2021 §3.1 write this form for the softmax matrix
// and note that it needs all of P, which Nyströmformer avoids; here it is the reference it departs from. Non-causal.
// Backward: defined, though CUR is an analysis floor (it reads all of P) rather than a trainable method: the sampled
// J and I (uniform draws, or leverage-score draws) are held fixed, and so is the set of singular values of P[I,J]
// that the rcond cutoff keeps; C = P[:,J], P[I,J] and R = P[I,:] are differentiated as entries of the softmax rows
// (their row normalizers ℓ read every key), pinv(P[I,J]) as the (truncated) pseudo-inverse (pinv_backward).
//   attnlab::CurOptions o;  o.columns = 32;  o.select = attnlab::CurSelect::Leverage;
//   attnlab::CurMethod<double> m(o);  m.compute(Q, K);  MatrixR<double> O = m.output(V);
// The spec "cur:columns=32,select=leverage" builds the same class (make_method reads the spec into CurOptions).
#pragma once

#include "attnlab/core/parameters.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/methods/base/configured_method.hpp"
#include "attnlab/methods/base/lowrank_method.hpp"

#include <cstdint>
#include <vector>

namespace attnlab {

/// How CUR samples its columns J (and rows I).
enum class CurSelect { Uniform, Leverage };

struct CurOptions : MethodOptions<CurOptions> {
  static constexpr const char* kName = "cur";
  Index columns = 64;
  CurSelect select = CurSelect::Uniform;
  double rcond = 1e-10;
  std::uint64_t seed = 0;

  template <class P>
  static void parameters(P& p) {
    p.integer("columns", &CurOptions::columns, 1, 1 << 20, "number of sampled columns (and rows) C")
        .budget(Study("cur", {8, 16, 32, 64, 128}).listed(5).baseline())  // classical CUR: reads all of P
        .within_min_n();
    p.choice("select", &CurOptions::select, {{CurSelect::Uniform, "uniform"}, {CurSelect::Leverage, "leverage"}},
             "sampling of J (and I)");
    p.real("rcond", &CurOptions::rcond, 0, 1, "relative singular-value cutoff of pinv(P[I,J]) (0: eps·C)");
    p.seed(&CurOptions::seed);
  }
  /// Leverage scores' dense SVD of P where chosen, the factors and what the backward keeps: the memory guard's
  /// estimate (MethodOptions::memory), in lib/src/methods/cur.cpp.
  std::uint64_t memory(const ProblemSize& size) const;
  /// The method's entry in the registry (lib/src/methods/cur.cpp), kept by descriptor().
  static MethodDescriptor registry_entry();
};

template <typename T>
class CurMethod final : public ConfiguredMethod<CurOptions, LowRankMethod<T>> {
 public:
  using ConfiguredMethod<CurOptions, LowRankMethod<T>>::ConfiguredMethod;
  /// The last compute()'s sampled rows I and columns J of P, and Z = pinv(P[I,J]) as the run formed it (what
  /// cur_rounding_bound reads of each run).
  const std::vector<Index>& sampled_rows() const { return rows_; }
  const std::vector<Index>& sampled_columns() const { return cols_; }
  const MatrixR<T>& pseudoinverse() const { return z_; }

 private:
  Status do_compute(const ConstRef<T>& q, const ConstRef<T>& k, const AttentionOptions& opts) override;
  /// O = C·Z·(R·V), Z = pinv(W), W = P[I,J]: R·V by exact_backward over the rows I; C and W entrywise through
  /// their rows' softmax, whose normalizer term needs P·K and Pᵀ·(D∘Q) (one streaming pass each, O(n·d) memory).
  Gradients<T> do_backward(const ConstRef<T>& v, const ConstRef<T>& d_out) const override;

  MatrixR<T> q_, k_;           // the inputs, for the backward
  MatrixR<T> cm_, w_, z_;      // C = P[:,J] (n_q × C), W = P[I,J], Z = pinv(W) (C × C)
  VectorX<T> lse_;             // the rows' log-sum-exp ℓ
  std::vector<Index> rows_, cols_;  // I, J
};

extern template class CurMethod<float>;
extern template class CurMethod<double>;

}  // namespace attnlab
