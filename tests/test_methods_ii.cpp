// Methods II: Transformer-VQ, ProbSparse, sparse patterns, Reformer and Scatterbrain against independent
// formulas and their exact limits.
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/components/kmeans.hpp"
#include "attnlab/components/random_features.hpp"
#include "attnlab/components/sparsity_measure.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/components/codebook_attention.hpp"
#include "attnlab/io/npy.hpp"
#include "attnlab/methods/vq.hpp"
#include "gradient_check.hpp"
#include "test_util.hpp"

#include <Eigen/SVD>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <tuple>

namespace attnlab {
namespace {

using test::randn;
using test::rel_err;

struct Problem {
  MatrixR<double> q, k, v;
};
Problem problem(Index nq, Index nk, Index d, std::uint64_t seed) {
  return {randn<double>(nq, d, seed), randn<double>(nk, d, seed + 1), randn<double>(nk, 6, seed + 2)};
}

/// The method reproduces exact attention (matrix and output), float64.
void expect_exact(const std::string& spec, const Problem& pr, bool causal, double tol = 1e-10) {
  AttentionOptions o;
  o.causal = causal;
  auto m = make_method<double>(spec);
  m->compute(pr.q, pr.k, o);
  const MatrixR<double> p = exact_matrix<double>(pr.q, pr.k, o);
  EXPECT_LT(rel_err(m->matrix(), p), tol) << spec << " causal=" << causal;
  EXPECT_LT(rel_err(m->output(pr.v), (p * pr.v).eval()), tol) << spec << " causal=" << causal;
}

TEST(MethodsII, ExactLimits) {
  for (auto [nq, nk] : {std::pair<Index, Index>{50, 50}, std::pair<Index, Index>{40, 61}}) {
    const Problem pr = problem(nq, nk, 8, 1);
    const std::string n = std::to_string(std::max(nq, nk));
    for (bool causal : {false, true}) {
      expect_exact("vq:codes=" + std::to_string(nk), pr, causal);  // every key its own code
      expect_exact("probsparse:factor=100", pr, causal);              // u ≥ n: every query exact
      expect_exact("probsparse:factor=100,measure=lse,lazy=cumsum", pr, causal);
      expect_exact("local:window=" + n, pr, causal);
      expect_exact("sparse:window=" + n + ",stride=0,globals=0,random=0", pr, causal);
      expect_exact("sparse:window=-1,stride=1,globals=0,random=0", pr, causal);
      expect_exact("sparse:window=-1,stride=0,globals=0,random=" + n, pr, causal);
    }
    expect_exact("sparse:window=-1,stride=0,globals=" + n + ",random=0", pr, false);
    expect_exact("reformer:buckets=1,rounds=1,chunk=" + n, pr, false);
    expect_exact("reformer:buckets=1,rounds=1,chunk=" + n, pr, true);
    expect_exact("scatterbrain:window=" + n, pr, false);
  }
  // Quantizing both with a code per key: r_j = 0, so the mean-field logits are s·q_i·k_j whatever Q's codebook.
  const Problem pr = problem(40, 40, 8, 3);
  expect_exact("vq:codes=40,quantize=both", pr, false, 1e-9);
}

// The mean-field form of quantizing both (attnlab's variant, not in Lingle 2023) against its formula computed
// independently in double from the same codebooks: P̃_ij = softmax_j(s·(q_i·c_a(j) + c'_b(i)·r_j)),
// r_j = k_j − c_a(j). In float32 at logits ×100 (the reproduction: n = 80, d = 16, 16 codes) the output must
// stay finite and within the rounding bound; before the log-domain form it overflowed to non-finite values there.
template <typename T>
void check_mean_field(double logit_mult) {
  const Index n = 80, d = 16, codes = 16;
  const MatrixR<T> q = randn<T>(n, d, 6), k = randn<T>(n, d, 7), v = randn<T>(n, 4, 8);
  AttentionOptions o;
  o.scale = logit_mult / std::sqrt(double(d));
  auto m = make_method<T>("vq:quantize=both,codes=16,iters=10,seed=3");
  m->compute(q, k, o);
  Rng rng(3);
  const KMeansResult<T> kk = kmeans<T>(k, codes, 10, rng), kq = kmeans<T>(q, codes, 10, rng);
  MatrixR<double> a(n, 2 * d), b(n, 2 * d);  // ℓ_ij = s·a_i·b_j with a_i = [q_i, c'_b(i)], b_j = [c_a(j), r_j]
  for (Index i = 0; i < n; ++i) {
    a.row(i) << q.row(i).template cast<double>(),
        kq.centroids.row(kq.assignment[std::size_t(i)]).template cast<double>();
    const auto c = kk.centroids.row(kk.assignment[std::size_t(i)]);
    const Eigen::Matrix<T, 1, Eigen::Dynamic> r = k.row(i) - c;  // rounded once, as the method does
    b.row(i) << c.template cast<double>(), r.template cast<double>();
  }
  MatrixR<double> p = o.scale * a * b.transpose();
  for (Index i = 0; i < n; ++i) {
    p.row(i).array() -= p.row(i).maxCoeff();
    p.row(i) = p.row(i).array().exp().matrix();
    p.row(i) /= p.row(i).sum();
  }
  const MatrixR<T> got = m->matrix(), out = m->output(v);
  ASSERT_TRUE(got.allFinite() && out.allFinite()) << "logits ×" << logit_mult;
  // The bound of test_util.hpp (logits of length 2d), plus the log-domain form's own roundings: the exponents
  // λ_iy + m_by − L_i and g_bj − m_by add u·(|λ| + 2|m| + |g| + |L|) ≤ u·4·|s|·Σ|a||b| + u|L| per entry.
  MatrixR<double> bound = test::softmax_rounding_bound<T>(a, b, o.scale, false);
  const double u = std::numeric_limits<T>::epsilon() / 2;
  bound += (4 * u * std::fabs(o.scale) * (a.cwiseAbs() * b.cwiseAbs().transpose())).cwiseProduct(p);
  EXPECT_LT(rel_err(got, p), test::tol_from_bound<T>(bound, p)) << "logits ×" << logit_mult;
  const MatrixR<double> pv = p * v.template cast<double>();
  EXPECT_LT(rel_err(out, pv), test::tol_from_bound<T>((bound * v.template cast<double>().cwiseAbs()).eval(), pv));
  for (Index i = 0; i < n; ++i) EXPECT_NEAR(double(got.row(i).sum()), 1.0, 10 * double(n) * u);  // γ_n-sized
}

// Angular LSH needs an even number of buckets (argmax over [xW; −xW]); both forms refuse an odd one.
TEST(MethodsII, ReformerRefusesOddBuckets) {
  const Problem pr = problem(32, 32, 8, 4);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    auto m = make_method<double>("reformer:buckets=3");
    EXPECT_THROW(
        {
          m->compute(pr.q, pr.k, o);
          m->output(pr.v);
        },
        Error)
        << "causal=" << causal;
  }
}

TEST(MethodsII, VqQuantizeBothMeanField) {
  for (double mult : {1.0, 100.0}) {
    check_mean_field<double>(mult);
    check_mean_field<float>(mult);
  }
}

// The VQ identity (Lingle 2023, the VQ-attention factorization of its Fig. 2): hard VQ's fast output is exact
// attention on K̂ = ΔC.
TEST(MethodsII, VqIdentityAndSoftLimit) {
  const Problem pr = problem(80, 80, 8, 2);
  Rng rng(7);  // the method's seed=7 replays the same k-means
  const KMeansResult<double> km = kmeans<double>(pr.k, 12, 20, rng);
  MatrixR<double> khat(80, 8);
  for (Index j = 0; j < 80; ++j) khat.row(j) = km.centroids.row(km.assignment[std::size_t(j)]);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    auto m = make_method<double>("vq:codes=12,seed=7");
    m->compute(pr.q, pr.k, o);
    EXPECT_LT(rel_err(m->output(pr.v), exact_output<double>(pr.q, khat, pr.v, o)), 1e-6) << causal;
    EXPECT_LT(rel_err(m->matrix(), exact_matrix<double>(pr.q, khat, o)), 1e-12) << causal;
  }
  // Soft assignment → hard as T → 0, monotonically over these temperatures.
  auto hard = make_method<double>("vq:codes=12,seed=7");
  hard->compute(pr.q, pr.k);
  const MatrixR<double> oh = hard->output(pr.v);
  double prev = 1e300;
  for (double t : {10.0, 1.0, 0.1, 0.01, 1e-4}) {
    auto soft = make_method<double>("vq:codes=12,seed=7,assign=soft,temperature=" + std::to_string(t));
    soft->compute(pr.q, pr.k);
    const double e = rel_err(soft->output(pr.v), oh);
    EXPECT_LT(e, prev) << "T = " << t;
    prev = e;
  }
  EXPECT_LT(prev, 1e-10);
}

// With a given codebook VQ attention is strictly causal: future keys and values do not move past outputs.
TEST(MethodsII, VqWithFixedCodebookIsCausal) {
  const Problem pr = problem(60, 60, 8, 3);
  const MatrixR<double> codebook = randn<double>(10, 8, 30);
  AttentionOptions o;
  o.causal = true;
  const auto a = codebook_attention<double>(pr.q, pr.k, codebook, o);
  MatrixR<double> k2 = pr.k, v2 = pr.v;
  k2.bottomRows(30) = randn<double>(30, 8, 31) * 3.0;
  v2.bottomRows(30) = randn<double>(30, 6, 32);
  const auto b = codebook_attention<double>(pr.q, k2, codebook, o);
  EXPECT_EQ(a->apply(pr.v).topRows(30), b->apply(v2).topRows(30));  // bitwise
}

// ---- vq with a fixed codebook (codebook=PATH.npy): fitted on other windows, held as a trained Transformer-VQ
// holds it.

/// A file of this test process under the test temp directory (the float32 and float64 suites may run at once).
std::string temp_npy(const std::string& stem) {
  return ::testing::TempDir() + "attnlab_" + stem + "_" + std::to_string(::getpid()) + ".npy";
}

/// K̂: each key replaced by its nearest code, by brute force (not components/kmeans.hpp's nearest()).
MatrixR<double> nearest_codes(const MatrixR<double>& k, const MatrixR<double>& c) {
  MatrixR<double> khat(k.rows(), k.cols());
  for (Index j = 0; j < k.rows(); ++j) {
    Index best = 0;
    for (Index y = 1; y < c.rows(); ++y)
      if ((k.row(j) - c.row(y)).squaredNorm() < (k.row(j) - c.row(best)).squaredNorm()) best = y;
    khat.row(j) = c.row(best);
  }
  return khat;
}

/// Causal softmax attention written out row by row (n_q = n_k): O_i = Σ_{j ≤ i} softmax_j(s·q_i·k_j) v_j.
MatrixR<double> causal_attention(const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v) {
  const double s = 1.0 / std::sqrt(double(q.cols()));
  MatrixR<double> out = MatrixR<double>::Zero(q.rows(), v.cols());
  for (Index i = 0; i < q.rows(); ++i) {
    VectorX<double> l(i + 1);
    for (Index j = 0; j <= i; ++j) l(j) = s * q.row(i).dot(k.row(j));
    const VectorX<double> e = (l.array() - l.maxCoeff()).exp();
    for (Index j = 0; j <= i; ++j) out.row(i) += e(j) / e.sum() * v.row(j);
  }
  return out;
}

/// The largest change of an output row i < t when the keys and values at positions ≥ t are redrawn, over t.
double future_leak(const std::string& spec, const MatrixR<double>& q, const MatrixR<double>& k,
                   const MatrixR<double>& v) {
  AttentionOptions o;
  o.causal = true;
  auto m = make_method<double>(spec);
  m->compute(q, k, o);
  const MatrixR<double> out = m->output(v);
  double worst = 0;
  for (Index t : {Index(16), Index(48), Index(96), Index(144), Index(176)}) {
    MatrixR<double> k2 = k, v2 = v;
    k2.bottomRows(k.rows() - t) = randn<double>(k.rows() - t, k.cols(), 100 + std::uint64_t(t)) * 3.0;
    v2.bottomRows(v.rows() - t) = randn<double>(v.rows() - t, v.cols(), 200 + std::uint64_t(t)) * 3.0;
    auto m2 = make_method<double>(spec);
    m2->compute(q, k2, o);
    worst = std::max(worst, (m2->output(v2).topRows(t) - out.topRows(t)).cwiseAbs().maxCoeff());
  }
  return worst;
}

// The measurement (n = 192, d = 16): with codebook=window the k-means sees the future keys and earlier
// outputs move; with a codebook fitted on other windows (the training windows) and held, no output before t moves
// when anything at or after t changes, and the output is exact causal attention on the keys' nearest codes.
TEST(MethodsII, VqFixedCodebookLeaksNothing) {
  const Index n = 192, d = 16, codes = 32;
  const MatrixR<double> train = randn<double>(4 * n, d, 40);  // four other windows' keys, stacked
  const MatrixR<double> c = vq_fit_codebook<double>(train, codes, 20, 0).centroids;
  const std::string path = temp_npy("vq_leak");
  write_npy<double>(path, c);
  const std::string fixed = "vq:codes=32,codebook=" + path, window = "vq:codes=32";
  const MatrixR<double> q = randn<double>(n, d, 41), k = randn<double>(n, d, 42), v = randn<double>(n, 8, 43);
  EXPECT_TRUE(make_method<double>(fixed)->lookahead().empty());
  EXPECT_FALSE(make_method<double>(window)->lookahead().empty());
  EXPECT_TRUE(make_method<double>(fixed)->supports_causal());
  EXPECT_TRUE(make_method<double>(window)->supports_causal());  // accepted, its look-ahead stated
  const double leak_fixed = future_leak(fixed, q, k, v), leak_window = future_leak(window, q, k, v);
  std::printf("[ vq leak ] n = %lld, d = %lld, %lld codes: max |ΔO_i| (i < t, keys/values ≥ t redrawn): "
              "codebook=window %.3g, codebook=PATH.npy %.3g\n", (long long)n, (long long)d, (long long)codes,
              leak_window, leak_fixed);
  EXPECT_EQ(leak_fixed, 0.0) << "an output moved when later keys or values changed";
  EXPECT_GT(leak_window, 1e-3) << "the window form was expected to look ahead";
  // Against an independent recomputation: exact causal attention on K̂ (brute-force nearest codes).
  AttentionOptions o;
  o.causal = true;
  auto m = make_method<double>(fixed);
  m->compute(q, k, o);
  const MatrixR<double> want = causal_attention(q, nearest_codes(k, c), v);
  const double err = (m->output(v) - want).cwiseAbs().maxCoeff() / want.cwiseAbs().maxCoeff();
  EXPECT_LT(err, 1e-13);
  std::printf("[ vq leak ] fixed codebook vs exact causal attention on the nearest codes: max rel %.3g\n", err);
  const MatrixR<double> khat = nearest_codes(k, c);
  EXPECT_LT(rel_err(m->matrix(), exact_matrix<double>(q, khat, o)), 1e-13);
  // Its inertia is the keys' quantization error against the given codes; no Lloyd iteration ran.
  const auto diag = m->diagnostics();
  EXPECT_NEAR(diag.at(0).second, (k - khat).squaredNorm(), 1e-9 * (k - khat).squaredNorm());
  EXPECT_EQ(diag.at(1).second, 0.0);
  std::remove(path.c_str());
}

// A codebook fitted by vq_fit_codebook on the keys of the call, given as a file, is the window form replayed: the
// same outputs bit for bit, float32 (a float32 file) and float64, with and without the mask.
TEST(MethodsII, VqFixedCodebookReplaysTheWindowFit) {
  const Problem pr = problem(70, 90, 8, 44);
  const auto check = [&](auto tag) {
    using T = decltype(tag);
    const MatrixR<T> q = pr.q.cast<T>(), k = pr.k.cast<T>(), v = pr.v.cast<T>();
    const std::string path = temp_npy(sizeof(T) == 4 ? "vq_replay32" : "vq_replay64");
    write_npy<T>(path, vq_fit_codebook<T>(k, 12, 20, 7).centroids);
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      auto a = make_method<T>("vq:codes=12,seed=7");
      auto b = make_method<T>("vq:codes=12,codebook=" + path);
      a->compute(q, k, o);
      b->compute(q, k, o);
      EXPECT_EQ(a->output(v), b->output(v)) << sizeof(T) << " causal=" << causal;
    }
    std::remove(path.c_str());
  };
  check(float{});
  check(double{});
}

TEST(MethodsII, VqFixedCodebookChecks) {
  const MatrixR<double> c = randn<double>(32, 16, 45);
  const std::string path = temp_npy("vq_checks"), cube = temp_npy("vq_checks_cube");
  write_npy<double>(path, c);
  const auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  // The spec: a keyword or a .npy path, written back as given.
  EXPECT_NE(message([] { make_method<double>("vq:codebook=cb.txt"); }).find("window or the path of a .npy file"),
            std::string::npos);
  const auto m = make_method<double>("vq:codes=32,codebook=" + path);
  EXPECT_NE(m->spec().find(",codebook=" + path + ","), std::string::npos) << m->spec();
  EXPECT_EQ(VqOptions::from(m->params()).codebook, path);
  EXPECT_EQ(VqOptions::from(m->params()).spec(), m->spec());
  VqOptions bad;
  bad.codebook = "a,b.npy";  // a spec could not hold it
  EXPECT_THROW(VqMethod<double>{bad}, Error);
  // Before any data: the codes, the variants, the file.
  EXPECT_NE(message([&] { make_method<double>("vq:codebook=" + path); }).find("holds 32 codes, but codes = 64"),
            std::string::npos);
  EXPECT_NE(message([&] { make_method<double>("vq:codes=32,assign=soft,codebook=" + path); }).find("assign=hard"),
            std::string::npos);
  EXPECT_NE(message([&] { make_method<double>("vq:codes=32,quantize=both,codebook=" + path); }).find("assign=hard"),
            std::string::npos);
  const std::string missing = temp_npy("vq_checks_missing");
  EXPECT_NE(message([&] { make_method<double>("vq:codes=32,codebook=" + missing); }).find(missing),
            std::string::npos);
  write_npy<double>(cube, MatrixR<double>(randn<double>(64, 16, 46)).data(), {2, 32, 16});
  EXPECT_NE(message([&] { make_method<double>("vq:codes=32,codebook=" + cube); }).find("(codes, d) array"),
            std::string::npos);
  // The keys' dimension: refused by the size check (before work) and by compute().
  EXPECT_NE(message([&] { check_method_fits<double>(*m, {50, 50, 8, 8, 8}); }).find("has d = 16, but the keys"),
            std::string::npos);
  EXPECT_THROW(m->compute(randn<double>(50, 8, 1), randn<double>(50, 8, 2)), Error);
  // No k-means on the keys: more codes than keys is fine.
  EXPECT_NO_THROW(check_method_fits<double>(*m, {20, 20, 16, 4, 8}));
  AttentionOptions o;
  o.causal = true;
  m->compute(randn<double>(20, 16, 3), randn<double>(20, 16, 4), o);
  EXPECT_TRUE(m->output(randn<double>(20, 4, 5)).allFinite());
  // A rewritten file is read again (the cache is keyed by size and modification time too).
  const MatrixR<double> q = randn<double>(30, 16, 6), k = randn<double>(30, 16, 7), v = randn<double>(30, 4, 8);
  m->compute(q, k);
  const MatrixR<double> before = m->output(v);
  write_npy<double>(path, MatrixR<double>(c * 2.0));
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(2));
  auto m2 = make_method<double>("vq:codes=32,codebook=" + path);
  m2->compute(q, k);
  const MatrixR<double> khat = nearest_codes(k, c * 2.0);
  EXPECT_LT(rel_err(m2->output(v), exact_output<double>(q, khat, v, {})), 1e-12);
  EXPECT_GT(rel_err(m2->output(v), before), 1e-3);
  std::remove(path.c_str());
  std::remove(cube.c_str());
}

TEST(MethodsII, ProbSparseMeasuresAndLemma1) {
  const Problem pr = problem(90, 120, 16, 4);
  Rng rng(1);
  const VectorX<double> mbar = sparsity_measure<double>(pr.q, pr.k, {}, SparsityMeasure::MaxMean, 0, rng);
  const VectorX<double> m = sparsity_measure<double>(pr.q, pr.k, {}, SparsityMeasure::Lse, 0, rng);
  const double s = 0.25;
  for (Index i = 0; i < 90; ++i) {
    // Independent M̄: max − mean of the logits of query i over all keys.
    const VectorX<double> l = pr.k * pr.q.row(i).transpose() * s;
    EXPECT_NEAR(mbar(i), l.maxCoeff() - l.mean(), 1e-12);
    // Lemma 1 (Zhou et al. 2021): M̄ ≤ M ≤ M̄ + ln n_k.
    EXPECT_LE(mbar(i), m(i) + 1e-12);
    EXPECT_LE(m(i), mbar(i) + std::log(120.0) + 1e-12);
  }
  // The top-u rule: u = c·⌈ln n_q⌉ = 3·5 = 15 queries with the largest M̄.
  ASSERT_EQ(probsparse_u(90, 3), 15);
  std::vector<Index> order(90);
  std::iota(order.begin(), order.end(), Index(0));
  std::sort(order.begin(), order.end(), [&](Index a, Index b) { return mbar(a) > mbar(b); });
  std::vector<Index> top(order.begin(), order.begin() + 15);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(select_queries(mbar, 15, false), top);
  // The method with sample=full: exactly those rows exact, the rest uniform.
  auto method = make_method<double>("probsparse:factor=3,sample=full");
  method->compute(pr.q, pr.k);
  const MatrixR<double> p = method->matrix(), pe = exact_matrix<double>(pr.q, pr.k, {});
  for (Index i = 0; i < 90; ++i) {
    if (std::binary_search(top.begin(), top.end(), i))
      EXPECT_LT(rel_err(p.row(i), pe.row(i)), 1e-12) << i;
    else
      EXPECT_LT((p.row(i).array() - 1.0 / 120).abs().maxCoeff(), 1e-15) << i;
  }
  // Sampled M̄ (U = 5·⌈ln 120⌉ = 25 keys): a sample's max never exceeds the full max... over the same mean; at
  // least it stays a lower bound of M + its sampling gap, and the default sampling is reproducible.
  Rng r1(9), r2(9);
  EXPECT_EQ(sparsity_measure<double>(pr.q, pr.k, {}, SparsityMeasure::MaxMean, 25, r1),
            sparsity_measure<double>(pr.q, pr.k, {}, SparsityMeasure::MaxMean, 25, r2));
}

TEST(MethodsII, ProbSparseCausalSelectionIsOnline) {
  VectorX<double> m(8);
  m << 5, 1, 6, 0, 7, 2, 8, 3;
  // u = 2: selected when among the 2 largest so far: 0 (5), 1 (1: only 2 seen), 2 (6), 4 (7), 6 (8).
  EXPECT_EQ(select_queries(m, 2, true), (std::vector<Index>{0, 1, 2, 4, 6}));
  EXPECT_EQ(select_queries(m, 2, false), (std::vector<Index>{4, 6}));
  // Ties go to the earlier query (as a stable sort's first u); a NaN measure (logits that overflowed) ranks last.
  VectorX<double> ties = VectorX<double>::Constant(9, 1.0);
  EXPECT_EQ(select_queries(ties, 4, false), (std::vector<Index>{0, 1, 2, 3}));
  ties(0) = std::numeric_limits<double>::quiet_NaN();
  ties(5) = 2;
  EXPECT_EQ(select_queries(ties, 3, false), (std::vector<Index>{1, 2, 5}));
}

// Scatterbrain: Ã equals exp(s·qᵀk) on the band, so P̃ is proportional to P there row by row; off the band P̃ is the
// normalized Performer estimate, whose matrix has rank ≤ M.
TEST(MethodsII, ScatterbrainSupportAndRank) {
  const Index n = 70, d = 8, m = 12, w = 3;
  const Problem pr = problem(n, n, d, 5);
  auto sb = make_method<double>("scatterbrain:features=12,window=3,seed=4");
  sb->compute(pr.q, pr.k);
  const MatrixR<double> p = sb->matrix(), pe = exact_matrix<double>(pr.q, pr.k, {});
  // The Performer part, regenerated from the same seed: φ(x) = exp(ωᵀx − ‖x‖²/2)/√M.
  Rng rng(4);
  const MatrixR<double> omega = performer_projection<double>(m, d, true, true, rng);
  const double root = std::pow(1.0 / std::sqrt(double(d)), 0.5);
  const auto phi = [&](const MatrixR<double>& x) {
    MatrixR<double> f = ((x * root) * omega.transpose());
    for (Index i = 0; i < x.rows(); ++i)
      f.row(i) = (f.row(i).array() - (x.row(i) * root).squaredNorm() / 2).exp() / std::sqrt(double(m));
    return f;
  };
  const MatrixR<double> est = phi(pr.q) * phi(pr.k).transpose();  // ≈ exp(s·QKᵀ), rank ≤ M
  for (Index i = 0; i < n; ++i) {
    const Index lo = std::max<Index>(0, i - w), hi = std::min(n - 1, i + w);
    // Row sum of Ã from its definition: the estimate off the band, the exact value on it.
    double z = 0, exact_row = 0;
    for (Index j = 0; j < n; ++j) {
      const double e = std::exp(pr.q.row(i).dot(pr.k.row(j)) / std::sqrt(double(d)));
      exact_row += e;
      z += (j >= lo && j <= hi) ? e : est(i, j);
    }
    for (Index j = 0; j < n; ++j) {
      const bool on = j >= lo && j <= hi;
      const double ref = (on ? pe(i, j) * exact_row : est(i, j)) / z;
      EXPECT_NEAR(p(i, j), ref, 1e-12 * std::max(1.0, std::fabs(ref))) << i << "," << j;
    }
  }
  // The part of P̃ outside the sparse correction: diag(1/z)·φ(Q)φ(K)ᵀ has rank ≤ M.
  const Eigen::MatrixXd estd = est;
  const Eigen::JacobiSVD<Eigen::MatrixXd> svd(estd);
  EXPECT_LT(svd.singularValues()(m), 1e-10 * svd.singularValues()(0));
}

TEST(MethodsII, PatternsAreWhatTheyClaim) {
  const Problem pr = problem(40, 40, 8, 6);
  AttentionOptions c;
  c.causal = true;
  auto local = make_method<double>("local:window=3");
  local->compute(pr.q, pr.k, c);
  const MatrixR<double> p = local->matrix();
  for (Index i = 0; i < 40; ++i)
    for (Index j = 0; j < 40; ++j) EXPECT_EQ(p(i, j) != 0, j <= i && j >= i - 3) << i << "," << j;
  // Global tokens: rows and columns 0, 1 are dense; a strided pattern hits (i − j) mod 8 = 0.
  auto sp = make_method<double>("sparse:window=0,stride=8,globals=2,random=0");
  sp->compute(pr.q, pr.k);
  const MatrixR<double> s = sp->matrix();
  for (Index i = 0; i < 40; ++i)
    for (Index j = 0; j < 40; ++j) {
      const bool expected = i < 2 || j < 2 || i == j || (i - j) % 8 == 0;
      EXPECT_EQ(s(i, j) != 0, expected) << i << "," << j;
    }
}

// ---- Backward passes (issue 23), against independent formulas and limits.

void expect_gradients_near(const Gradients<double>& got, const Gradients<double>& want, double tol,
                           const std::string& what) {
  EXPECT_LT(rel_err(got.dq, want.dq), tol) << what << " dQ";
  EXPECT_LT(rel_err(got.dk, want.dk), tol) << what << " dK";
  EXPECT_LT(rel_err(got.dv, want.dv), tol) << what << " dV";
}

/// Exact attention's backward (FlashAttention-2 Alg. 2 in operators/exact.hpp) on (Q, K, V).
Gradients<double> exact_grads(const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v,
                              const MatrixR<double>& d_out, const AttentionOptions& o) {
  VectorX<double> lse;
  const MatrixR<double> out = exact_output<double>(q, k, v, o, kDefaultTile, {}, &lse);
  return exact_backward<double>(q, k, v, out, lse, d_out, o);
}

// Limits: a window covering the sequence is exact attention, and so is ProbSparse with every query selected
// (u = c·⌈ln n_q⌉ ≥ n_q) — their backward passes are exact attention's.
TEST(MethodsIIBackward, ExactLimits) {
  for (auto [nq, nk] : {std::pair<Index, Index>{50, 50}, std::pair<Index, Index>{40, 61}}) {
    const Problem pr = problem(nq, nk, 8, 11);
    const MatrixR<double> d_out = randn<double>(nq, pr.v.cols(), 12);
    const std::string n = std::to_string(std::max(nq, nk));
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      const Gradients<double> want = exact_grads(pr.q, pr.k, pr.v, d_out, o);
      for (const std::string& spec : std::vector<std::string>{"local:window=" + n, "probsparse:factor=100",
                                     "probsparse:factor=100,measure=lse,lazy=cumsum",
                                     "sparse:window=" + n + ",stride=0,globals=0,random=0",
                                     "reformer:buckets=1,rounds=1,chunk=" + n}) {
        auto m = make_method<double>(spec);
        m->compute(pr.q, pr.k, o);
        expect_gradients_near(m->backward(pr.v, d_out), want, 1e-12, spec + (causal ? " causal" : ""));
      }
    }
  }
}

// Sparse patterns and Reformer's LSH buckets: the backward is the masked softmax's on the method's own support
// (the nonzeros of its P̃), computed densely here.
TEST(MethodsIIBackward, PatternsEqualTheMaskedSoftmax) {
  for (auto [nq, nk] : {std::pair<Index, Index>{70, 70}, std::pair<Index, Index>{60, 83}}) {
    const Problem pr = problem(nq, nk, 8, 13);
    const MatrixR<double> d_out = randn<double>(nq, pr.v.cols(), 14);
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      for (const char* spec : {"local:window=3", "sparse:window=3,stride=5,globals=3,random=4",
                               "sparse:window=-1,stride=4,globals=0,random=3", "sparse", "reformer:chunk=8",
                               "reformer:buckets=4,rounds=3,chunk=16"}) {
        auto m = make_method<double>(spec);
        m->compute(pr.q, pr.k, o);
        const Eigen::Array<bool, -1, -1> mask = m->matrix().array() != 0.0;
        ASSERT_LT(mask.count(), nq * nk) << spec << ": the test needs a sparse support";
        expect_gradients_near(m->backward(pr.v, d_out),
                              test::masked_backward(pr.q, pr.k, pr.v, d_out, mask, o.resolved_scale(8)), 1e-12,
                              std::string(spec) + (causal ? " causal" : ""));
      }
    }
  }
}

// ProbSparse with some rows lazy: dV is P̃ᵀ dO with P̃ the method's own matrix (uniform or all-ones lazy rows);
// lazy rows get no dQ; the selected rows' dQ is exact attention's for those rows at their causal positions.
TEST(MethodsIIBackward, ProbSparseLazyRows) {
  const Problem pr = problem(90, 90, 8, 15);
  const MatrixR<double> d_out = randn<double>(90, pr.v.cols(), 16);
  for (const char* spec : {"probsparse:factor=3,sample=full", "probsparse:factor=2,lazy=cumsum"}) {
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      auto m = make_method<double>(spec);
      m->compute(pr.q, pr.k, o);
      const MatrixR<double> p = m->matrix(), pe = exact_matrix<double>(pr.q, pr.k, o);
      const Gradients<double> g = m->backward(pr.v, d_out);
      EXPECT_LT(rel_err(g.dv, (p.transpose() * d_out).eval()), 1e-12) << spec << causal;
      // Selected rows are those equal to exact attention's rows; only they carry dQ and dK.
      const Gradients<double> ge = exact_grads(pr.q, pr.k, pr.v, d_out, o);
      const MatrixR<double> dp = d_out * pr.v.transpose();
      MatrixR<double> ds = MatrixR<double>::Zero(90, 90);
      Index selected = 0;
      for (Index i = 0; i < 90; ++i) {
        const bool exact_row = rel_err(p.row(i), pe.row(i)) < 1e-12;
        if (!exact_row) {
          EXPECT_EQ(g.dq.row(i).cwiseAbs().maxCoeff(), 0.0) << spec << " lazy row " << i;
          continue;
        }
        ++selected;
        EXPECT_LT(rel_err(g.dq.row(i), ge.dq.row(i)), 1e-12) << spec << " row " << i;
        ds.row(i) = pe.row(i).array() * (dp.row(i).array() - pe.row(i).dot(dp.row(i)));
      }
      EXPECT_GT(selected, 0);
      EXPECT_LT(selected, 90);
      EXPECT_LT(rel_err(g.dk, (o.resolved_scale(8) * ds.transpose() * pr.q).eval()), 1e-12) << spec << causal;
    }
  }
}

/// K̂ = ΔC of the vq method with this seed, codes and iterations (the method's k-means replayed).
MatrixR<double> quantized_keys(const MatrixR<double>& k, Index codes, Index iters, std::uint64_t seed) {
  Rng rng(seed);
  const KMeansResult<double> km = kmeans<double>(k, codes, iters, rng);
  MatrixR<double> khat(k.rows(), k.cols());
  for (Index j = 0; j < k.rows(); ++j) khat.row(j) = km.centroids.row(km.assignment[std::size_t(j)]);
  return khat;
}

// Hard VQ: the backward is exact attention's on (Q, K̂, V), and its dK is the straight-through dK̂ (Lingle 2023) —
// checked by central differences of exact attention on (Q, K̂, V) in Q, K̂ and V, and against exact_backward there.
TEST(MethodsIIBackward, VqHardIsExactAttentionOnTheQuantizedKeys) {
  for (auto [nq, nk] : {std::pair<Index, Index>{70, 70}, std::pair<Index, Index>{52, 77}}) {
    const Problem pr = problem(nq, nk, 8, 17);
    const MatrixR<double> d_out = randn<double>(nq, pr.v.cols(), 18);
    const MatrixR<double> khat = quantized_keys(pr.k, 12, 20, 7);
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      auto m = make_method<double>("vq:codes=12,seed=7");
      m->compute(pr.q, pr.k, o);
      const Gradients<double> g = m->backward(pr.v, d_out);
      expect_gradients_near(g, exact_grads(pr.q, khat, pr.v, d_out, o), 1e-11, causal ? "causal" : "");
      const auto exact_forward = [o](const MatrixR<double>& a, const MatrixR<double>& b, const MatrixR<double>& c) {
        return exact_output<double>(a, b, c, o);
      };
      const auto fd = test::check_gradients(exact_forward, pr.q, khat, pr.v, d_out, g);
      EXPECT_LT(fd.worst, 1e-6) << fd.where << " causal=" << causal;
    }
  }
}

// Soft VQ: the responsibilities are differentiated w.r.t. K at the fixed codebook C: central differences of the
// soft forward computed densely here from the replayed C, in Q, K and V. With 60 codes for 69 keys at T = 2 some codes
// hold a mass below 1 (0.7) and, with the queries scaled by 3, dominate queries, where exp(ℓ − L) exceeds 1 (a clamp
// at 1 was 7% off there).
TEST(MethodsIIBackward, VqSoftAtTheFixedCodebook) {
  const Index n = 60, d = 8;
  const Problem pr = problem(n, n + 9, d, 19);
  const MatrixR<double> d_out = randn<double>(n, pr.v.cols(), 20);
  for (const auto& [codes, temp, scale] :
       {std::tuple<Index, double, double>(10, 0.5, 1.0), {10, 2.0, 1.0}, {60, 2.0, 3.0}}) {
    const MatrixR<double> qs = scale * pr.q;
    Rng rng(5);
    const MatrixR<double> c = kmeans<double>(pr.k, codes, 20, rng).centroids;
    const auto soft_forward = [&, temp](const MatrixR<double>& q, const MatrixR<double>& k, const MatrixR<double>& v) {
      MatrixR<double> r(k.rows(), codes);
      for (Index j = 0; j < k.rows(); ++j) {
        for (Index y = 0; y < codes; ++y) r(j, y) = -(k.row(j) - c.row(y)).squaredNorm() / (2 * temp);
        r.row(j) = (r.row(j).array() - r.row(j).maxCoeff()).exp().matrix();
        r.row(j) /= r.row(j).sum();
      }
      MatrixR<double> p = (q * c.transpose() / std::sqrt(double(d))).array().exp().matrix() * r.transpose();
      for (Index i = 0; i < p.rows(); ++i) p.row(i) /= p.row(i).sum();
      return MatrixR<double>(p * v);
    };
    auto m = make_method<double>("vq:codes=" + std::to_string(codes) +
                                 ",seed=5,assign=soft,temperature=" + std::to_string(temp));
    m->compute(qs, pr.k);
    EXPECT_LT(rel_err(m->output(pr.v), soft_forward(qs, pr.k, pr.v)), 1e-12) << "the reference forward, T=" << temp;
    const auto fd = test::check_gradients(soft_forward, qs, pr.k, pr.v, d_out, m->backward(pr.v, d_out));
    EXPECT_LT(fd.worst, 1e-6) << fd.where << " T=" << temp;
  }
}

// Quantizing both: dK is the straight-through key gradient, s·Σ_i dS_ij q_i — central differences in K̂ of the
// mean-field logits s(q_i·k̂_j + c'_b(i)·r_j) with the residuals r and the query codes held (dense, here); dQ is the
// derivative of the method's own forward (its query codebook refitted), also when k-means stopped unconverged
// (iters=1) or ran no Lloyd step (iters=0: the centroids are copied queries).
TEST(MethodsIIBackward, VqQuantizeBoth) {
  const Index n = 64, d = 8, codes = 8;
  const Problem pr = problem(n, n, d, 21);
  const MatrixR<double> d_out = randn<double>(n, pr.v.cols(), 22);
  const double s = 1 / std::sqrt(double(d));
  for (Index iters : {20, 1, 0}) {
    const std::string spec = "vq:quantize=both,codes=8,seed=9,iters=" + std::to_string(iters);
    Rng rng(9);
    const KMeansResult<double> kk = kmeans<double>(pr.k, codes, iters, rng),
                               kq = kmeans<double>(pr.q, codes, iters, rng);
    MatrixR<double> khat(n, d), qhat(n, d);
    for (Index j = 0; j < n; ++j) {
      khat.row(j) = kk.centroids.row(kk.assignment[std::size_t(j)]);
      qhat.row(j) = kq.centroids.row(kq.assignment[std::size_t(j)]);
    }
    const MatrixR<double> resid = pr.k - khat;
    auto m = make_method<double>(spec);
    m->compute(pr.q, pr.k);
    const Gradients<double> g = m->backward(pr.v, d_out);
    // dK against the definition: only K̂ moves (Q, V and the residuals held), dQ and dV compared as zero.
    const auto in_khat = [&](const MatrixR<double>&, const MatrixR<double>& kh, const MatrixR<double>&) {
      MatrixR<double> p = s * (pr.q * kh.transpose() + qhat * resid.transpose());
      for (Index i = 0; i < n; ++i) {
        p.row(i) = (p.row(i).array() - p.row(i).maxCoeff()).exp().matrix();
        p.row(i) /= p.row(i).sum();
      }
      return MatrixR<double>(p * pr.v);
    };
    EXPECT_LT(rel_err(m->output(pr.v), in_khat(pr.q, khat, pr.v)), 1e-12) << spec;
    Gradients<double> only_dk{MatrixR<double>::Zero(n, d), g.dk, MatrixR<double>::Zero(n, pr.v.cols())};
    auto fd = test::check_gradients(in_khat, pr.q, khat, pr.v, d_out, only_dk);
    EXPECT_LT(fd.worst, 1e-6) << fd.where << " " << spec;
    // dQ and dV against the method's own forward (K held).
    const auto own = test::method_forward([&] { return make_method<double>(spec); }, {});
    const auto own_qv = [&](const MatrixR<double>& q, const MatrixR<double>&, const MatrixR<double>& v) {
      return own(q, pr.k, v);
    };
    Gradients<double> qv{g.dq, MatrixR<double>::Zero(n, d), g.dv};
    fd = test::check_gradients(own_qv, pr.q, pr.k, pr.v, d_out, qv);
    EXPECT_LT(fd.worst, 1e-6) << fd.where << " " << spec;
  }
}

// A fixed codebook is held (not differentiated), as with codebook=window: the backward is exact attention's on
// (Q, K̂, V) with dK = dK̂ (straight-through), K̂ the keys' nearest given codes.
TEST(MethodsIIBackward, VqFixedCodebookHeld) {
  const Problem pr = problem(60, 75, 8, 47);
  const MatrixR<double> c = randn<double>(10, 8, 48), d_out = randn<double>(60, pr.v.cols(), 49);
  const std::string path = temp_npy("vq_backward");
  write_npy<double>(path, c);
  const MatrixR<double> khat = nearest_codes(pr.k, c);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    auto m = make_method<double>("vq:codes=10,codebook=" + path);
    m->compute(pr.q, pr.k, o);
    expect_gradients_near(m->backward(pr.v, d_out), exact_grads(pr.q, khat, pr.v, d_out, o), 1e-11,
                          causal ? "causal" : "");
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attnlab
