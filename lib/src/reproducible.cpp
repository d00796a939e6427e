// Pinned Eigen blocking (see reproducible.hpp).
#include "attnlab/reproducible.hpp"

#include <Eigen/Core>

namespace attnlab {

void pin_eigen_blocking() { Eigen::setCpuCacheSizes(48 * 1024, 1024 * 1024, 384 * 1024 * 1024); }

}  // namespace attnlab
