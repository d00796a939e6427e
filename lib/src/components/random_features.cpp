// Performer / FAVOR+ random features (Choromanski et al. 2021, Lemma 1 and eq. (7)): the projections ω (iid, or
// orthogonal within blocks of d with χ(d) or √d row norms) and the positive, trigonometric and hyperbolic feature
// maps, stabilized as exp(logscale_i)·f_i (attnlab/components/random_features.hpp).
#include "attnlab/components/random_features.hpp"

#include "attnlab/core/error.hpp"

#include <Eigen/QR>

#include <algorithm>
#include <cmath>

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
void performer_features_backward_given(const ConstRef<T>& x, T scale, const ConstRef<T>& omega, PerformerKernel kernel,
                                       const ConstRef<T>& f, const ConstRef<T>& df,
                                       const Eigen::Ref<const VectorX<T>>& dg, MutRef<T> dx, MatrixR<T>& dp) {
  const Index m = omega.rows();
  require(x.cols() == omega.cols(), "performer backward: ω and x differ in dimension");
  require(df.rows() == x.rows() && df.cols() == f.cols() && f.rows() == x.rows() &&
              f.cols() == (kernel == PerformerKernel::Positive ? m : 2 * m),
          "performer backward: ∂L/∂f has the wrong shape");
  require(dg.size() == 0 || dg.size() == x.rows(), "performer backward: one ∂L/∂g per row");
  require(dx.rows() == x.rows() && dx.cols() == x.cols(), "performer backward: dx has the wrong shape");
  dp.resize(x.rows(), m);  // ∂L/∂(x_s ωᵀ)
  switch (kernel) {
    case PerformerKernel::Positive:
      dp = df.array() * f.array();
      break;
    case PerformerKernel::Hyperbolic:
      dp = df.leftCols(m).array() * f.leftCols(m).array() - df.rightCols(m).array() * f.rightCols(m).array();
      break;
    case PerformerKernel::Trig:  // f = [sin p, cos p]
      dp = df.leftCols(m).array() * f.rightCols(m).array() - df.rightCols(m).array() * f.leftCols(m).array();
      break;
  }
  dx.noalias() = dp * omega;
  if (dg.size() > 0) {
    // d(±‖x_s‖²/2) = ±x_s: − for the positive and hyperbolic log-scales, + for trig's.
    const T sign = kernel == PerformerKernel::Trig ? T(1) : T(-1);
    dx.array() += sign * ((x.array() * scale).colwise() * dg.array());
  }
  dx *= scale;
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
template void performer_features_backward_given<float>(const ConstRef<float>&, float, const ConstRef<float>&,
                                                       PerformerKernel, const ConstRef<float>&, const ConstRef<float>&,
                                                       const Eigen::Ref<const VectorX<float>>&, MutRef<float>,
                                                       MatrixR<float>&);
template void performer_features_backward_given<double>(const ConstRef<double>&, double, const ConstRef<double>&,
                                                        PerformerKernel, const ConstRef<double>&,
                                                        const ConstRef<double>&,
                                                        const Eigen::Ref<const VectorX<double>>&, MutRef<double>,
                                                        MatrixR<double>&);
template void performer_features_into<float>(const ConstRef<float>&, float, const ConstRef<float>&, PerformerKernel,
                                             RandomFeatures<float>&, MatrixR<float>&, MatrixR<float>&);
template void performer_features_into<double>(const ConstRef<double>&, double, const ConstRef<double>&,
                                              PerformerKernel, RandomFeatures<double>&, MatrixR<double>&,
                                              MatrixR<double>&);

}  // namespace attnlab
