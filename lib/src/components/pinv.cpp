// Iterative and SVD pseudo-inverses with convergence histories.
#include "attnlab/components/pinv.hpp"

#include "attnlab/core/error.hpp"

#include <Eigen/SVD>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

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
  Eigen::BDCSVD<Eigen::MatrixXd> svd(ad, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const auto& s = svd.singularValues();
  if (rcond <= 0) rcond = std::numeric_limits<T>::epsilon() * double(std::max(a.rows(), a.cols()));
  const double cut = s.size() ? rcond * s(0) : 0;
  Eigen::VectorXd inv = s;
  for (Index i = 0; i < s.size(); ++i) inv(i) = s(i) > cut ? 1.0 / s(i) : 0.0;
  const Eigen::MatrixXd z = svd.matrixV() * inv.asDiagonal() * svd.matrixU().transpose();
  return z.cast<T>();
}

template <typename T>
Pseudoinverse<T>& Pseudoinverse<T>::compute(const ConstRef<T>& a) {
  require(a.rows() > 0 && a.cols() > 0, "pseudo-inverse of an empty matrix");
  require(a.allFinite(), "pseudo-inverse: the matrix has non-finite entries");
  residuals_.clear();
  errors_.clear();
  const bool square = a.rows() == a.cols();
  const bool track_error = reference_.size() > 0;
  if (track_error)
    require(reference_.rows() == a.cols() && reference_.cols() == a.rows(), "pseudo-inverse: reference has the wrong shape");
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
  // Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞): ‖A‖₁ the largest column sum, ‖A‖∞ the largest row sum of |A| (the initialisation Xiong et al. 2021 use).
  const double norm1 = a.cwiseAbs().colwise().sum().maxCoeff();
  const double norminf = a.cwiseAbs().rowwise().sum().maxCoeff();
  require(norm1 > 0 && norminf > 0, "pseudo-inverse of the zero matrix");
  z_ = a.transpose() / T(norm1 * norminf);
  const Index m = a.rows();
  const MatrixR<T> I = MatrixR<T>::Identity(m, m);
  MatrixR<T> az = a * z_, t(m, m), zn;
  record(az);
  status_ = Status::Success;
  for (Index k = 0; k < iters_; ++k) {
    if (tol_ > 0 && square && residuals_.back() <= tol_) break;
    if (method_ == PinvMethod::Order3) {
      // Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ)))
      t = T(7) * I - az;
      t = T(15) * I - az * t;
      t = T(13) * I - az * t;
      zn.noalias() = z_ * t;
      z_ = T(0.25) * zn;
    } else {
      // Z ← Z (2I − AZ)
      t = T(2) * I - az;
      zn.noalias() = z_ * t;
      z_.swap(zn);
    }
    az.noalias() = a * z_;
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

}  // namespace attnlab
