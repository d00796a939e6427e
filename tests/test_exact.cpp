// Exact attention: materialized against an independent long-double formula, streaming against
// materialized, and the operator form against the matrix, with and without the causal mask.
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "test_util.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

namespace attnlab {
namespace {

using test::randn;
using test::rel_err;

/// softmax(s·QKᵀ + M) by the definition, in long double, one entry at a time.
template <typename T>
MatrixR<double> naive_attention(const MatrixR<T>& q, const MatrixR<T>& k, double s, bool causal) {
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  MatrixR<double> p = MatrixR<double>::Zero(nq, nk);
  for (Index i = 0; i < nq; ++i) {
    std::vector<long double> logits;
    long double mx = -1e300L;
    const Index last = causal ? i + off : nk - 1;
    for (Index j = 0; j <= last; ++j) {
      long double dot = 0;
      for (Index c = 0; c < q.cols(); ++c) dot += (long double)q(i, c) * (long double)k(j, c);
      logits.push_back(dot * s);
      mx = std::max(mx, logits.back());
    }
    long double sum = 0;
    for (auto& x : logits) sum += std::exp(x - mx);
    for (Index j = 0; j <= last; ++j) p(i, j) = double(std::exp(logits[j] - mx) / sum);
  }
  return p;
}

template <typename T>
class ExactTest : public ::testing::Test {};
TYPED_TEST_SUITE(ExactTest, test::Scalars);

struct Case {
  Index nq, nk, d, dv;
  bool causal;
  double logit_mult;
  /// The case's mask, and its logits scaled ×logit_mult beyond the usual 1/√d.
  AttentionOptions options() const {
    AttentionOptions o;
    o.causal = causal;
    o.scale = logit_mult / std::sqrt(double(d));
    return o;
  }
};

/// A case's Q and K (drawn with seeds `seed` and `seed` + 1), its options and exact P materialized.
template <typename T>
struct CaseMatrix {
  MatrixR<T> q, k;
  AttentionOptions o;
  MatrixR<T> p;
};

template <typename T>
CaseMatrix<T> case_matrix(const Case& c, std::uint64_t seed) {
  CaseMatrix<T> m{randn<T>(c.nq, c.d, seed), randn<T>(c.nk, c.d, seed + 1), c.options(), {}};
  m.p = exact_matrix<T>(m.q, m.k, m.o);
  return m;
}

const std::vector<Case> kCases = {
    {37, 37, 8, 5, false, 1},   {37, 37, 8, 5, true, 1},    {50, 83, 16, 7, false, 1}, {50, 83, 16, 7, true, 1},
    {300, 300, 32, 16, true, 1}, {300, 270, 32, 16, false, 1}, {64, 64, 16, 16, false, 100},
    {64, 64, 16, 16, true, 100}, {1, 1, 3, 2, true, 1},      {1, 9, 3, 2, true, 1},
};

TYPED_TEST(ExactTest, MaterializedMatchesDefinition) {
  using T = TypeParam;
  for (const auto& c : kCases) {
    const auto [q, k, o, p] = case_matrix<T>(c, 1);
    const MatrixR<double> ref = naive_attention(q, k, o.scale, c.causal);
    // With logits ×100 the rounding of each logit, ~eps·|s|·Σ|q_c k_c| ≈ eps·100·√d, moves P by as much
    // (about 2e-5 in float32 at d = 16): the tolerance grows by 10 for those cases.
    const double t = test::tol<T>() * (c.logit_mult > 1 ? 10 : 1);
    EXPECT_LT(rel_err(p, ref), t) << "nq=" << c.nq << " nk=" << c.nk << " causal=" << c.causal;
    EXPECT_TRUE(p.allFinite());
    for (Index i = 0; i < p.rows(); ++i) EXPECT_NEAR(double(p.row(i).sum()), 1.0, 10 * test::tol<T>());
    if (c.causal) {  // nothing from the future: P_ij = 0 for j > i + (n_k − n_q)
      for (Index i = 0; i < c.nq; ++i)
        for (Index j = i + (c.nk - c.nq) + 1; j < c.nk; ++j) EXPECT_EQ(p(i, j), T(0));
    }
  }
}

TYPED_TEST(ExactTest, StreamingMatchesMaterialized) {
  using T = TypeParam;
  for (const auto& c : kCases)
    for (Index tile : {Index(8), Index(13), Index(64), Index(256)}) {
      const MatrixR<T> q = randn<T>(c.nq, c.d, 3), k = randn<T>(c.nk, c.d, 4), v = randn<T>(c.nk, c.dv, 5);
      const AttentionOptions o = c.options();
      const MatrixR<T> streamed = exact_output<T>(q, k, v, o, tile);
      ASSERT_TRUE(streamed.allFinite()) << "tile=" << tile;
      const MatrixR<T> materialized = exact_matrix<T>(q, k, o) * v;
      EXPECT_LT(rel_err(streamed, materialized), test::tol<T>())
          << "nq=" << c.nq << " nk=" << c.nk << " causal=" << c.causal << " tile=" << tile << " x" << c.logit_mult;
    }
}

// Few queries over many keys take the split-KV path (groups of kSplitKeys keys merged in order): the same output and
// row log-sum-exp as the independent long-double formula, with and without the mask, for rows at their own positions
// in a longer sequence (ProbSparse's selected queries: QueryLayout) and for the last rows of one.
TYPED_TEST(ExactTest, FewQueriesOverManyKeysSplitTheKeys) {
  using T = TypeParam;
  const Index nk = 2 * kSplitKeys + 300, d = 16, nq_full = nk;
  const MatrixR<T> k = randn<T>(nk, d, 2), v = randn<T>(nk, 8, 3), qfull = randn<T>(nq_full, d, 1);
  const std::vector<Index> rows = {0, 5, 700, 2047, 2048, 2049, 3000, 4395};
  MatrixR<T> q(Index(rows.size()), d);
  for (std::size_t r = 0; r < rows.size(); ++r) q.row(Index(r)) = qfull.row(rows[r]);
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  for (const bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    VectorX<T> lse;
    const MatrixR<T> out = exact_output<T>(q, k, v, o, kDefaultTile, QueryLayout{rows, nq_full}, &lse);
    MatrixR<double> p = MatrixR<double>::Zero(Index(rows.size()), nk);  // each row over the keys it sees
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const Index seen = causal ? rows[r] + 1 : nk;
      const MatrixR<T> qr = q.row(Index(r)), ks = k.topRows(seen);
      p.row(Index(r)).head(seen) = naive_attention<T>(qr, ks, o.resolved_scale(d), false);
    }
    EXPECT_LT(rel_err(out, (p * v.template cast<double>()).eval()), tol) << (causal ? "causal" : "");
    // ℓ against the row's own log-sum-exp, formed again in float64.
    const MatrixR<double> qd = q.template cast<double>(), kd = k.template cast<double>();
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const Index last = causal ? rows[r] : nk - 1;
      const Eigen::VectorXd z = (kd.topRows(last + 1) * qd.row(Index(r)).transpose()) * o.resolved_scale(d);
      const double ref = z.maxCoeff() + std::log((z.array() - z.maxCoeff()).exp().sum());
      EXPECT_NEAR(double(lse(Index(r))), ref, tol * std::abs(ref) + tol);
    }
  }
  // The groups are fixed: the bits do not depend on the thread count.
  {
    const int before = omp_get_max_threads();
    AttentionOptions o;
    omp_set_num_threads(1);
    const MatrixR<T> one = exact_output<T>(q, k, v, o, kDefaultTile, QueryLayout{rows, nq_full});
    omp_set_num_threads(std::max(2, before));
    const MatrixR<T> two = exact_output<T>(q, k, v, o, kDefaultTile, QueryLayout{rows, nq_full});
    omp_set_num_threads(before);
    EXPECT_TRUE(one == two) << "split-KV bits differ between 1 and 2 threads";
  }
  // A group whose logits overflow makes its rows NaN (as the tiled path's), never finite without that group.
  {
    MatrixR<T> kb = k, qb = q;
    kb.row(3000).setConstant(T(1e20));
    qb.row(0).setConstant(T(1e20));
    qb.row(1).setConstant(T(1e20));
    if constexpr (std::is_same_v<T, double>) {
      kb.row(3000).setConstant(T(1e200));
      qb.topRows(2).setConstant(T(1e200));
    }
    AttentionOptions o;
    const MatrixR<T> out = exact_output<T>(qb, kb, v, o);
    EXPECT_FALSE(out.row(0).allFinite()) << "an overflowed group was dropped";
    EXPECT_TRUE(out.bottomRows(out.rows() - 2).allFinite());
  }
  // The last 20 rows of a sequence (decoding-like: n_q < n_k, the causal offset).
  const MatrixR<T> qlast = qfull.bottomRows(20);
  AttentionOptions o;
  o.causal = true;
  const MatrixR<T> out = exact_output<T>(qlast, k, v, o);
  const MatrixR<double> p = naive_attention<T>(qlast, k, o.resolved_scale(d), true);
  EXPECT_LT(rel_err(out, (p * v.template cast<double>()).eval()), tol);
}

// exact_matrix forms its logits by blocks in parallel (rows, or columns for few rows); every block a multiple of the
// register tiles, so each entry is summed as in one product of the whole: P is bit for bit the softmax of that one
// product, on shapes that take each path (and leave remainders of every kind).
TYPED_TEST(ExactTest, MaterializedLogitsAreOneProductsBits) {
  using T = TypeParam;
  struct Shape {
    Index nq, nk, d;
  };
  for (const Shape& sh : {Shape{500, 300, 64}, Shape{1001, 37, 16}, Shape{64, 5000, 64}, Shape{13, 9001, 33},
                          Shape{250, 2100, 8}}) {
    const MatrixR<T> q = randn<T>(sh.nq, sh.d, 7), k = randn<T>(sh.nk, sh.d, 8);
    const AttentionOptions o;
    const MatrixR<T> p = exact_matrix<T>(q, k, o);
    MatrixR<T> ref;
    ref.noalias() = q * k.transpose();
    ref *= T(o.resolved_scale(sh.d));
    for (Index i = 0; i < ref.rows(); ++i) {
      ref.row(i) = (ref.row(i).array() - ref.row(i).maxCoeff()).exp();
      ref.row(i) /= ref.row(i).sum();
    }
    EXPECT_TRUE(p == ref) << "nq " << sh.nq << " nk " << sh.nk << " d " << sh.d << ": largest difference "
                          << (p - ref).cwiseAbs().maxCoeff();
  }
}

TYPED_TEST(ExactTest, OperatorReproducesMatrix) {
  using T = TypeParam;
  for (const auto& c : kCases) {
    const auto [q, k, o, p] = case_matrix<T>(c, 6);
    const ExactOperator<T> op(q, k, o, 16);
    // Two float computations of P (the materialized path and the operator's tiles) differ by rounding that grows
    // with the logits' magnitude and depends on the CPU's summation order: the tolerance is the derived worst-case
    // bound (test_util.hpp), never below tol<T>(). At logits ×100 float32 AVX-512 gave 1.5e-5 against 1e-5.
    const MatrixR<double> bound =
        test::softmax_rounding_bound<T>(q.template cast<double>(), k.template cast<double>(), o.scale, c.causal);
    const double t = test::tol_from_bound<T>(bound, p);
    // P·I = P and Pᵀ·I = Pᵀ
    const MatrixR<T> p_from_apply = op.apply(MatrixR<T>::Identity(c.nk, c.nk));
    EXPECT_LT(rel_err(p_from_apply, p), t);
    const MatrixR<T> pt_from_apply = op.apply_transpose(MatrixR<T>::Identity(c.nq, c.nq));
    EXPECT_LT(rel_err(pt_from_apply.transpose(), p), t);
    EXPECT_LT(rel_err(materialize(op), p), t);
    // A block of vectors: Pᵀ X against the product with the matrix.
    const MatrixR<T> x = randn<T>(c.nq, 3, 8);
    // |δ(Pᵀx)| ≤ Bᵀ|x| entrywise (the product's own rounding is below tol<T>() here).
    const MatrixR<T> ptx = p.transpose() * x;
    EXPECT_LT(rel_err(op.apply_transpose(x), ptx),
              test::tol_from_bound<T>((bound.transpose() * x.template cast<double>().cwiseAbs()).eval(), ptx));
    // ℓ_i = log Σ_j exp(s·q_iᵀk_j) over the visible keys.
    const VectorX<T>& lse = op.row_lse();
    for (Index i = 0; i < c.nq; ++i) {
      const Index last = c.causal ? i + c.nk - c.nq : c.nk - 1;
      const VectorX<double> logits =
          (q.row(i).template cast<double>() * k.topRows(last + 1).template cast<double>().transpose()).transpose() *
          o.scale;
      const double mx = logits.maxCoeff();
      const double ref = mx + std::log((logits.array() - mx).exp().sum());
      EXPECT_NEAR(double(lse(i)), ref, 10 * test::tol<T>() * std::max(1.0, std::fabs(ref)));
    }
  }
}

TEST(Exact, RejectsBadShapesAndOptions) {
  const MatrixR<double> q = randn<double>(4, 3, 1), k = randn<double>(5, 3, 2), k2 = randn<double>(5, 4, 3),
                        v = randn<double>(6, 2, 4);
  AttentionOptions o;
  EXPECT_THROW(exact_matrix<double>(q, k2, o), Error);           // d of Q ≠ d of K
  EXPECT_THROW(exact_output<double>(q, k, v, o), Error);         // n_k of K ≠ n_k of V
  EXPECT_THROW(exact_output<double>(q, k, k, o, 0), Error);      // tile 0
  AttentionOptions causal;
  causal.causal = true;
  EXPECT_THROW(exact_matrix<double>(k, q, causal), Error);  // n_q > n_k: queries without keys
  AttentionOptions bad;
  bad.scale = -1;
  EXPECT_THROW(exact_matrix<double>(q, k, bad), Error);
}

}  // namespace
}  // namespace attnlab
