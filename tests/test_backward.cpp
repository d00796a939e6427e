// Exact attention's backward (operators/exact.hpp: exact_backward, Dao 2023 FlashAttention-2 Algorithm 2; the exact
// method's Method::backward) against the closed form on the dense matrices; and the finite-difference checker itself
// (tests/gradient_check.hpp) against a backward with a dropped term, which it must reject.
#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/operators/exact.hpp"
#include "gradient_check.hpp"
#include "test_util.hpp"

#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace attnlab {
namespace {

using test::randn;
using test::rel_err;

/// The closed form, dense, in double: P = softmax(s·QKᵀ + mask), dV = Pᵀ dO, dP = dO Vᵀ,
/// dS = P ∘ (dP − rowsum(P ∘ dP)), dQ = s·dS K, dK = s·dSᵀ Q. `drop_d` drops the rowsum term (a mutation).
Gradients<double> dense_backward(const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v,
                                 const MatrixR<double>& d_out, const AttentionOptions& o, bool drop_d = false) {
  const double s = o.resolved_scale(q.cols());
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  MatrixR<double> p = s * q * k.transpose();
  for (Index i = 0; i < nq; ++i) {
    const Index vis = o.causal ? i + off + 1 : nk;
    const double mx = p.row(i).head(vis).maxCoeff();
    p.row(i).head(vis) = (p.row(i).head(vis).array() - mx).exp();
    p.row(i).tail(nk - vis).setZero();
    p.row(i) /= p.row(i).sum();
  }
  Gradients<double> g;
  g.dv = p.transpose() * d_out;
  const MatrixR<double> dp = d_out * v.transpose();
  const VectorX<double> dsum = (p.array() * dp.array()).rowwise().sum();
  MatrixR<double> ds = p.array() * (dp.array().colwise() - (drop_d ? 0.0 : 1.0) * dsum.array());
  g.dq = s * ds * k;
  g.dk = s * ds.transpose() * q;
  return g;
}

/// The same closed form with P restricted to the band |j − c_i| ≤ w around c_i = i + (n_k − n_q) (causal: j ≤ c_i):
/// local attention's backward, dense.
Gradients<double> dense_band_backward(const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v,
                                      const MatrixR<double>& d_out, Index w, bool causal) {
  const Index nq = q.rows(), nk = k.rows(), off = nk - nq;
  Eigen::Array<bool, -1, -1> band(nq, nk);
  for (Index i = 0; i < nq; ++i)
    for (Index j = 0; j < nk; ++j) band(i, j) = j >= i + off - w && j <= (causal ? i + off : i + off + w);
  return test::masked_backward(q, k, v, d_out, band, 1.0 / std::sqrt(double(q.cols())));
}

/// The backward `run` gives the same bits with one OpenMP thread as with two or more (fixed groups and chunks, summed
/// in a fixed order): gradients that do not depend on the machine's core count.
template <class Run>
void expect_same_bits_on_one_and_two_threads(const Run& run) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run();
  omp_set_num_threads(std::max(2, before));
  const auto many = run();
  omp_set_num_threads(before);
  EXPECT_EQ(one.dq, many.dq);
  EXPECT_EQ(one.dk, many.dk);
  EXPECT_EQ(one.dv, many.dv);
}

struct Case {
  Index nq, nk, d, dv;
  bool causal;
  Index tile;
};

TEST(ExactBackward, EqualsTheClosedForm) {
  for (const Case c : {Case{70, 70, 16, 5, false, 256}, Case{70, 70, 16, 5, true, 256}, Case{37, 83, 9, 4, true, 8},
                       Case{41, 29, 7, 6, false, 8}, Case{64, 64, 8, 8, true, 16}}) {
    SCOPED_TRACE(::testing::Message() << c.nq << "×" << c.nk << " d=" << c.d << " causal=" << c.causal
                                      << " tile=" << c.tile);
    const MatrixR<double> q = randn<double>(c.nq, c.d, 1), k = randn<double>(c.nk, c.d, 2),
                          v = randn<double>(c.nk, c.dv, 3), d_out = randn<double>(c.nq, c.dv, 4);
    AttentionOptions o;
    o.causal = c.causal;
    const Gradients<double> want = dense_backward(q, k, v, d_out, o);
    VectorX<double> lse;
    const MatrixR<double> out = exact_output<double>(q, k, v, o, c.tile, {}, &lse);
    EXPECT_LT((lse - exact_row_lse<double>(q, k, o, c.tile)).cwiseAbs().maxCoeff(), 1e-13);
    const Gradients<double> got = exact_backward<double>(q, k, v, out, lse, d_out, o, c.tile);
    EXPECT_LT(rel_err(got.dq, want.dq), 1e-12);
    EXPECT_LT(rel_err(got.dk, want.dk), 1e-12);
    EXPECT_LT(rel_err(got.dv, want.dv), 1e-12);
    // The method: both output paths, and a tile of 8 (70 = 8·8 + 6: a partial tile).
    for (const char* spec : {"exact", "exact:impl=materialized", "exact:tile=8"}) {
      auto m = make_method<double>(spec);
      m->compute(q, k, o);
      const Gradients<double> g = m->backward(v, d_out);
      EXPECT_LT(rel_err(g.dq, want.dq), 1e-12) << spec;
      EXPECT_LT(rel_err(g.dk, want.dk), 1e-12) << spec;
      EXPECT_LT(rel_err(g.dv, want.dv), 1e-12) << spec;
    }
  }
}

TEST(ExactBackward, SubsetOfQueriesKeepsTheirCausalPositions) {
  // Rows of Q at positions 3, 10, 11, 40 of 50: masked as those positions (QueryLayout), as ProbSparse's exact rows.
  const MatrixR<double> qf = randn<double>(50, 8, 5), k = randn<double>(50, 8, 6), v = randn<double>(50, 3, 7);
  const std::vector<Index> pos = {3, 10, 11, 40};
  MatrixR<double> q(4, 8);
  for (Index r = 0; r < 4; ++r) q.row(r) = qf.row(pos[std::size_t(r)]);
  const MatrixR<double> d_out = randn<double>(4, 3, 8);
  AttentionOptions o;
  o.causal = true;
  const QueryLayout layout{pos, 50};
  VectorX<double> lse;
  const MatrixR<double> out = exact_output<double>(q, k, v, o, 8, layout, &lse);
  const Gradients<double> got = exact_backward<double>(q, k, v, out, lse, d_out, o, 8, layout);
  // Dense: the full problem with dO zero outside the chosen rows.
  MatrixR<double> d_full = MatrixR<double>::Zero(50, 3);
  for (Index r = 0; r < 4; ++r) d_full.row(pos[std::size_t(r)]) = d_out.row(r);
  const Gradients<double> want = dense_backward(qf, k, v, d_full, o);
  MatrixR<double> want_dq(4, 8);
  for (Index r = 0; r < 4; ++r) want_dq.row(r) = want.dq.row(pos[std::size_t(r)]);
  EXPECT_LT(rel_err(got.dq, want_dq), 1e-12);
  EXPECT_LT(rel_err(got.dk, want.dk), 1e-12);
  EXPECT_LT(rel_err(got.dv, want.dv), 1e-12);
}

TEST(ExactBackward, DoesNotDependOnTheThreadCount) {
  // Key tiles in fixed groups with their dQ summed in group order: one thread or many, the same bits.
  const MatrixR<float> q = randn<float>(300, 16, 1), k = randn<float>(300, 16, 2), v = randn<float>(300, 8, 3),
                       d_out = randn<float>(300, 8, 4);
  AttentionOptions o;
  o.causal = true;
  VectorX<float> lse;
  const MatrixR<float> out = exact_output<float>(q, k, v, o, 32, {}, &lse);
  expect_same_bits_on_one_and_two_threads([&] { return exact_backward<float>(q, k, v, out, lse, d_out, o, 32); });
}

TEST(ExactBackward, MethodReusesItsForwardOnlyForTheSameQKV) {
  // The streaming method keeps the last output()'s O and ℓ for its backward: after new Q, K (compute) or another V
  // the backward must be that of the new problem, bit for bit what a fresh method gives.
  const MatrixR<double> q1 = randn<double>(70, 8, 1), k1 = randn<double>(90, 8, 2), v1 = randn<double>(90, 5, 3);
  const MatrixR<double> q2 = randn<double>(70, 8, 4), k2 = randn<double>(90, 8, 5), v2 = randn<double>(90, 5, 6);
  const MatrixR<double> d_out = randn<double>(70, 5, 7);
  auto fresh = [&](const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v) {
    auto m = make_method<double>("exact:tile=32");
    m->compute(q, k);
    return m->backward(v, d_out);
  };
  auto m = make_method<double>("exact:tile=32");
  m->compute(q1, k1);
  m->output(v1);
  const Gradients<double> same = m->backward(v1, d_out);
  const Gradients<double> want11 = fresh(q1, k1, v1);
  EXPECT_EQ(same.dq, want11.dq);
  EXPECT_EQ(same.dk, want11.dk);
  EXPECT_EQ(same.dv, want11.dv);
  const Gradients<double> other_v = m->backward(v2, d_out);  // O and ℓ of v1 must not be used
  EXPECT_EQ(other_v.dq, fresh(q1, k1, v2).dq);
  m->compute(q2, k2);  // a new problem: the kept forward is stale
  const Gradients<double> after = m->backward(v2, d_out), want22 = fresh(q2, k2, v2);
  EXPECT_EQ(after.dq, want22.dq);
  EXPECT_EQ(after.dk, want22.dk);
  const Gradients<double> dense = dense_backward(q2, k2, v2, d_out, AttentionOptions{});
  EXPECT_LT(rel_err(after.dq, dense.dq), 1e-12);
}

TEST(LocalBackward, EqualsTheBandClosedFormAndIgnoresThreads) {
  // local's blocked backward (blocks of 64 queries, passes of disjoint key spans) against the dense band form, across
  // windows narrower and wider than a block, lengths that are not multiples of it, n_k > n_q, causal or not.
  struct C {
    Index nq, nk, w;
    bool causal;
  };
  for (const C c : {C{200, 200, 5, false}, C{200, 200, 5, true}, C{130, 190, 70, false}, C{130, 190, 70, true},
                    C{64, 64, 0, false}, C{100, 100, 500, false}, C{300, 300, 64, true}}) {
    const MatrixR<double> q = randn<double>(c.nq, 8, 1), k = randn<double>(c.nk, 8, 2), v = randn<double>(c.nk, 5, 3),
                          d_out = randn<double>(c.nq, 5, 4);
    auto m = make_method<double>("local:window=" + std::to_string(c.w));
    AttentionOptions o;
    o.causal = c.causal;
    m->compute(q, k, o);
    const Gradients<double> got = m->backward(v, d_out), want = dense_band_backward(q, k, v, d_out, c.w, c.causal);
    SCOPED_TRACE(::testing::Message() << c.nq << "×" << c.nk << " w=" << c.w << " causal=" << c.causal);
    // Relative to the gradient's size, or to 1 where it is exactly 0 (w = 0: one key per query, no logit gradient).
    for (const auto& [a, b] : {std::pair{&got.dq, &want.dq}, {&got.dk, &want.dk}, {&got.dv, &want.dv}})
      EXPECT_LE((a->cast<double>() - *b).norm(), 1e-12 * std::max(1.0, b->norm()));
  }
  const MatrixR<float> q = randn<float>(700, 16, 1), k = randn<float>(700, 16, 2), v = randn<float>(700, 8, 3),
                       d_out = randn<float>(700, 8, 4);
  auto m = make_method<float>("local:window=40");
  m->compute(q, k);
  expect_same_bits_on_one_and_two_threads([&] { return m->backward(v, d_out); });
}

TEST(KernelBackward, ManyChunksAgreeWithFiniteDifferencesAndIgnoreThreads) {
  // The kernel methods' backward runs in fixed row chunks (512 rows) and, when causal, fixed segments summed in a fixed
  // order: lengths over several chunks (and n_k ≠ n_q) against central differences of the forward, float64, and the
  // same bits with one thread or two, float32.
  for (const std::string spec : {"linear", "performer:features=32", "taylor"}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(spec + (causal ? " causal" : ""));
      AttentionOptions o;
      o.causal = causal;
      const Index nq = 1300, nk = causal ? 1300 : 1700;
      const MatrixR<double> q = randn<double>(nq, 8, 1) * 0.5, k = randn<double>(nk, 8, 2) * 0.5,
                            v = randn<double>(nk, 4, 3), d_out = randn<double>(nq, 4, 4);
      auto m = make_method<double>(spec);
      m->compute(q, k, o);
      m->output(v);
      const Gradients<double> g = m->backward(v, d_out);
      const auto fd = test::check_gradients(test::method_forward([&] { return make_method<double>(spec); }, o), q, k,
                                            v, d_out, g, 2);
      EXPECT_LT(fd.worst, 1e-6) << fd.where;
      const MatrixR<float> qf = q.cast<float>(), kf = k.cast<float>(), vf = v.cast<float>(), df = d_out.cast<float>();
      auto mf = make_method<float>(spec);
      mf->compute(qf, kf, o);
      mf->output(vf);
      expect_same_bits_on_one_and_two_threads([&] { return mf->backward(vf, df); });
    }
  }
}

TEST(ExactBackward, RefusesMismatchedShapes) {
  const MatrixR<double> q = randn<double>(10, 4, 1), k = randn<double>(12, 4, 2), v = randn<double>(12, 3, 3);
  auto m = make_method<double>("exact");
  EXPECT_THROW(m->backward(v, randn<double>(10, 3, 4)), Error) << "before compute()";
  m->compute(q, k);
  EXPECT_THROW(m->backward(v, randn<double>(10, 2, 4)), Error) << "dO with the wrong width";
  EXPECT_THROW(m->backward(v, randn<double>(9, 3, 4)), Error) << "dO with the wrong height";
  EXPECT_THROW(m->backward(randn<double>(11, 3, 3), randn<double>(10, 3, 4)), Error) << "V with the wrong height";
  MatrixR<double> bad = randn<double>(10, 3, 4);
  bad(2, 1) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(m->backward(v, bad), Error) << "a NaN in dO";
}

TEST(GradientCheck, RejectsABackwardWithADroppedTerm) {
  // The checker the conformance test runs on every method: the exact backward passes it, the same backward without
  // the rowsum term D_i (a plausible slip) fails it by orders of magnitude.
  const MatrixR<double> q = randn<double>(40, 8, 1), k = randn<double>(40, 8, 2), v = randn<double>(40, 5, 3),
                        d_out = randn<double>(40, 5, 4);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const auto f = test::method_forward([] { return make_method<double>("exact"); }, o);
    const auto good = test::check_gradients(f, q, k, v, d_out, dense_backward(q, k, v, d_out, o));
    const auto bad = test::check_gradients(f, q, k, v, d_out, dense_backward(q, k, v, d_out, o, true));
    EXPECT_LT(good.worst, 1e-6);
    EXPECT_GT(bad.worst, 1e-2) << "a dropped term must fail the finite-difference check";
    // dV does not involve the dropped term: the failure is named in dQ or dK.
    EXPECT_NE(bad.where, "dV");
  }
}

}  // namespace
}  // namespace attnlab
