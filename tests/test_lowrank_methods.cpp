// Low-rank methods: Nyströmformer, Linformer, SVD and CUR against independent formulas, their exact limits,
// and the Eckart–Young floor that no rank-R method may beat.
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/components/landmarks.hpp"
#include "attnlab/analysis/metrics.hpp"
#include "attnlab/core/registry.hpp"
#include "test_util.hpp"

#include <Eigen/QR>
#include <Eigen/SVD>

namespace attnlab {
namespace {

using test::randn;
using test::rel_err;

MatrixR<double> softmax_rows(const MatrixR<double>& s) {
  MatrixR<double> p = s;
  for (Index i = 0; i < p.rows(); ++i) {
    p.row(i) = (p.row(i).array() - p.row(i).maxCoeff()).exp();
    p.row(i) /= p.row(i).sum();
  }
  return p;
}

MatrixR<double> pinv(const MatrixR<double>& a) {
  return Eigen::MatrixXd(a).completeOrthogonalDecomposition().pseudoInverse();
}

TEST(Landmarks, SegmentsDifferByAtMostOne) {
  for (Index n : {Index(7), Index(64), Index(100), Index(513)})
    for (Index m : {Index(1), Index(3), Index(7), Index(64)}) {
      if (m > n) continue;
      Index lo = n, hi = 0;
      for (Index s = 0; s < m; ++s) {
        const Index len = segment_begin(s + 1, n, m) - segment_begin(s, n, m);
        lo = std::min(lo, len);
        hi = std::max(hi, len);
      }
      EXPECT_LE(hi - lo, 1) << n << " " << m;
      EXPECT_EQ(segment_begin(m, n, m), n);
    }
}

TEST(Nystrom, MatchesTheSeedFormula) {
  const Index n = 43, m = 8, d = 16;
  const MatrixR<double> q = randn<double>(n, d, 1), k = randn<double>(n, d, 2);
  const double s = 0.25;
  // Landmarks by segment means, lengths 5 or 6.
  MatrixR<double> ql(m, d), kl(m, d);
  for (Index t = 0; t < m; ++t) {
    const Index b = t * n / m, e = (t + 1) * n / m;
    ql.row(t) = q.middleRows(b, e - b).colwise().mean();
    kl.row(t) = k.middleRows(b, e - b).colwise().mean();
  }
  const MatrixR<double> f = softmax_rows(s * q * kl.transpose()), a = softmax_rows(s * ql * kl.transpose()),
                        b = softmax_rows(s * ql * k.transpose());
  AttentionOptions o;
  o.scale = s;
  auto svd = make_method<double>("nystrom:landmarks=8,pinv=svd");
  svd->compute(q, k, o);
  EXPECT_LT(rel_err(svd->matrix(), (f * pinv(a) * b).eval()), 1e-10);
  // Six order-3 steps from Z₀ = Aᵀ/(‖A‖₁‖A‖∞), written out here (Razavi et al. 2014; Xiong et al. 2021 eq. (16)).
  MatrixR<double> z = a.transpose() / (a.cwiseAbs().colwise().sum().maxCoeff() * a.cwiseAbs().rowwise().sum().maxCoeff());
  const MatrixR<double> I = MatrixR<double>::Identity(m, m);
  for (int it = 0; it < 6; ++it) {
    const MatrixR<double> az = a * z;
    z = 0.25 * z * (13 * I - az * (15 * I - az * (7 * I - az)));
  }
  auto it6 = make_method<double>("nystrom:landmarks=8");
  it6->compute(q, k, o);
  EXPECT_LT(rel_err(it6->matrix(), (f * z * b).eval()), 1e-10);
}

TEST(Linformer, MatchesTheFormulaWithPooling) {
  const Index n = 50, kk = 7, d = 8;
  const MatrixR<double> q = randn<double>(n, d, 3), k = randn<double>(n, d, 4);
  const MatrixR<double> e = segment_mean_matrix<double>(kk, n);
  const MatrixR<double> ref = softmax_rows((q * (e * k).transpose()) / std::sqrt(double(d))) * e;
  auto m = make_method<double>("linformer:k=7,projection=pool,share_kv=true");
  m->compute(q, k);
  EXPECT_LT(rel_err(m->matrix(), ref), 1e-12);
  EXPECT_TRUE(m->op().rows_are_distributions());
  // Gaussian projections: N(0, 1/k) entries (the JL scaling): E[‖Ex‖²] = ‖x‖².
  auto g = make_method<double>("linformer:k=50,projection=gaussian,seed=3");
  EXPECT_NO_THROW(g->compute(q, k));
  // More projected rows than keys is no low-rank approximation: refused, like landmarks > n.
  auto over = make_method<double>("linformer:k=200,projection=gaussian,seed=3");
  EXPECT_THROW(over->compute(q, k), Error);
}

// landmarks = n, columns = n, rank = n and E = F = I reproduce exact attention (float64, well-conditioned P).
TEST(LowRank, ExactLimits) {
  for (Index n : {Index(40), Index(64)}) {
    const MatrixR<double> q = randn<double>(n, 64, 5), k = randn<double>(n, 64, 6), v = randn<double>(n, 8, 7);
    const MatrixR<double> p = exact_matrix<double>(q, k, {});
    const std::string N = std::to_string(n);
    for (const std::string& spec : {"nystrom:landmarks=" + N + ",pinv=svd", "cur:columns=" + N,
                                   "cur:columns=" + N + ",select=leverage", "svd:rank=" + N,
                                   "linformer:k=" + N + ",projection=identity"}) {
      auto m = make_method<double>(spec);
      m->compute(q, k);
      EXPECT_LT(rel_err(m->matrix(), p), 1e-8) << spec;
      EXPECT_LT(rel_err(m->output(v), (p * v).eval()), 1e-8) << spec;
    }
  }
}

// The matrix-free (Lanczos) SVD path agrees with the dense one.
TEST(LowRank, PartialSvdMatchesDense) {
  const MatrixR<double> q = randn<double>(300, 16, 8), k = randn<double>(300, 16, 9);
  auto dense = make_method<double>("svd:rank=12,dense_limit=1000"), lanczos = make_method<double>("svd:rank=12,dense_limit=10");
  dense->compute(q, k);
  lanczos->compute(q, k);
  EXPECT_LT(rel_err(lanczos->matrix(), dense->matrix()), 1e-8);
}

enum class Source { Gaussian, Sharp, Clustered };

MatrixR<double> keys(Source src, Index n, Index d, std::uint64_t seed) {
  if (src != Source::Clustered) return randn<double>(n, d, seed);
  const MatrixR<double> centres = randn<double>(4, d, seed + 100) * 2.0;
  MatrixR<double> k = randn<double>(n, d, seed) * 0.3;
  for (Index i = 0; i < n; ++i) k.row(i) += centres.row(i % 4);
  return k;
}

// Eckart–Young–Mirsky: no matrix of rank ≤ R is closer to P in Frobenius norm than P_R. A method whose P̃ has
// rank ≤ R must therefore never beat svd:rank=R; a violation is a bug in the method or in the floor.
TEST(LowRank, EckartYoungFloorHolds) {
  const std::vector<std::string> methods = {
      "nystrom:landmarks=8",        "nystrom:landmarks=16,pinv=svd", "nystrom:landmarks=12,select=random",
      "linformer:k=8",              "linformer:k=16,projection=pool", "linformer:k=12,projection=uniform,share_kv=true",
      "cur:columns=8",              "cur:columns=16,select=leverage", "performer:features=8",
      "performer:features=16,orthogonal=false", "efficient"};
  int checked = 0;
  for (Source src : {Source::Gaussian, Source::Sharp, Source::Clustered})
    for (Index n : {Index(64), Index(96)})
      for (std::uint64_t seed : {1u, 2u, 3u}) {
        const Index d = 16;
        const MatrixR<double> q = src == Source::Clustered ? keys(src, n, d, seed + 7) : randn<double>(n, d, seed);
        const MatrixR<double> k = keys(src, n, d, seed + 50);
        AttentionOptions o;
        o.scale = src == Source::Sharp ? 1.0 : 0.25;
        const ExactOperator<double> p(q, k, o);
        MatrixErrorOptions eo;
        eo.spectral = false;
        for (const auto& spec : methods) {
          auto m = make_method<double>(spec, seed);
          m->compute(q, k, o);
          const Index r = m->rank_bound();
          ASSERT_GT(r, 0) << spec;
          if (r >= n) continue;
          auto floor = make_method<double>("svd:rank=" + std::to_string(r));
          floor->compute(q, k, o);
          const double e_method = matrix_errors<double>(p, m->op(), eo).rel_fro;
          const double e_floor = matrix_errors<double>(p, floor->op(), eo).rel_fro;
          EXPECT_GE(e_method, e_floor * (1 - 1e-9)) << spec << " n=" << n << " seed=" << seed << " src=" << int(src);
          ++checked;
        }
      }
  EXPECT_GT(checked, 150);
}

}  // namespace
}  // namespace attnlab
