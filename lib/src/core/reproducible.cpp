// Pinned Eigen blocking and the products' backend (see reproducible.hpp).
#include "attnlab/core/reproducible.hpp"

#include <Eigen/Core>

#include <string>

#ifdef EIGEN_USE_BLAS
// OpenBLAS's own entry points, weak: another BLAS behind EIGEN_USE_BLAS simply lacks them.
extern "C" {
__attribute__((weak)) void openblas_set_num_threads(int);
__attribute__((weak)) char* openblas_get_corename(void);
}

namespace {
// attnlab runs its tiles and row chunks on OpenMP threads, each calling the BLAS on a small product; OpenBLAS's own
// pool (as many threads as cores) on top of that oversubscribes the cores: 2–30× slower, measured. One thread per
// caller, set before main. The library is linked with --undefined=attnlab_blas_pinned (lib/CMakeLists.txt) so
// that this object, and with it this initializer, is always part of a program that links attnlab.
int pin_blas_threads() {
  if (openblas_set_num_threads) openblas_set_num_threads(1);
  return 1;
}
}  // namespace

extern "C" {
extern const int attnlab_blas_pinned;
const int attnlab_blas_pinned = pin_blas_threads();
}
#endif

namespace attnlab {

void pin_eigen_blocking() { Eigen::setCpuCacheSizes(48 * 1024, 1024 * 1024, 384 * 1024 * 1024); }

std::string product_backend() {
#ifdef EIGEN_USE_BLAS
  std::string core = openblas_get_corename ? openblas_get_corename() : "";
  return openblas_set_num_threads ? "OpenBLAS (" + core + " kernels, one thread per attnlab thread)"
                                  : "an external BLAS (EIGEN_USE_BLAS)";
#else
  return "Eigen's own kernels";
#endif
}

}  // namespace attnlab
