// The one conformance test every registered method runs (the RandLAPACK pattern): in float32 and float64,
// causal where supported, the materialized P̃ times V equals the fast output; the operator agrees with the
// matrix both ways; outputs stay finite for logits scaled by 100; a causal method never reads the future;
// a non-causal method refuses the mask; every backward pass agrees with central differences of its forward; under
// bf16 and fp16 storage, eager and careful, every method is emulated or refused with the reason (ReducedStorage).
#include "attnlab/analysis/method_rounding_bound.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/precision.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/io/npy.hpp"
#include "gradient_check.hpp"
#include "test_util.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

namespace attnlab {
namespace {

using test::randn;
using test::rel_err;

/// A test name's spec with its placeholder filled: "{codebook}" is a (16, 16) .npy codebook written once per test
/// process and removed at its exit (vq's codebook=PATH.npy; the names stay the same whatever the temp directory).
std::string spec_of(const std::string& name) {
  const std::string mark = "{codebook}";
  const auto at = name.find(mark);
  if (at == std::string::npos) return name;
  struct TempFile {
    std::string path = ::testing::TempDir() + "attnlab_conformance_vq_" + std::to_string(::getpid()) + ".npy";
    TempFile() { write_npy<double>(path, randn<double>(16, 16, 12)); }
    ~TempFile() { std::remove(path.c_str()); }
  };
  static const TempFile file;
  return name.substr(0, at) + file.path + name.substr(at + mark.size());
}

struct Shape {
  Index nq, nk, d, dv;
};

template <typename T>
void check_method(const std::string& test_name) {
  const std::string name = spec_of(test_name);
  SCOPED_TRACE(name + (sizeof(T) == 4 ? " float32" : " float64"));
  const double tol = sizeof(T) == 4 ? 1e-5 : 1e-10;
  auto m = make_method<T>(name, 11);
  for (const Shape s : {Shape{70, 70, 16, 5}, Shape{72, 97, 16, 7}}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "nq=" << s.nq << " nk=" << s.nk << " causal=" << causal);
      const MatrixR<T> q = randn<T>(s.nq, s.d, 1), k = randn<T>(s.nk, s.d, 2), v = randn<T>(s.nk, s.dv, 3);
      AttentionOptions o;
      o.causal = causal;
      if (causal && !m->supports_causal()) {
        EXPECT_THROW(m->compute(q, k, o), Error) << "a causal mask must be refused, not leaked";
        continue;
      }
      m->compute(q, k, o);
      ASSERT_EQ(m->info(), Status::Success);
      const MatrixR<T> out = m->output(v);
      const MatrixR<T> p = m->matrix();
      ASSERT_EQ(p.rows(), s.nq);
      ASSERT_EQ(p.cols(), s.nk);
      EXPECT_LT(rel_err(out, (p * v).eval()), tol) << "P̃·V differs from the fast output";
      // The operator, both ways, and its rows.
      const MatrixR<T> x = randn<T>(s.nk, 3, 4), y = randn<T>(s.nq, 3, 5);
      EXPECT_LT(rel_err(m->op().apply(x), (p * x).eval()), tol);
      EXPECT_LT(rel_err(m->op().apply_transpose(y), (p.transpose() * y).eval()), tol);
      EXPECT_LT(rel_err(m->op().row_block(7, 9), p.middleRows(7, 9).eval()), tol);
      // row_block_into (the metrics' reused buffers) writes the same rows bit for bit, into a buffer of another
      // shape that holds NaN, and again when the buffer is reused at another size.
      MatrixR<T> buf = MatrixR<T>::Constant(3, s.nk + 5, std::numeric_limits<T>::quiet_NaN());
      for (const auto& [first, count] : {std::pair<Index, Index>{7, 9}, {0, 4}, {7, 9}}) {
        m->op().row_block_into(first, count, buf);
        const MatrixR<T> rows = m->op().row_block(first, count);
        ASSERT_EQ(buf.rows(), count);
        ASSERT_EQ(buf.cols(), s.nk);
        EXPECT_TRUE(buf.cwiseEqual(rows).all()) << "row_block_into(" << first << ", " << count << ") differs";
      }
      if (m->op().rows_are_distributions()) {
        EXPECT_GE(double(p.minCoeff()), -tol);
        for (Index i = 0; i < s.nq; ++i) EXPECT_NEAR(double(p.row(i).sum()), 1.0, 10 * tol);
      }
      if (causal) {
        // Changing any key or value at positions ≥ t leaves the outputs of queries that cannot see t alone.
        const Index off = s.nk - s.nq, t = s.nk / 2;
        MatrixR<T> k2 = k, v2 = v;
        // A method with state fitted on all keys (VQ's codebook=window) looks ahead through that state by design:
        // for it only the future values change here; its own tests fix the state and change the future keys.
        if (m->lookahead().empty()) k2.bottomRows(s.nk - t) = randn<T>(s.nk - t, s.d, 9) * T(3);
        v2.bottomRows(s.nk - t) = randn<T>(s.nk - t, s.dv, 10) * T(3);
        auto m2 = make_method<T>(name, 11);
        m2->compute(q, k2, o);
        const MatrixR<T> out2 = m2->output(v2);
        const Index blind = std::max<Index>(0, t - off);  // queries i with i + off < t
        if (blind > 0) {
          EXPECT_LE(double((out2.topRows(blind) - out.topRows(blind)).cwiseAbs().maxCoeff()), 1e-6)
              << "an earlier output moved when the future changed";
        }
        // P̃ puts exactly zero weight on the future.
        for (Index i = 0; i < s.nq; ++i)
          for (Index j = i + off + 1; j < s.nk; ++j) ASSERT_EQ(p(i, j), T(0)) << "P̃(" << i << "," << j << ")";
      }
    }
  }
  // Logits scaled by 100: outputs stay finite (no overflow in exp, no 0/0 in normalizers).
  const MatrixR<T> q = randn<T>(80, 16, 6), k = randn<T>(80, 16, 7), v = randn<T>(80, 4, 8);
  for (bool causal : {false, true}) {
    if (causal && !m->supports_causal()) continue;
    AttentionOptions o;
    o.causal = causal;
    o.scale = 100.0 / 4.0;
    m->compute(q, k, o);
    EXPECT_TRUE(m->output(v).allFinite()) << "non-finite output for logits ×100, causal=" << causal;
    EXPECT_TRUE(m->matrix().allFinite());
  }
}

// The backward pass of every method that defines one (Method::backward), causal where the method honours a mask:
//  - against central differences of the method's own forward in float64 (test::check_gradients: random directions
//    in Q, K and V, the method refitted with the same seed — its random parameters and, for small steps, its
//    discrete choices are those of the fit, which is what the backward holds fixed);
//  - float32 against float64;
//  - under a causal mask, dO at query i reaches no key after i: changing dO's row i leaves those keys' dK, dV alone.
// A method that defines none refuses with its reason (descriptor.backward_note, `attnlab methods`).
// A method whose dK is a straight-through estimate (its backward_note says "straight-through": VQ's dK = dK̂, Lingle
// 2023) is not the derivative of its forward in K — the forward refits its codebook on the perturbed keys — so for it
// the finite differences in K are skipped (dQ and dV are still checked; its own tests check dK against its
// definition, tests/test_methods_ii.cpp). The float32 and causal checks of dK still apply.
void check_backward(const std::string& test_name) {
  const std::string name = spec_of(test_name);
  SCOPED_TRACE(name);
  auto m = make_method<double>(name, 11);
  const MethodDescriptor& desc = find_method(m->name());
  for (const Shape s : {Shape{70, 70, 16, 5}, Shape{72, 97, 16, 7}}) {
    for (bool causal : {false, true}) {
      if (causal && !m->supports_causal()) continue;
      SCOPED_TRACE(::testing::Message() << "nq=" << s.nq << " nk=" << s.nk << " causal=" << causal);
      const MatrixR<double> q = randn<double>(s.nq, s.d, 21), k = randn<double>(s.nk, s.d, 22),
                            v = randn<double>(s.nk, s.dv, 23), d_out = randn<double>(s.nq, s.dv, 24);
      AttentionOptions o;
      o.causal = causal;
      m->compute(q, k, o);
      if (!desc.backward) {
        try {
          m->backward(v, d_out);
          ADD_FAILURE() << "a method without a backward pass must refuse";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(desc.backward_note), std::string::npos) << e.what();
        }
        continue;
      }
      const Gradients<double> g = m->backward(v, d_out);
      test::Forward forward = test::method_forward([&] { return make_method<double>(name, 11); }, o);
      Gradients<double> checked = g;
      if (desc.backward_note.find("straight-through") != std::string::npos) {
        // dK skipped: K is held at its value in the forward (the loss is flat in K) and dK is compared as zero.
        forward = [f = forward, k](const MatrixR<double>& a, const MatrixR<double>&, const MatrixR<double>& c) {
          return f(a, k, c);
        };
        checked.dk.setZero();
      }
      const auto fd = test::check_gradients(forward, q, k, v, d_out, checked);
      EXPECT_LT(fd.worst, 1e-6) << fd.where << " disagrees with central differences of the forward";

      auto m32 = make_method<float>(name, 11);
      m32->compute(q.cast<float>(), k.cast<float>(), o);
      const Gradients<float> g32 = m32->backward(v.cast<float>(), d_out.cast<float>());
      EXPECT_LT(rel_err(g32.dq, g.dq), 1e-4) << "float32 dQ";
      EXPECT_LT(rel_err(g32.dk, g.dk), 1e-4) << "float32 dK";
      EXPECT_LT(rel_err(g32.dv, g.dv), 1e-4) << "float32 dV";

      if (causal) {
        const Index off = s.nk - s.nq, i = s.nq / 2;
        MatrixR<double> d_out2 = d_out;
        d_out2.row(i) = randn<double>(1, s.dv, 25) * 3.0;
        const Gradients<double> g2 = m->backward(v, d_out2);
        const Index after = s.nk - (i + off + 1);  // keys i + off + 1, ... are after query i
        EXPECT_LE((g2.dk.bottomRows(after) - g.dk.bottomRows(after)).cwiseAbs().maxCoeff(), 1e-12 * g.dk.norm())
            << "dO at query " << i << " reached dK of a later key";
        EXPECT_LE((g2.dv.bottomRows(after) - g.dv.bottomRows(after)).cwiseAbs().maxCoeff(), 1e-12 * g.dv.norm())
            << "dO at query " << i << " reached dV of a later key";
      }
    }
  }
}

/// Every method under every reduced storage and policy (issue "Reduced precision"): either refused before any work,
/// with a message that says it is not emulated (the registry's declaration, or a variant the method's note excludes),
/// or run — and then the rounding is tallied (the inputs at least), a non-finite output entry or all-zero row is
/// never silent (output_check() counts exactly what the output holds), and on these moderate logits nothing overflows:
/// the output is finite. Every method with a derived worst-case rounding bound (analysis/method_rounding_bound.hpp
/// says which) is held to it entry by entry, against its own float64 output (exact attention: exact's); one without
/// says why. Each method's rounding error is printed (the precision experiment measures it at scale; the bounds'
/// own tests, with overflow, flips and sharper logits, are tests/test_precision.cpp's RoundingBound ones).
void check_reduced_storage(const std::string& test_name) {
  const std::string name = spec_of(test_name);
  const MethodDescriptor& d = find_method(name.substr(0, name.find(':')));
  const Index n = 96, dim = 16;
  const MatrixR<float> q = randn<float>(n, dim, 1), k = randn<float>(n, dim, 2), v = randn<float>(n, dim, 3);
  MethodRoundingBounds bounds(q.cast<double>(), k.cast<double>(), v.cast<double>());
  // fp32 under either policy is the float32 path, output and backward bit for bit: natively nothing is rounded, so
  // the careful policy changes nothing (the command and the module refuse a policy there for that reason).
  for (const bool causal : {false, true}) {
    auto plain = make_method<float>(name, 11), careful = make_method<float>(name, 11);
    if (causal && !plain->supports_causal()) continue;
    AttentionOptions o, oc;
    o.causal = oc.causal = causal;
    oc.policy = Policy::careful;
    plain->compute(q, k, o);
    careful->compute(q, k, oc);
    EXPECT_TRUE(plain->output(v) == careful->output(v)) << name << ": fp32 careful differs from float32";
    const MatrixR<float> dout = randn<float>(n, dim, 4);
    std::optional<Gradients<float>> a, b;
    try {
      a = plain->backward(v, dout);
    } catch (const Error&) {  // a method without a backward (svd, cur): refused under either policy
      EXPECT_THROW(careful->backward(v, dout), Error);
    }
    if (a) {
      b = careful->backward(v, dout);
      EXPECT_TRUE(a->dq == b->dq && a->dk == b->dk && a->dv == b->dv) << name << ": fp32 careful backward differs";
    }
  }
  for (const Storage st : {Storage::bf16, Storage::fp16})
    for (const Policy pol : {Policy::eager, Policy::careful})
      for (const bool causal : {false, true}) {
        SCOPED_TRACE(::testing::Message() << name << " " << storage_name(st) << " " << policy_name(pol)
                                          << (causal ? " causal" : ""));
        AttentionOptions o;
        o.storage = st;
        o.policy = pol;
        o.causal = causal;
        auto m = make_method<float>(name, 11);
        if (causal && !m->supports_causal()) continue;  // refused with or without a storage: check_method's test
        const bool declared = pol == Policy::eager ? d.storage.eager : d.storage.careful;
        std::string refusal;
        MatrixR<float> out;
        try {
          m->compute(q, k, o);
          out = m->output(v);
        } catch (const Error& e) {
          refusal = e.what();
        }
        if (!declared) {
          EXPECT_NE(refusal.find("does not emulate"), std::string::npos) << "refusal: '" << refusal << "'";
          continue;
        }
        if (!refusal.empty()) {  // a variant outside the declared emulation: said so
          EXPECT_NE(refusal.find("emulat"), std::string::npos) << "refusal: '" << refusal << "'";
          continue;
        }
        ASSERT_EQ(out.rows(), n);
        std::uint64_t nonfinite = 0, zero_rows = 0;
        for (Index i = 0; i < out.size(); ++i) nonfinite += !std::isfinite(out.data()[i]);
        for (Index i = 0; i < n; ++i) zero_rows += (out.row(i).array() == 0.0f).all();
        EXPECT_EQ(m->output_check().nonfinite, nonfinite);
        EXPECT_EQ(m->output_check().zero_rows, zero_rows);
        EXPECT_EQ(nonfinite, 0u) << "moderate logits: nothing should overflow";
        bool inputs = false;
        for (const auto& e : m->rounding()) {
          inputs = inputs || e.what == "inputs Q, K";
          if (pol == Policy::careful) {
            EXPECT_EQ(e.held, Held::tensor) << e.what << ": careful rounds tensors only";
          }
        }
        EXPECT_TRUE(inputs) << "the stored inputs were not tallied";
        auto m64 = make_method<double>(name, 11);
        AttentionOptions o64;
        o64.causal = causal;
        m64->compute(q.cast<double>(), k.cast<double>(), o64);
        const MatrixR<double> own = m64->output(v.cast<double>());
        std::printf("  %-44s %s %-7s %-6s rounding error %.2e", name.c_str(), storage_name(st).c_str(),
                    policy_name(pol).c_str(), causal ? "causal" : "", rel_err(out.cast<double>().eval(), own));
        // The method's derived rounding bound (analysis/method_rounding_bound.hpp), entry by entry: none outside it
        // (a row without a guarantee — possible overflow, a moved discrete choice — excepted); or why none is derived.
        std::string why;
        if (const auto b = bounds.bound(*m64, own, *m, &why)) {
          EXPECT_EQ(b->outside(out.cast<double>()), 0) << "entries outside the derived rounding bound";
          EXPECT_LE(b->rows_without_guarantee, n);
          std::printf(", bound %.2e (%lld rows without)", b->output.allFinite() ? b->output.norm() / own.norm() : 0.0,
                      static_cast<long long>(b->rows_without_guarantee));
        } else {
          EXPECT_FALSE(why.empty()) << "no bound and no reason";
          std::printf(", no bound (%s)", why.c_str());
        }
        // The backward: emulated where the registry says so (then finite here and checked), else refused.
        const MatrixR<float> dout = randn<float>(n, dim, 4);
        if (!d.storage.backward) {
          EXPECT_THROW(m->backward(v, dout), Error);
          std::printf("\n");
          continue;
        }
        if (!d.backward) continue;
        Gradients<float> g;
        try {
          g = m->backward(v, dout);
        } catch (const Error& e) {  // a part the note excludes (the kernel methods' causal backward): said so
          EXPECT_NE(std::string(e.what()).find("not emulated"), std::string::npos) << e.what();
          std::printf(", backward refused\n");
          continue;
        }
        std::uint64_t bad = 0;
        for (const MatrixR<float>* x : {&g.dq, &g.dk, &g.dv})
          for (Index i = 0; i < x->size(); ++i) bad += !std::isfinite(x->data()[i]);
        EXPECT_EQ(m->gradient_check().nonfinite, bad);
        // One failure of the format is known and is the finding (test_precision.cpp,
        // PerformerFloat16EagerBackwardOverflows): eager Performer's normaliser gradient O·dO/D passes fp16's
        // 65504 where a long query's e^{-‖q‖²/2} makes D small, though the forward's ratio is finite. It must be
        // that overflow, reported; anything else non-finite here is a bug.
        const bool known = name.rfind("performer", 0) == 0 && st == Storage::fp16 && pol == Policy::eager;
        if (known && bad > 0) {
          // (the log keeps the order of storing, and an overflow counts every ±inf stored, an earlier one carried
          // on included: the first tensor stored with one is where it arose)
          std::string first;
          for (const auto& e : m->rounding())
            if (first.empty() && e.tally.overflow > 0) first = e.what;
          EXPECT_EQ(first, "∂L/∂numerators, ∂L/∂normalisers") << "non-finite gradients not from the normalisers' "
                                                                  "gradient";
          std::printf(", backward fails (%llu non-finite gradients: the normalisers' gradient overflowed)\n",
                      static_cast<unsigned long long>(bad));
          continue;
        }
        EXPECT_EQ(bad, 0u);
        const Gradients<double> g64 = m64->backward(v.cast<double>(), dout.cast<double>());
        std::printf(", dQ %.2e dK %.2e dV %.2e\n", rel_err(g.dq.cast<double>().eval(), g64.dq),
                    rel_err(g.dk.cast<double>().eval(), g64.dk), rel_err(g.dv.cast<double>().eval(), g64.dv));
      }
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, Float32) { check_method<float>(GetParam()); }
TEST_P(Conformance, Float64) { check_method<double>(GetParam()); }
TEST_P(Conformance, Backward) { check_backward(GetParam()); }
TEST_P(Conformance, ReducedStorage) { check_reduced_storage(GetParam()); }

std::vector<std::string> method_names() {
  std::vector<std::string> v;
  for (const auto& d : registered_methods()) v.push_back(d.name);
  // Both output paths of the exact method.
  v.push_back("exact:impl=materialized");
  v.push_back("exact:tile=8");
  // Every causal form and feature map of the kernel family.
  v.push_back("linear:causal_form=recurrent");
  v.push_back("linear:feature=relu,chunk=5");
  v.push_back("taylor:causal_form=recurrent");
  v.push_back("performer:causal_form=recurrent");
  v.push_back("performer:kernel=hyperbolic,orthogonal=false,chunk=16");
  // Other budgets and options of the low-rank family.
  v.push_back("nystrom:pinv=svd,select=random");
  v.push_back("nystrom:pinv=newton,iters=30");
  v.push_back("linformer:projection=pool,k=16");
  v.push_back("cur:select=leverage,columns=20");
  // Methods II variants.
  v.push_back("vq:assign=soft,temperature=0.5");
  v.push_back("vq:quantize=both,codes=16");
  v.push_back("vq:codes=16,codebook={codebook}");  // a fixed codebook: no look-ahead, the future keys change too
  v.push_back("probsparse:sample=full,lazy=cumsum");
  v.push_back("probsparse:measure=lse,factor=2");
  v.push_back("sparse:window=-1,stride=4,globals=0,random=3");
  v.push_back("sparse:window=3,stride=5,globals=3,random=4");  // every part overlapping the others
  v.push_back("reformer:buckets=4,rounds=3,chunk=16");
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllMethods, Conformance, ::testing::ValuesIn(method_names()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
}  // namespace attnlab
