// Kernel feature-map methods against independent formulas: linear (elu, relu), taylor, efficient, Performer;
// causal forms (recurrent, chunked) against the masked quadratic computation; Performer's unbiasedness,
// its 1/√M error decay, and orthogonal features beating iid ones. Backward passes (linear, taylor, Performer,
// Scatterbrain) against the dense backpropagation of P̃ = D⁻¹(ΦΨᵀ ∘ mask) with closed-form feature Jacobians;
// Performer's with many features approaching exact attention's, Scatterbrain's with a band covering every key equal
// to exact attention's.
#include "attnlab/operators/exact.hpp"
#include "attnlab/analysis/metrics.hpp"
#include "attnlab/components/random_features.hpp"
#include "attnlab/core/registry.hpp"
#include "test_util.hpp"

#include <cstdio>
#include <functional>
#include <tuple>
#include <vector>

namespace attnlab {
namespace {

using test::randn;
using test::rel_err;
using Sim = std::function<long double(Index, Index)>;

/// P̃_ij = sim(i, j) / Σ_{visible j'} sim(i, j'), masked, by the definition (Katharopoulos et al. 2020
/// eq. (2); masked as in §3.3).
MatrixR<double> normalized(Index nq, Index nk, bool causal, const Sim& sim) {
  MatrixR<double> p = MatrixR<double>::Zero(nq, nk);
  for (Index i = 0; i < nq; ++i) {
    const Index last = causal ? i + nk - nq : nk - 1;
    long double den = 0;
    for (Index j = 0; j <= last; ++j) den += sim(i, j);
    for (Index j = 0; j <= last; ++j) p(i, j) = double(sim(i, j) / den);
  }
  return p;
}

long double elu1(double x) { return x > 0 ? x + 1.0L : std::exp((long double)x); }

struct Problem {
  MatrixR<double> q, k, v;
};
Problem problem(Index nq, Index nk, Index d, std::uint64_t seed) {
  return {randn<double>(nq, d, seed), randn<double>(nk, d, seed + 1), randn<double>(nk, 5, seed + 2)};
}

std::string fmt_spec(const std::string& kernel, Index m, bool orthogonal) {
  return "performer:features=" + std::to_string(m) + ",kernel=" + kernel +
         ",orthogonal=" + (orthogonal ? "true" : "false") + ",seed=5";
}

/// The method's P̃, its output, and (when causal) both causal forms, against a reference P̃.
void expect_method_matches(const std::string& spec, const Problem& pr, bool causal, const MatrixR<double>& ref) {
  SCOPED_TRACE(spec + (causal ? " causal" : ""));
  AttentionOptions o;
  o.causal = causal;
  auto m = make_method<double>(spec);
  m->compute(pr.q, pr.k, o);
  EXPECT_LT(rel_err(m->matrix(), ref), 1e-12);
  EXPECT_LT(rel_err(m->output(pr.v), (ref * pr.v).eval()), 1e-12);
  if (!causal) return;
  const std::string sep = spec.find(':') == std::string::npos ? ":" : ",";
  for (const char* form : {"causal_form=recurrent", "causal_form=chunked,chunk=1", "causal_form=chunked,chunk=7",
                           "causal_form=chunked,chunk=1000"}) {
    auto f = make_method<double>(spec + sep + form);
    f->compute(pr.q, pr.k, o);
    EXPECT_LT(rel_err(f->output(pr.v), (ref * pr.v).eval()), 1e-12) << form;
  }
}

TEST(KernelMethods, LinearMatchesDefinition) {
  for (bool causal : {false, true})
    for (auto shape : {std::pair<Index, Index>{41, 41}, std::pair<Index, Index>{30, 53}}) {
      const Problem pr = problem(shape.first, shape.second, 8, 10);
      const auto phi_dot = [&](bool relu) {
        return [&, relu](Index i, Index j) {
          long double s = 0;
          for (Index c = 0; c < pr.q.cols(); ++c)
            s += relu ? std::max(0.0, pr.q(i, c)) * (long double)std::max(0.0, pr.k(j, c))
                      : elu1(pr.q(i, c)) * elu1(pr.k(j, c));
          return s;
        };
      };
      expect_method_matches("linear:feature=elu", pr, causal,
                            normalized(shape.first, shape.second, causal, phi_dot(false)));
      expect_method_matches("linear:feature=relu", pr, causal,
                            normalized(shape.first, shape.second, causal, phi_dot(true)));
    }
}

TEST(KernelMethods, TaylorMatchesDefinition) {
  for (bool causal : {false, true}) {
    const Problem pr = problem(37, 37, 8, 20);
    const auto sim = [&](Index i, Index j) {
      return 1.0L + (long double)(pr.q.row(i).dot(pr.k.row(j)) / (pr.q.row(i).norm() * pr.k.row(j).norm()));
    };
    expect_method_matches("taylor", pr, causal, normalized(37, 37, causal, sim));
  }
}

TEST(KernelMethods, EfficientMatchesDefinition) {
  const Problem pr = problem(33, 45, 6, 30);
  MatrixR<double> a = pr.q, b = pr.k;  // softmax over features per query, over positions per key feature
  for (Index i = 0; i < a.rows(); ++i) a.row(i) = a.row(i).array().exp() / a.row(i).array().exp().sum();
  for (Index c = 0; c < b.cols(); ++c) b.col(c) = b.col(c).array().exp() / b.col(c).array().exp().sum();
  expect_method_matches("efficient", pr, false, a * b.transpose());
}

TEST(KernelMethods, PerformerMatchesItsFeatureDefinition) {
  for (const char* kernel : {"positive", "trig", "hyperbolic"})
    for (bool causal : {false, true})
      for (bool orthogonal : {false, true}) {
        const Index m = 24, d = 8;
        const Problem pr = problem(29, 29, d, 40);
        const double s = 1.0 / std::sqrt(double(d));
        Rng rng(5);
        const MatrixR<double> w = performer_projection<double>(m, d, orthogonal, true, rng);
        // φ by the formulas of Choromanski et al. Lemma 1 / eq. (7), in long double.
        const auto phi = [&](const MatrixR<double>& x, Index i) {
          std::vector<long double> f;
          const VectorX<double> xi = x.row(i).transpose() * std::sqrt(s);
          const long double h = xi.squaredNorm() / 2.0L;
          for (Index r = 0; r < m; ++r) {
            const long double p = w.row(r).dot(xi);
            if (std::string(kernel) == "positive") f.push_back(std::exp(p - h) / std::sqrt((long double)m));
            if (std::string(kernel) == "hyperbolic") f.push_back(std::exp(p - h) / std::sqrt(2.0L * m));
            if (std::string(kernel) == "trig") f.push_back(std::exp(h) * std::sin(p) / std::sqrt((long double)m));
          }
          for (Index r = 0; r < m; ++r) {
            const long double p = w.row(r).dot(xi);
            if (std::string(kernel) == "hyperbolic") f.push_back(std::exp(-p - h) / std::sqrt(2.0L * m));
            if (std::string(kernel) == "trig") f.push_back(std::exp(h) * std::cos(p) / std::sqrt((long double)m));
          }
          return f;
        };
        const auto sim = [&](Index i, Index j) {
          const auto a = phi(pr.q, i), b = phi(pr.k, j);
          long double t = 0;
          for (std::size_t c = 0; c < a.size(); ++c) t += a[c] * b[c];
          return t;
        };
        expect_method_matches(fmt_spec(kernel, m, orthogonal), pr, causal, normalized(29, 29, causal, sim));
      }
}

// E[φ(x)ᵀφ(y)] = exp(xᵀy) for every kernel, iid and orthogonal (χ norms): the mean over 4000 draws of ω lies
// within 4.5 standard errors of the truth.
TEST(KernelMethods, PerformerKernelEstimateIsUnbiased) {
  const Index d = 16, m = 16, draws = 4000;
  MatrixR<double> x = randn<double>(1, d, 50) * 0.25, y = randn<double>(1, d, 51) * 0.25;
  const double truth = std::exp(x.row(0).dot(y.row(0)));
  for (auto kernel : {PerformerKernel::Positive, PerformerKernel::Trig, PerformerKernel::Hyperbolic})
    for (bool orthogonal : {false, true}) {
      double sum = 0, sum2 = 0;
      for (Index t = 0; t < draws; ++t) {
        Rng rng(1000 + std::uint64_t(t));
        const MatrixR<double> w = performer_projection<double>(m, d, orthogonal, true, rng);
        const auto fx = performer_features<double>(x, w, kernel), fy = performer_features<double>(y, w, kernel);
        const double est = std::exp(fx.logscale(0) + fy.logscale(0)) * fx.f.row(0).dot(fy.f.row(0));
        sum += est;
        sum2 += est * est;
      }
      const double mean = sum / draws, se = std::sqrt((sum2 / draws - mean * mean) / draws);
      EXPECT_LT(std::fabs(mean - truth), 4.5 * se) << "kernel " << int(kernel) << " orthogonal " << orthogonal
                                                   << ": mean " << mean << " truth " << truth << " se " << se;
      EXPECT_LT(se, 0.05 * truth);  // the test has the power to see a 20% bias
    }
}

/// Mean relative error of Performer's P̃ ("P") or output ("O") over seeds, on Gaussian q, k of standard deviation
/// sigma (d = 16, scale 1/√d: x = s^½q has ‖x‖² ≈ 4σ²).
double performer_error(Index features, bool orthogonal, const std::string& metric, double sigma = 0.5) {
  double total = 0;
  const int seeds = 12;
  for (int s = 0; s < seeds; ++s) {
    const MatrixR<double> q = randn<double>(128, 16, 60 + s, sigma), k = randn<double>(128, 16, 80 + s, sigma),
                          v = randn<double>(128, 8, 90 + s);
    auto m = make_method<double>("performer:features=" + std::to_string(features) +
                                 ",orthogonal=" + (orthogonal ? "true" : "false") + ",seed=" + std::to_string(s));
    m->compute(q, k);
    if (metric == "P") {
      const ExactOperator<double> p(q, k, {});
      MatrixErrorOptions o;
      o.spectral = false;
      total += matrix_errors<double>(p, m->op(), o).rel_fro;
    } else {
      total += output_errors<double>(exact_output<double>(q, k, v, {}), m->output(v)).rel_fro;
    }
  }
  return total / seeds;
}

// Monte-Carlo rate: the error of P̃ falls like 1/√M, so ×4 features halves it — where the estimator is in its
// asymptotic regime, i.e. the per-entry relative variance (e^{‖x+y‖²} − 1)/M of Lemma 2 is below one. With σ = 0.5,
// ‖x+y‖² ≈ 2 and (e² − 1)/16 ≈ 0.4. (On unit Gaussians, ‖x+y‖² ≈ 8 and e⁸/M ≫ 1 for every M here: the error then
// barely moves with M — measured ratios 0.86-0.97 for ×4 — which the experiments report rather than hide.)
TEST(KernelMethods, PerformerErrorFallsAsOneOverRootM) {
  for (bool orthogonal : {false, true}) {
    const double e16 = performer_error(16, orthogonal, "P"), e64 = performer_error(64, orthogonal, "P"),
                 e256 = performer_error(256, orthogonal, "P");
    std::printf(
        "performer orthogonal=%d, σ=0.5: rel. error of P̃ at M = 16, 64, 256: %.3f %.3f %.3f; unit σ: %.3f %.3f %.3f\n",
        int(orthogonal), e16, e64, e256, performer_error(16, orthogonal, "P", 1.0),
        performer_error(64, orthogonal, "P", 1.0), performer_error(256, orthogonal, "P", 1.0));
    EXPECT_GT(e64 / e16, 0.35) << "orthogonal=" << orthogonal;
    EXPECT_LT(e64 / e16, 0.7) << "orthogonal=" << orthogonal;
    EXPECT_GT(e256 / e64, 0.35) << "orthogonal=" << orthogonal;
    EXPECT_LT(e256 / e64, 0.7) << "orthogonal=" << orthogonal;
  }
}

// Orthogonal random features lower the variance (Choromanski et al. Theorem 2): lower output error on average.
TEST(KernelMethods, PerformerOrthogonalBeatsIid) {
  for (Index m : {Index(16), Index(64)}) {
    const double orth = performer_error(m, true, "O"), iid = performer_error(m, false, "O");
    std::printf("performer output rel. error, M = %ld, σ=0.5: orthogonal %.4f, iid %.4f\n", long(m), orth, iid);
    EXPECT_LT(orth, iid) << "M = " << m;
  }
}

// ---- Backward passes.

/// The dense VJP of O = D⁻¹AV, A = ΦΨᵀ ∘ mask, D = diag(A·1) (Katharopoulos et al. 2020 eq. (2), the mask written
/// out): dV = P̃ᵀdO, dA = (dO·Vᵀ − rowsum(dO ∘ O)) / D on the visible entries, dΦ = dA·Ψ, dΨ = dAᵀ·Φ.
struct DenseKernelGrad {
  MatrixR<double> dphi, dpsi, dv;
};
DenseKernelGrad dense_kernel_backward(const MatrixR<double>& phi, const MatrixR<double>& psi,
                                      const MatrixR<double>& v, const MatrixR<double>& d_out, bool causal) {
  const Index nq = phi.rows(), nk = psi.rows(), off = nk - nq;
  MatrixR<double> a = phi * psi.transpose();
  if (causal)
    for (Index i = 0; i < nq; ++i) a.row(i).tail(nk - (i + off + 1)).setZero();
  const VectorX<double> den = a.rowwise().sum();
  const MatrixR<double> p = den.cwiseInverse().asDiagonal() * a;
  const MatrixR<double> out = p * v;
  MatrixR<double> da = d_out * v.transpose();
  da.colwise() -= VectorX<double>((d_out.array() * out.array()).rowwise().sum());
  da = den.cwiseInverse().asDiagonal() * da;
  if (causal)
    for (Index i = 0; i < nq; ++i) da.row(i).tail(nk - (i + off + 1)).setZero();
  return {da * psi, da.transpose() * phi, p.transpose() * d_out};
}

/// A feature map and its Jacobian's transpose applied to ∂L/∂φ, by the formulas (no stabilization).
struct FeatureMap {
  std::function<MatrixR<double>(const MatrixR<double>&)> phi;
  std::function<MatrixR<double>(const MatrixR<double>&, const MatrixR<double>&)> vjp;  // (x, dφ) → dx
};

/// Performer's maps on x = s^½·q (Choromanski et al. 2021 Lemma 1, eq. (7)) with the method's ω.
FeatureMap performer_map(const std::string& kernel, const MatrixR<double>& w, double s) {
  const Index m = w.rows();
  const double root = std::sqrt(s);
  const auto parts = [=](const MatrixR<double>& x) {
    const MatrixR<double> xs = x * root;
    const MatrixR<double> p = xs * w.transpose();
    const VectorX<double> h = xs.rowwise().squaredNorm() / 2.0;
    return std::make_tuple(xs, p, h);
  };
  FeatureMap f;
  f.phi = [=](const MatrixR<double>& x) {
    const auto [xs, p, h] = parts(x);
    if (kernel == "positive")
      return MatrixR<double>(((p.array().colwise() - h.array()).exp() / std::sqrt(double(m))).matrix());
    MatrixR<double> out(x.rows(), 2 * m);
    if (kernel == "hyperbolic") {
      out.leftCols(m) = (p.array().colwise() - h.array()).exp() / std::sqrt(2.0 * m);
      out.rightCols(m) = ((-p.array()).colwise() - h.array()).exp() / std::sqrt(2.0 * m);
    } else {
      const VectorX<double> e = h.array().exp() / std::sqrt(double(m));
      out.leftCols(m) = e.asDiagonal() * MatrixR<double>(p.array().sin());
      out.rightCols(m) = e.asDiagonal() * MatrixR<double>(p.array().cos());
    }
    return out;
  };
  f.vjp = [=](const MatrixR<double>& x, const MatrixR<double>& dphi) {
    const auto [xs, p, h] = parts(x);
    const MatrixR<double> phi = f.phi(x);
    MatrixR<double> dx = MatrixR<double>::Zero(x.rows(), x.cols());
    for (Index i = 0; i < x.rows(); ++i)
      for (Index r = 0; r < m; ++r) {
        const auto wr = w.row(r);
        const auto xi = xs.row(i);
        if (kernel == "positive") {
          dx.row(i) += dphi(i, r) * phi(i, r) * (wr - xi);
        } else if (kernel == "hyperbolic") {
          dx.row(i) += dphi(i, r) * phi(i, r) * (wr - xi) + dphi(i, m + r) * phi(i, m + r) * (-wr - xi);
        } else {  // φ = e^{h}[sin p, cos p]/√M: ∂ sin-part = e^h(cos p·ω + sin p·x)/√M,
                  // ∂ cos-part = e^h(−sin p·ω + cos p·x)/√M
          const double e = std::exp(h(i)) / std::sqrt(double(m)), sp = std::sin(p(i, r)), cp = std::cos(p(i, r));
          dx.row(i) += dphi(i, r) * e * (cp * wr + sp * xi) + dphi(i, m + r) * e * (-sp * wr + cp * xi);
        }
      }
    return MatrixR<double>(dx * root);
  };
  return f;
}

FeatureMap linear_map(bool relu) {
  FeatureMap f;
  f.phi = [relu](const MatrixR<double>& x) {
    return MatrixR<double>(x.unaryExpr([relu](double t) { return relu ? std::max(t, 0.0) : double(elu1(t)); }));
  };
  f.vjp = [relu](const MatrixR<double>& x, const MatrixR<double>& dphi) {
    MatrixR<double> dx(x.rows(), x.cols());
    for (Index i = 0; i < x.rows(); ++i)
      for (Index c = 0; c < x.cols(); ++c)
        dx(i, c) = dphi(i, c) * (x(i, c) > 0 ? 1.0 : relu ? 0.0 : std::exp(x(i, c)));
    return dx;
  };
  return f;
}

FeatureMap taylor_map() {
  FeatureMap f;
  f.phi = [](const MatrixR<double>& x) {
    MatrixR<double> out(x.rows(), x.cols() + 1);
    out.col(0).setOnes();
    for (Index i = 0; i < x.rows(); ++i) out.row(i).tail(x.cols()) = x.row(i) / x.row(i).norm();
    return out;
  };
  f.vjp = [](const MatrixR<double>& x, const MatrixR<double>& dphi) {  // J = (I − uuᵀ)/‖x‖, as a d × d matrix
    MatrixR<double> dx(x.rows(), x.cols());
    for (Index i = 0; i < x.rows(); ++i) {
      const double n = x.row(i).norm();
      const VectorX<double> u = x.row(i).transpose() / n;
      const MatrixR<double> jac = (MatrixR<double>::Identity(x.cols(), x.cols()) - u * u.transpose()) / n;
      dx.row(i) = (jac * dphi.row(i).tail(x.cols()).transpose()).transpose();
    }
    return dx;
  };
  return f;
}

/// The method's backward against the dense one through `map`, without and with a mask, every causal form.
void expect_backward_matches(const std::string& spec, const FeatureMap& map, Index nq, Index nk, double tol = 1e-10) {
  const Problem pr = problem(nq, nk, 8, 70);
  const MatrixR<double> d_out = randn<double>(nq, pr.v.cols(), 74);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const DenseKernelGrad want = dense_kernel_backward(map.phi(pr.q), map.phi(pr.k), pr.v, d_out, causal);
    const MatrixR<double> dq = map.vjp(pr.q, want.dphi), dk = map.vjp(pr.k, want.dpsi);
    const std::string sep = spec.find(':') == std::string::npos ? ":" : ",";
    std::vector<std::string> forms = {""};
    if (causal)
      forms = {"causal_form=recurrent", "causal_form=chunked,chunk=1", "causal_form=chunked,chunk=7",
               "causal_form=chunked,chunk=1000"};
    for (const std::string& form : forms) {
      const std::string full = form.empty() ? spec : spec + sep + form;
      SCOPED_TRACE(full + (causal ? " causal" : ""));
      auto m = make_method<double>(full);
      m->compute(pr.q, pr.k, o);
      const Gradients<double> g = m->backward(pr.v, d_out);
      EXPECT_LT(rel_err(g.dv, want.dv), tol) << "dV";
      EXPECT_LT(rel_err(g.dq, dq), tol) << "dQ";
      EXPECT_LT(rel_err(g.dk, dk), tol) << "dK";
    }
  }
}

TEST(KernelBackward, LinearAndTaylorMatchDenseBackprop) {
  for (auto shape : {std::pair<Index, Index>{41, 41}, std::pair<Index, Index>{30, 53}}) {
    expect_backward_matches("linear:feature=elu", linear_map(false), shape.first, shape.second);
    expect_backward_matches("linear:feature=relu", linear_map(true), shape.first, shape.second);
    expect_backward_matches("taylor", taylor_map(), shape.first, shape.second);
  }
}

TEST(KernelBackward, PerformerMatchesDenseBackprop) {
  for (const char* kernel : {"positive", "trig", "hyperbolic"})
    for (bool orthogonal : {false, true}) {
      const Index m = 24, d = 8;
      Rng rng(5);
      const MatrixR<double> w = performer_projection<double>(m, d, orthogonal, true, rng);
      const FeatureMap map = performer_map(kernel, w, 1.0 / std::sqrt(double(d)));
      expect_backward_matches(fmt_spec(kernel, m, orthogonal), map, 29, 29);
      expect_backward_matches(fmt_spec(kernel, m, orthogonal), map, 23, 37);
    }
}

/// Exact attention's gradients (FlashAttention-2's backward, operators/exact.hpp).
Gradients<double> exact_grads(const Problem& pr, const MatrixR<double>& d_out, const AttentionOptions& o) {
  VectorX<double> lse;
  const MatrixR<double> out = exact_output<double>(pr.q, pr.k, pr.v, o, 64, {}, &lse);
  return exact_backward<double>(pr.q, pr.k, pr.v, out, lse, d_out, o, 64);
}

// Performer's features estimate exp(s·qᵀk) (Choromanski et al. 2021 Lemma 1): with many features its attention and
// so its gradients approach exact attention's; the error falls as M grows (Monte Carlo, ~1/√M).
TEST(KernelBackward, PerformerApproachesExactWithManyFeatures) {
  const Index n = 48, d = 8;
  Problem pr{randn<double>(n, d, 91, 0.5), randn<double>(n, d, 92, 0.5), randn<double>(n, 4, 93)};
  const MatrixR<double> d_out = randn<double>(n, 4, 94);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const Gradients<double> want = exact_grads(pr, d_out, o);
    double prev = 1e300;
    for (Index m : {Index(64), Index(1024), Index(16384)}) {
      double err = 0;
      const int seeds = 4;
      for (int seed = 0; seed < seeds; ++seed) {
        auto meth = make_method<double>("performer:features=" + std::to_string(m) + ",seed=" + std::to_string(seed));
        meth->compute(pr.q, pr.k, o);
        const Gradients<double> g = meth->backward(pr.v, d_out);
        err += std::max({rel_err(g.dq, want.dq), rel_err(g.dk, want.dk), rel_err(g.dv, want.dv)}) / seeds;
      }
      std::printf("performer backward vs exact, causal=%d, M = %ld: worst rel. error of dQ, dK, dV %.4f\n",
                  int(causal), long(m), err);
      // ×16 features: ~×¼ the error (measured ratios 0.36, 0.23; causal 0.35, 0.24).
      if (prev < 1e300) {
        EXPECT_LT(err, prev * 0.5) << "M = " << m;
        EXPECT_GT(err, prev * 0.1) << "M = " << m << ": faster than Monte Carlo?";
      }
      prev = err;
    }
    EXPECT_LT(prev, 0.1) << "causal=" << causal;  // measured 0.066 (0.060 causal) at M = 16384
  }
}

/// Scatterbrain's Ã by its definition (Chen et al. 2021 §3): φ(q_i)ᵀφ(k_j) off the band, exp(s·q_iᵀk_j) on it,
/// with φ the positive features of its ω; normalized; and the dense VJP of P̃V through it.
TEST(KernelBackward, ScatterbrainMatchesDenseBackprop) {
  const Index d = 8, m = 16, w = 3;
  for (auto shape : {std::pair<Index, Index>{40, 40}, std::pair<Index, Index>{150, 170}}) {
    const Index nq = shape.first, nk = shape.second, off = nk - nq;
    SCOPED_TRACE(::testing::Message() << nq << "×" << nk);
    const Problem pr = problem(nq, nk, d, 80);
    const MatrixR<double> d_out = randn<double>(nq, pr.v.cols(), 84);
    const double s = 1.0 / std::sqrt(double(d));
    Rng rng(3);
    const MatrixR<double> omega = performer_projection<double>(m, d, true, true, rng);
    const FeatureMap map = performer_map("positive", omega, s);
    const MatrixR<double> phi = map.phi(pr.q), psi = map.phi(pr.k);
    MatrixR<double> a = phi * psi.transpose();
    const MatrixR<double> ex = (s * pr.q * pr.k.transpose()).array().exp().matrix();
    MatrixR<double> band = MatrixR<double>::Zero(nq, nk);
    for (Index i = 0; i < nq; ++i)
      for (Index j = std::max<Index>(0, i + off - w); j <= std::min(nk - 1, i + off + w); ++j) band(i, j) = 1;
    a = (band.array() > 0).select(ex.array(), a.array()).matrix();
    const VectorX<double> den = a.rowwise().sum();
    const MatrixR<double> p = den.cwiseInverse().asDiagonal() * a, out = p * pr.v;
    MatrixR<double> da = d_out * pr.v.transpose();
    da.colwise() -= VectorX<double>((d_out.array() * out.array()).rowwise().sum());
    da = den.cwiseInverse().asDiagonal() * da;
    const MatrixR<double> d_est = (band.array() > 0).select(0.0, da.array()).matrix();         // through the features
    const MatrixR<double> d_log =
        (band.array() > 0).select(da.cwiseProduct(a).array(), 0.0).matrix();  // through exp(s·qᵀk)
    const MatrixR<double> want_dq = map.vjp(pr.q, d_est * psi) + s * d_log * pr.k;
    const MatrixR<double> want_dk = map.vjp(pr.k, d_est.transpose() * phi) + s * d_log.transpose() * pr.q;
    auto meth = make_method<double>("scatterbrain:features=" + std::to_string(m) + ",window=" + std::to_string(w) +
                                    ",seed=3");
    meth->compute(pr.q, pr.k);
    ASSERT_LT(rel_err(meth->output(pr.v), out), 1e-12) << "the reference's forward is not the method's";
    const Gradients<double> g = meth->backward(pr.v, d_out);
    EXPECT_LT(rel_err(g.dv, (p.transpose() * d_out).eval()), 1e-10);
    EXPECT_LT(rel_err(g.dq, want_dq), 1e-10);
    EXPECT_LT(rel_err(g.dk, want_dk), 1e-10);
  }
}

// A band that covers every key leaves no estimate: Scatterbrain is exact attention, and so is its backward.
TEST(KernelBackward, ScatterbrainWithFullBandIsExactBackward) {
  const Problem pr = problem(45, 60, 8, 85);
  const MatrixR<double> d_out = randn<double>(45, pr.v.cols(), 86);
  const Gradients<double> want = exact_grads(pr, d_out, {});
  auto meth = make_method<double>("scatterbrain:features=8,window=60");
  meth->compute(pr.q, pr.k);
  const Gradients<double> g = meth->backward(pr.v, d_out);
  EXPECT_LT(rel_err(g.dq, want.dq), 1e-10);
  EXPECT_LT(rel_err(g.dk, want.dk), 1e-10);
  EXPECT_LT(rel_err(g.dv, want.dv), 1e-10);
}

}  // namespace
}  // namespace attnlab
