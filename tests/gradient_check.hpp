// Central finite differences of a method's own forward, for checking its backward (tests/test_conformance.cpp,
// tests/test_backward.cpp). The scalar is L(Q, K, V) = ⟨dO, O(Q, K, V)⟩ with O the method refitted at the perturbed
// inputs (same spec, same seed: the same random parameters), so the backward's Σ⟨dX, δX⟩ must equal
// (L(X + hδ) − L(X − hδ)) / 2h along any direction δ. Directions are random and one input at a time, so that a
// wrong dQ, dK or dV is named.
#pragma once

#include "attnlab/core/gradients.hpp"
#include "attnlab/core/method.hpp"
#include "attnlab/core/registry.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace attnlab::test {

/// The forward whose derivative is checked: O(Q, K, V).
using Forward = std::function<MatrixR<double>(const MatrixR<double>&, const MatrixR<double>&, const MatrixR<double>&)>;

/// The worst disagreement between the backward's directional derivatives and central differences, over `directions`
/// random directions for each of Q, K, V: |analytic − numeric| / max(|numeric|, ‖dX‖_F·‖δ‖_F·1e-3, 1e-300), and which
/// input it was. A correct float64 backward gives ~1e-9 and less; a dropped term gives O(1).
struct GradientCheck {
  double worst = 0;
  std::string where;  // "dQ", "dK" or "dV" of the worst direction
};

inline GradientCheck check_gradients(const Forward& f, const MatrixR<double>& q, const MatrixR<double>& k,
                                     const MatrixR<double>& v, const MatrixR<double>& d_out,
                                     const Gradients<double>& g, int directions = 3, std::uint64_t seed = 77,
                                     double h = 1e-5) {
  GradientCheck r;
  const auto loss = [&](const MatrixR<double>& a, const MatrixR<double>& b, const MatrixR<double>& c) {
    return (f(a, b, c).array() * d_out.array()).sum();
  };
  for (int which = 0; which < 3; ++which) {
    const MatrixR<double>& x = which == 0 ? q : which == 1 ? k : v;
    const MatrixR<double>& dx = which == 0 ? g.dq : which == 1 ? g.dk : g.dv;
    for (int t = 0; t < directions; ++t) {
      MatrixR<double> delta = randn<double>(x.rows(), x.cols(), seed + std::uint64_t(10 * which + t));
      delta /= delta.norm();
      MatrixR<double> plus = x + h * delta, minus = x - h * delta;
      double lp, lm;
      if (which == 0) lp = loss(plus, k, v), lm = loss(minus, k, v);
      else if (which == 1) lp = loss(q, plus, v), lm = loss(q, minus, v);
      else lp = loss(q, k, plus), lm = loss(q, k, minus);
      const double numeric = (lp - lm) / (2 * h);
      const double analytic = (dx.array() * delta.array()).sum();
      const double scale = std::max({std::fabs(numeric), dx.norm() * 1e-3, 1e-300});
      const double e = std::fabs(analytic - numeric) / scale;
      if (e > r.worst) {
        r.worst = e;
        r.where = which == 0 ? "dQ" : which == 1 ? "dK" : "dV";
      }
    }
  }
  return r;
}

/// The forward of the methods `make` builds (a fresh one, refitted, at every call) with options `o`.
inline Forward method_forward(const std::function<std::unique_ptr<Method<double>>()>& make,
                              const AttentionOptions& o) {
  return [o, make](const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v) {
    auto m = make();
    m->compute(q, k, o);
    return m->output(v);
  };
}

/// For each registered method in `specs` (under its own trace): its backward, fitted on (Q, K) with `o`, agrees with
/// central differences of its own forward (refitted at every perturbed input) to `tol` (check_gradients' measure).
inline void expect_backward_matches_differences(const std::vector<std::string>& specs, const AttentionOptions& o,
                                                const MatrixR<double>& q, const MatrixR<double>& k,
                                                const MatrixR<double>& v, const MatrixR<double>& d_out,
                                                int directions, std::uint64_t seed, double tol = 1e-6) {
  for (const std::string& spec : specs) {
    SCOPED_TRACE(spec);
    auto m = make_method<double>(spec);
    m->compute(q, k, o);
    const Gradients<double> g = m->backward(v, d_out);
    const GradientCheck fd = check_gradients(method_forward([spec] { return make_method<double>(spec); }, o), q, k,
                                             v, d_out, g, directions, seed);
    EXPECT_LT(fd.worst, tol) << fd.where;
  }
}

/// The masked softmax's backward, dense, in double: P = softmax over the mask of s·QKᵀ, dV = Pᵀ dO,
/// dS = P ∘ (dO Vᵀ − rowsum(P ∘ dO Vᵀ)), dQ = s·dS K, dK = s·dSᵀ Q.
inline Gradients<double> masked_backward(const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v,
                                  const MatrixR<double>& d_out, const Eigen::Array<bool, -1, -1>& mask, double s) {
  MatrixR<double> p = s * q * k.transpose();
  for (Index i = 0; i < p.rows(); ++i) {
    double mx = -1e300;
    for (Index j = 0; j < p.cols(); ++j)
      if (mask(i, j)) mx = std::max(mx, p(i, j));
    for (Index j = 0; j < p.cols(); ++j) p(i, j) = mask(i, j) ? std::exp(p(i, j) - mx) : 0.0;
    p.row(i) /= p.row(i).sum();
  }
  Gradients<double> g;
  g.dv = p.transpose() * d_out;
  const MatrixR<double> dp = d_out * v.transpose();
  const VectorX<double> dsum = (p.array() * dp.array()).rowwise().sum();
  const MatrixR<double> ds = p.array() * (dp.array().colwise() - dsum.array());
  g.dq = s * ds * k;
  g.dk = s * ds.transpose() * q;
  return g;
}

}  // namespace attnlab::test
