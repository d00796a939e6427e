// `performer` — FAVOR+ random-feature attention (Choromanski et al. 2021, Lemma 1 and eq. (7); seed 002
// eqs. (4)-(5)), normalized, causal by prefix sums. q and k are each multiplied by s^½ so that the features
// estimate exp(s·qᵀk). Stabilized: each query's features are divided by their largest (a per-query factor
// cancels in the normalization), each key's exponent is carried as a log-scale and stabilized by a common
// (running, when causal) maximum in the kernel engine; denominators are guarded there.
#include "attnlab/performer.hpp"

#include "attnlab/error.hpp"
#include "attnlab/methods/performer.hpp"
#include "kernel_method.hpp"

#include <Eigen/QR>
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include <omp.h>

namespace attnlab {

template <typename T>
MatrixR<T> performer_projection(Index m, Index d, bool orthogonal, bool chi_norms, Rng& rng) {
  require(m >= 1 && d >= 1, "performer: need at least one feature and one dimension");
  if (!orthogonal) return gaussian_matrix<T>(m, d, rng);
  MatrixR<T> w(m, d);
  for (Index r0 = 0; r0 < m; r0 += d) {
    // An orthonormal block: Q of the QR of a Gaussian d×d matrix (signs fixed by R's diagonal so that Q is Haar).
    const Eigen::MatrixXd g = gaussian_matrix<double>(d, d, rng);
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
    Eigen::MatrixXd qm = qr.householderQ();
    const Eigen::MatrixXd r = qr.matrixQR().template triangularView<Eigen::Upper>();
    for (Index c = 0; c < d; ++c)
      if (r(c, c) < 0) qm.col(c) *= -1;
    const Index rows = std::min(d, m - r0);
    for (Index i = 0; i < rows; ++i) {
      // Row norms: χ(d) (the norm of a fresh Gaussian vector) keeps each ω_m ~ N(0, I); √d does not.
      const double norm = chi_norms ? gaussian_matrix<double>(1, d, rng).norm() : std::sqrt(double(d));
      w.row(r0 + i) = (qm.col(i).transpose() * norm).template cast<T>();
    }
  }
  return w;
}

template <typename T>
void performer_features_into(const ConstRef<T>& x, T scale, const ConstRef<T>& omega, PerformerKernel kernel,
                             RandomFeatures<T>& out, MatrixR<T>& xs, MatrixR<T>& proj) {
  require(x.cols() == omega.cols(), "performer: ω and x differ in dimension");
  const Index n = x.rows(), m = omega.rows();
  xs.resize(n, x.cols());
  xs = x * scale;
  proj.resize(n, m);
  proj.noalias() = xs * omega.transpose();  // n × M, ω_mᵀx_i
  out.logscale.resize(n);
  out.logscale = xs.rowwise().squaredNorm() / T(2);  // ½‖x_i‖², turned into the log-scale below
  switch (kernel) {
    case PerformerKernel::Positive: {
      out.f.resize(n, m);
#pragma omp parallel for schedule(static)
      for (Index i = 0; i < n; ++i) {
        const T mx = proj.row(i).maxCoeff();
        out.f.row(i) = (proj.row(i).array() - mx).exp();
        out.logscale(i) = mx - out.logscale(i) - T(0.5) * std::log(T(m));
      }
      break;
    }
    case PerformerKernel::Hyperbolic: {
      out.f.resize(n, 2 * m);
#pragma omp parallel for schedule(static)
      for (Index i = 0; i < n; ++i) {
        const T mx = proj.row(i).cwiseAbs().maxCoeff();
        out.f.row(i).head(m) = (proj.row(i).array() - mx).exp();
        out.f.row(i).tail(m) = (-proj.row(i).array() - mx).exp();
        out.logscale(i) = mx - out.logscale(i) - T(0.5) * std::log(T(2 * m));
      }
      break;
    }
    case PerformerKernel::Trig: {
      out.f.resize(n, 2 * m);
      out.f.leftCols(m) = proj.array().sin();
      out.f.rightCols(m) = proj.array().cos();
      out.logscale = out.logscale.array() - T(0.5) * std::log(T(m));
      break;
    }
  }
}

template <typename T>
RandomFeatures<T> performer_features(const ConstRef<T>& x, const ConstRef<T>& omega, PerformerKernel kernel) {
  RandomFeatures<T> out;
  MatrixR<T> xs, proj;
  performer_features_into<T>(x, T(1), omega, kernel, out, xs, proj);
  return out;
}

template struct RandomFeatures<float>;
template struct RandomFeatures<double>;
template MatrixR<float> performer_projection<float>(Index, Index, bool, bool, Rng&);
template MatrixR<double> performer_projection<double>(Index, Index, bool, bool, Rng&);
template RandomFeatures<float> performer_features<float>(const ConstRef<float>&, const ConstRef<float>&,
                                                         PerformerKernel);
template RandomFeatures<double> performer_features<double>(const ConstRef<double>&, const ConstRef<double>&,
                                                           PerformerKernel);
template void performer_features_into<float>(const ConstRef<float>&, float, const ConstRef<float>&, PerformerKernel,
                                             RandomFeatures<float>&, MatrixR<float>&, MatrixR<float>&);
template void performer_features_into<double>(const ConstRef<double>&, double, const ConstRef<double>&,
                                              PerformerKernel, RandomFeatures<double>&, MatrixR<double>&,
                                              MatrixR<double>&);

namespace {

template <typename T>
class PerformerMethod final : public KernelMethod<T> {
 public:
  PerformerMethod(const MethodDescriptor& d, Params p) : KernelMethod<T>(d, std::move(p)) {
    o_ = PerformerOptions::from(this->params());  // the spec's values, typed
    const auto& k = o_.kernel;
    kernel_ = k == "trig" ? PerformerKernel::Trig : k == "hyperbolic" ? PerformerKernel::Hyperbolic
                                                                      : PerformerKernel::Positive;
  }

 protected:
  void prepare(const ConstRef<T>& q, const ConstRef<T>&, const AttentionOptions&) override {
    scratch_.resize(std::size_t(std::max(1, omp_get_max_threads())));
    // ω is the method's parameter: drawn once per d (QR of Gaussian blocks) and reused by later calls.
    if (q.cols() != omega_d_) {
      Rng rng(o_.seed);
      omega_ = performer_projection<T>(o_.features, q.cols(), o_.orthogonal, o_.norms == "chi", rng);
      omega_d_ = q.cols();
    }
  }
  void block_features(const ConstRef<T>& x, bool keys, const AttentionOptions& opts, MatrixR<T>& f,
                      VectorX<T>& g) const override {
    // q and k are each multiplied by s^½ so that the features estimate exp(s·qᵀk). The query's log-scale is a
    // per-query factor: it cancels.
    // The buffers of this thread, kept across calls (f and g are the caller's: swapped in and out, not copied).
    const std::size_t t = std::size_t(omp_get_thread_num());
    Scratch local;
    Scratch& sc = t < scratch_.size() ? scratch_[t] : local;
    sc.r.f.swap(f);
    performer_features_into<T>(x, T(std::sqrt(opts.scale)), omega_, kernel_, sc.r, sc.xs, sc.proj);
    f.swap(sc.r.f);
    if (keys) g = sc.r.logscale;
    else g.resize(0);
  }
  bool nonnegative() const override { return kernel_ != PerformerKernel::Trig; }
  Index feature_count(Index) const override {
    return kernel_ == PerformerKernel::Positive ? Index(o_.features) : 2 * Index(o_.features);
  }

 private:
  PerformerOptions o_;  // the spec's values, typed
  PerformerKernel kernel_ = PerformerKernel::Positive;
  Index omega_d_ = -1;  // the dimension ω was drawn for
  MatrixR<T> omega_;
  /// Per-thread scratch of block_features (scaled rows, projections, log-scales), reused by every call.
  struct Scratch {
    RandomFeatures<T> r;
    MatrixR<T> xs, proj;
  };
  mutable std::vector<Scratch> scratch_;
};

}  // namespace

MethodDescriptor PerformerOptions::descriptor() {
  return describe<PerformerMethod>(
      kName, "Performer / FAVOR+ random features estimating exp(s·qᵀk)",
      "Choromanski et al. 2021 (Performer) Lemma 1, eq. (7); Lemma 2 for the variances",
      Causal::yes("recurrent or chunked prefix sums"),
      join_params({ParamSpec::integer("features", 256, 1, 1 << 16,
                               "number of random projections M (trig/hyperbolic use 2M features)")
                .budget(),
            ParamSpec::choice("kernel", {"positive", "trig", "hyperbolic"}, "feature map"),
            ParamSpec::boolean("orthogonal", true, "orthogonal random features (blocks of d) instead of iid"),
            ParamSpec::choice("norms", {"chi", "sqrt_d"}, "row norms of orthogonal features: χ(d) (unbiased) or √d"),
            ParamSpec::seed()},
           causal_form_params()));
}

ATTNLAB_TYPED_METHOD_DEFINE(Performer)

}  // namespace attnlab
