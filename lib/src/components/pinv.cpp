// Iterative and SVD pseudo-inverses with convergence histories.
#include "attnlab/components/pinv.hpp"

#include "attnlab/components/dense_svd.hpp"
#include "attnlab/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace attnlab {

PinvMethod parse_pinv_method(const std::string& name) {
  if (name == "iterative" || name == "order3") return PinvMethod::Order3;
  if (name == "newton") return PinvMethod::NewtonSchulz;
  if (name == "svd") return PinvMethod::Svd;
  throw Error(fmt::format("unknown pseudo-inverse method '{}'; valid: iterative, newton, svd", name));
}

template <typename T>
MatrixR<T> svd_pinv(const ConstRef<T>& a, double rcond) {
  const Eigen::MatrixXd ad = a.template cast<double>();
  const DenseSvd svd = bdc_svd(ad, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const Eigen::VectorXd& s = svd.values;
  if (rcond <= 0) rcond = std::numeric_limits<T>::epsilon() * double(std::max(a.rows(), a.cols()));
  const double cut = s.size() ? rcond * s(0) : 0;
  Eigen::VectorXd inv = s;
  for (Index i = 0; i < s.size(); ++i) inv(i) = s(i) > cut ? 1.0 / s(i) : 0.0;
  const Eigen::MatrixXd z = svd.v * inv.asDiagonal() * svd.u.transpose();
  return z.cast<T>();
}

template <typename T>
Pseudoinverse<T>& Pseudoinverse<T>::compute(const ConstRef<T>& a) {
  require(a.rows() > 0 && a.cols() > 0, "pseudo-inverse of an empty matrix");
  residuals_.clear();
  errors_.clear();
  if (!all_finite(a)) {
    // Under an emulated storage the landmark kernel of inputs that overflowed the format is the finding, not an
    // error: the pseudo-inverse is NaN (no SVD or iteration runs on it) and the output says so. Natively: an error.
    require(rounding_.active(), "pseudo-inverse: the matrix has non-finite entries");
    z_ = MatrixR<T>::Constant(a.cols(), a.rows(), std::numeric_limits<T>::quiet_NaN());
    residuals_.push_back(std::numeric_limits<double>::quiet_NaN());
    status_ = Status::NumericalIssue;
    return *this;
  }
  const bool square = a.rows() == a.cols();
  const bool track_error = reference_.size() > 0;
  if (track_error)
    require(reference_.rows() == a.cols() && reference_.cols() == a.rows(),
            "pseudo-inverse: reference has the wrong shape");
  const auto record = [&](const MatrixR<T>& az) {
    if (square) residuals_.push_back((MatrixR<T>::Identity(a.rows(), a.rows()) - az).template cast<double>().norm());
    else residuals_.push_back(std::numeric_limits<double>::quiet_NaN());
    if (track_error) errors_.push_back((z_.template cast<double>() - reference_).norm());
  };
  if (method_ == PinvMethod::Svd) {
    z_ = svd_pinv<T>(a, rcond_);
    record(a * z_);
    status_ = Status::Success;
    return *this;
  }
  require(iters_ >= 0, "pseudo-inverse: negative iteration count");
  // Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞): ‖A‖₁ the largest column sum, ‖A‖∞ the largest row sum of |A| (the initialisation
  // Xiong et al. 2021 use).
  const double norm1 = a.cwiseAbs().colwise().sum().maxCoeff();
  const double norminf = a.cwiseAbs().rowwise().sum().maxCoeff();
  require(norm1 > 0 && norminf > 0, "pseudo-inverse of the zero matrix");
  z_ = a.transpose() / T(norm1 * norminf);
  // Under an emulated reduced storage every product and iterate is stored as formed (rounding_ rounds them under the
  // eager policy only: accumulators); the norms are float32 reductions.
  const Rounding& r = rounding_;
  const char* what = "pseudo-inverse iterates";
  r(z_, Held::accumulator, what);
  const Index m = a.rows();
  const MatrixR<T> I = MatrixR<T>::Identity(m, m);
  MatrixR<T> az = a * z_, t(m, m), zn;
  r(az, Held::accumulator, what);
  record(az);
  status_ = Status::Success;
  for (Index k = 0; k < iters_; ++k) {
    if (tol_ > 0 && square && residuals_.back() <= tol_) break;
    if (method_ == PinvMethod::Order3) {
      // Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ)))
      if (!r.active()) {
        t = T(7) * I - az;
        t = T(15) * I - az * t;
        t = T(13) * I - az * t;
      } else {
        // Each parenthesis and product stored as formed (the reference's iterative_inv under .half()).
        t = T(7) * I - az;
        r(t, Held::accumulator, what);
        t = az * t;
        r(t, Held::accumulator, what);
        t = T(15) * I - t;
        r(t, Held::accumulator, what);
        t = az * t;
        r(t, Held::accumulator, what);
        t = T(13) * I - t;
        r(t, Held::accumulator, what);
      }
      zn.noalias() = z_ * t;
      r(zn, Held::accumulator, what);
      z_ = T(0.25) * zn;
    } else {
      // Z ← Z (2I − AZ)
      t = T(2) * I - az;
      r(t, Held::accumulator, what);
      zn.noalias() = z_ * t;
      z_.swap(zn);
    }
    r(z_, Held::accumulator, what);
    az.noalias() = a * z_;
    r(az, Held::accumulator, what);
    record(az);
    if (!std::isfinite(residuals_.back()) && square) {
      status_ = Status::NumericalIssue;
      break;
    }
  }
  if (square && status_ == Status::Success && residuals_.size() > 1 && residuals_.back() > residuals_.front())
    status_ = Status::NoConvergence;
  return *this;
}

namespace {

/// The SVD method's VJP (pinv.hpp): in float64, as svd_pinv.
template <typename T>
MatrixR<T> svd_pinv_backward(const ConstRef<T>& a, const ConstRef<T>& d_z, double rcond) {
  require(a.rows() == a.cols(),
          "pseudo-inverse backward: the SVD method's derivative is defined here for square A, got {}×{}",
          a.rows(), a.cols());
  const Index m = a.rows();
  const Eigen::MatrixXd ad = a.template cast<double>();
  const DenseSvd svd = bdc_svd(ad, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const Eigen::VectorXd& s = svd.values;
  const Eigen::MatrixXd& u = svd.u;
  const Eigen::MatrixXd& v = svd.v;
  if (rcond <= 0) rcond = std::numeric_limits<T>::epsilon() * double(m);
  const double cut = s.size() ? rcond * s(0) : 0;
  Index r = 0;
  while (r < m && s(r) > cut) ++r;  // singular values are sorted: the first r are kept
  const Eigen::MatrixXd dz = d_z.template cast<double>();
  Eigen::MatrixXd da;
  if (r == m) {
    // Full rank: Z = A⁻¹ (as svd_pinv forms it) and dZ = −Z dA Z, so dA = −Zᵀ dZ Zᵀ.
    Eigen::VectorXd inv = s.cwiseInverse();
    const Eigen::MatrixXd z = v * inv.asDiagonal() * u.transpose();
    da = -(z.transpose() * dz * z.transpose());
  } else {
    // Zᵀ = U f(Σ) Vᵀ with f(σ) = 1/σ for the r kept values, 0 for the dropped ones: a singular-value function,
    // whose differential in the SVD's bases is Ω ↦ M, M_ij = α_ij sym(Ω)_ij + β_ij skew(Ω)_ij, M_ii = f'(σ_i) Ω_ii;
    // the map is self-adjoint, so the gradient is U·M(Ḡ)·Vᵀ with Ḡ = Uᵀ (dL/dZᵀ) V.
    const Eigen::MatrixXd gb = u.transpose() * dz.transpose() * v;
    Eigen::MatrixXd om = Eigen::MatrixXd::Zero(m, m);
    for (Index i = 0; i < m; ++i)
      for (Index j = 0; j < m; ++j) {
        const bool ki = i < r, kj = j < r;
        if (i == j) {
          if (ki) om(i, i) = -gb(i, i) / (s(i) * s(i));
        } else if (ki && kj) {
          om(i, j) = -gb(j, i) / (s(i) * s(j));
        } else if (ki || kj) {
          const double fi = ki ? 1 / s(i) : 0, fj = kj ? 1 / s(j) : 0;
          const double alpha = (fi - fj) / (s(i) - s(j)), beta = (fi + fj) / (s(i) + s(j));
          om(i, j) = 0.5 * alpha * (gb(i, j) + gb(j, i)) + 0.5 * beta * (gb(i, j) - gb(j, i));
        }
      }
    da = u * om * v.transpose();
  }
  return da.cast<T>();
}

/// The sign of each entry (0 at 0): the derivative of |x| used by ‖A‖₁ and ‖A‖∞.
template <typename T, typename X>
auto sign_of(const X& x) {
  return x.unaryExpr([](T e) { return T((e > T(0)) - (e < T(0))); });
}

/// The iterative methods' VJP (pinv.hpp): in float64 (S = double, r inactive), or in float32 under an emulated
/// reduced storage (pinv_backward_emulated): the forward's iterates formed again as Pseudoinverse::compute stores
/// them under r, and every gradient product and sum stored under r's eager policy (pseudo-inverse internals are
/// accumulators: careful keeps them in float32). With r inactive the arithmetic is the float64 one, bit for bit.
template <typename S>
MatrixR<S> iterative_pinv_backward(const MatrixR<S>& a, const MatrixR<S>& d_z, PinvMethod method, Index iterations,
                                   const Rounding& r) {
  // Z₀ = Aᵀ/c, c = ‖A‖₁‖A‖∞, with the arithmetic of compute() (in float64 the iterates are the forward's
  // bits; for float32, the float64 iterates of the same A).
  Index jstar = 0, istar = 0;
  const double norm1 = a.cwiseAbs().colwise().sum().maxCoeff(&jstar);
  const double norminf = a.cwiseAbs().rowwise().sum().maxCoeff(&istar);
  require(norm1 > 0 && norminf > 0, "pseudo-inverse backward of the zero matrix");
  const double c = norm1 * norminf;
  const Index m = a.rows();
  const MatrixR<S> I = MatrixR<S>::Identity(m, m);
  const bool order3 = method == PinvMethod::Order3;
  const Rounding fwd = r.untallied();  // the forward's iterates, formed again: tallied by compute() already
  const char* iterates = "";
  const char* grads = "pseudo-inverse backward";
  // One step of the forward, its intermediates kept for the way back: X = AZ, then
  //   order3: t1 = 7I − X, t2 = 15I − X t1, t3 = 13I − X t2, Z' = ¼ Z t3;   newton: t1 = 2I − X, Z' = Z t1
  // (the products of compute(), in its order and with its roundings: the same iterates).
  struct Step {
    MatrixR<S> z, x, t1, t2, t3;
  };
  const auto form = [&](Step& s) {
    s.x.noalias() = a * s.z;
    fwd(s.x, Held::accumulator, iterates);
    if (order3 && !r.active()) {
      // As compute() forms them: Eigen fuses "cI − X·t" into one product accumulated onto cI, whose rounding
      // differs from forming X·t first once the product splits its depth (m above the GEMM block): the float64
      // path keeps the fused form, bit for bit.
      s.t1 = S(7) * I - s.x;
      s.t2 = S(15) * I - s.x * s.t1;
      s.t3 = S(13) * I - s.x * s.t2;
    } else if (order3) {  // emulated: each product stored as formed, as compute() stores it under a rounding
      s.t1 = S(7) * I - s.x;
      fwd(s.t1, Held::accumulator, iterates);
      MatrixR<S> t = s.x * s.t1;
      fwd(t, Held::accumulator, iterates);
      s.t2 = S(15) * I - t;
      fwd(s.t2, Held::accumulator, iterates);
      t = s.x * s.t2;
      fwd(t, Held::accumulator, iterates);
      s.t3 = S(13) * I - t;
      fwd(s.t3, Held::accumulator, iterates);
    } else {
      s.t1 = S(2) * I - s.x;
      fwd(s.t1, Held::accumulator, iterates);
    }
  };
  const auto next = [&](const Step& s) {
    MatrixR<S> zn;
    zn.noalias() = s.z * (order3 ? s.t3 : s.t1);
    if (order3) {
      fwd(zn, Held::accumulator, iterates);
      zn = S(0.25) * zn;
    }
    fwd(zn, Held::accumulator, iterates);
    return zn;
  };
  // Segments of s steps, each formed again from its first iterate on the way back with its intermediates kept (no
  // product formed twice within it). The steps' intermediates for every iteration in one segment when they fit in
  // 64 MiB (the paper's 6 iterations at m = 64: 1 MiB); else checkpoints Z_0, Z_s, Z_2s, ... with s ≈ √K:
  // O(√K·m²) memory, the forward's products twice.
  const double side = double(std::max(a.rows(), a.cols()));
  const double step_bytes = (order3 ? 5.0 : 3.0) * 8.0 * side * side;
  const Index stride = double(iterations) * step_bytes <= 64.0 * (1 << 20)
                           ? std::max<Index>(1, iterations)
                           : std::max<Index>(1, Index(std::ceil(std::sqrt(double(iterations)))));
  std::vector<MatrixR<S>> checkpoints;
  MatrixR<S> z = a.transpose() / S(c);
  fwd(z, Held::accumulator, iterates);
  const MatrixR<S> z0 = z;
  const Index last = iterations > 0 ? (iterations - 1) / stride * stride : 0;  // the last checkpoint
  for (Index k = 0; k < iterations; ++k) {
    if (k % stride == 0) checkpoints.push_back(z);
    if (k == last) break;
    Step s;
    s.z = std::move(z);
    form(s);
    z = next(s);
  }
  MatrixR<S> dz = d_z, da = MatrixR<S>::Zero(m, a.cols());
  std::vector<Step> seg(std::size_t(std::min(stride, std::max<Index>(iterations, 1))));
  for (Index sgi = Index(checkpoints.size()) - 1; sgi >= 0; --sgi) {
    const Index k0 = sgi * stride, k1 = std::min(iterations, k0 + stride);
    seg[0].z = checkpoints[std::size_t(sgi)];
    for (Index k = k0; k < k1; ++k) {
      Step& s = seg[std::size_t(k - k0)];
      form(s);
      if (k + 1 < k1) seg[std::size_t(k + 1 - k0)].z = next(s);
    }
    for (Index k = k1 - 1; k >= k0; --k) {
      // Reverse mode through Z' = step(Z) with X = AZ (Razavi et al. 2014; Xiong et al. 2021 eq. (16)).
      const Step& s = seg[std::size_t(k - k0)];
      const MatrixR<S>& zk = s.z;
      MatrixR<S> dzk, dx;
      if (order3) {
        dzk.noalias() = S(0.25) * dz * s.t3.transpose();
        r(dzk, Held::accumulator, grads);
        MatrixR<S> dt3 = S(0.25) * zk.transpose() * dz;
        r(dt3, Held::accumulator, grads);
        dx.noalias() = -dt3 * s.t2.transpose();
        r(dx, Held::accumulator, grads);
        MatrixR<S> dt2 = -s.x.transpose() * dt3;
        r(dt2, Held::accumulator, grads);
        dx.noalias() -= dt2 * s.t1.transpose();
        r(dx, Held::accumulator, grads);
        MatrixR<S> dt1 = -s.x.transpose() * dt2;
        r(dt1, Held::accumulator, grads);
        dx -= dt1;
        r(dx, Held::accumulator, grads);
      } else {
        dzk.noalias() = dz * s.t1.transpose();
        r(dzk, Held::accumulator, grads);
        dx.noalias() = -zk.transpose() * dz;
        r(dx, Held::accumulator, grads);
      }
      da.noalias() += dx * zk.transpose();
      r(da, Held::accumulator, grads);
      dzk.noalias() += a.transpose() * dx;
      r(dzk, Held::accumulator, grads);
      dz.swap(dzk);
    }
  }
  // Z₀ = Aᵀ/c: dA += dZ₀ᵀ/c, and through c = ‖A‖₁‖A‖∞ (∂Z₀/∂c = −Z₀/c), the maximizing column j* and row i* held
  // fixed: ∂‖A‖₁/∂A = sign(A) on column j*, ∂‖A‖∞/∂A = sign(A) on row i*.
  da += dz.transpose() / S(c);
  const double dc = double(-(dz.array() * z0.array()).sum()) / c;
  da.col(jstar) += S(dc * norminf) * sign_of<S>(a.col(jstar));
  da.row(istar) += S(dc * norm1) * sign_of<S>(a.row(istar));
  r(da, Held::accumulator, grads);
  return da;
}

}  // namespace

template <typename T>
MatrixR<T> pinv_backward(const ConstRef<T>& a, const ConstRef<T>& d_z, PinvMethod method, Index iterations,
                         double rcond) {
  require(a.rows() > 0 && a.cols() > 0, "pseudo-inverse backward of an empty matrix");
  require(d_z.rows() == a.cols() && d_z.cols() == a.rows(),
          "pseudo-inverse backward: dZ is {}×{}, Z is {}×{}", d_z.rows(), d_z.cols(), a.cols(), a.rows());
  if (method == PinvMethod::Svd) return svd_pinv_backward<T>(a, d_z, rcond);
  require(iterations >= 0, "pseudo-inverse backward: negative iteration count");
  // In float64 whatever T, as svd_pinv: the derivative of the same map at the same A, without the float32 rounding
  // that K reverse steps of m×m products accumulate (5× smaller dQ, dK errors against float64 for Nyström on a
  // landmark matrix of condition 4.5e3 after 30 Newton–Schulz steps); the m×m work is small beside the n·m attention.
  if constexpr (std::is_same_v<T, double>) return iterative_pinv_backward<double>(a, d_z, method, iterations, {});
  else
    return iterative_pinv_backward<double>(a.template cast<double>(), d_z.template cast<double>(), method, iterations,
                                           {})
        .template cast<T>();
}

MatrixR<float> pinv_backward_emulated(const ConstRef<float>& a, const ConstRef<float>& d_z, PinvMethod method,
                                      Index iterations, const Rounding& r) {
  // A landmark kernel that overflowed the format (compute() made Z NaN): its gradient is NaN too, the finding the
  // gradients' check reports; no SVD or iteration runs on it.
  if (r.active() && !all_finite(a))
    return MatrixR<float>::Constant(a.rows(), a.cols(), std::numeric_limits<float>::quiet_NaN());
  if (method == PinvMethod::Svd || !r.active()) return pinv_backward<float>(a, d_z, method, iterations);
  require(d_z.rows() == a.cols() && d_z.cols() == a.rows() && iterations >= 0,
          "pseudo-inverse backward: dZ is {}×{}, Z is {}×{}", d_z.rows(), d_z.cols(), a.cols(), a.rows());
  return iterative_pinv_backward<float>(a, d_z, method, iterations, r);
}

double convergence_order(const std::vector<double>& e, double floor, double ceiling) {
  std::vector<double> orders;
  for (std::size_t k = 1; k + 1 < e.size(); ++k) {
    if (!(e[k - 1] <= ceiling && e[k + 1] >= floor)) continue;
    if (!(e[k - 1] > e[k] && e[k] > e[k + 1])) continue;
    orders.push_back(std::log(e[k + 1] / e[k]) / std::log(e[k] / e[k - 1]));
  }
  if (orders.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::nth_element(orders.begin(), orders.begin() + orders.size() / 2, orders.end());
  return orders[orders.size() / 2];
}

template class Pseudoinverse<float>;
template class Pseudoinverse<double>;
template MatrixR<float> svd_pinv<float>(const ConstRef<float>&, double);
template MatrixR<double> svd_pinv<double>(const ConstRef<double>&, double);
template MatrixR<float> pinv_backward<float>(const ConstRef<float>&, const ConstRef<float>&, PinvMethod, Index, double);
template MatrixR<double> pinv_backward<double>(const ConstRef<double>&, const ConstRef<double>&, PinvMethod, Index,
                                               double);

}  // namespace attnlab
