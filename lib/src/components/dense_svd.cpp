// The library's one instantiation of Eigen's dense SVDs (dense_svd.hpp says why).
#include "attnlab/components/dense_svd.hpp"

#include <Eigen/SVD>

namespace attnlab {
namespace {

template <class Svd>
DenseSvd factors(const Svd& svd, unsigned options) {
  DenseSvd out;
  out.values = svd.singularValues();
  if (options & (Eigen::ComputeThinU | Eigen::ComputeFullU)) out.u = svd.matrixU();
  if (options & (Eigen::ComputeThinV | Eigen::ComputeFullV)) out.v = svd.matrixV();
  return out;
}

}  // namespace

DenseSvd bdc_svd(const Eigen::MatrixXd& a, unsigned options) {
  return factors(Eigen::BDCSVD<Eigen::MatrixXd>(a, options), options);
}

DenseSvd jacobi_svd(const Eigen::MatrixXd& a, unsigned options) {
  return factors(Eigen::JacobiSVD<Eigen::MatrixXd>(a, options), options);
}

}  // namespace attnlab
