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

CacheSizes pinned_cache_sizes() { return {48 * 1024, 1024 * 1024, 384 * 1024 * 1024}; }

// Eigen's products on one thread, whatever the thread count: Eigen splits a large product made outside a parallel
// region among OpenMP threads (parallelize_gemm), and its blocking then takes another depth (kc: 320 against 344 for
// a float product of depth 1024 at the pinned L1), so such a product's last bits followed OMP_NUM_THREADS and the
// machine's core count (one thread gave other values than two, measured on the quick preset). attnlab runs its own
// tiles and row chunks in parallel, in a fixed order; the products inside them were sequential already.
// EIGEN_DONT_PARALLELIZE (lib/CMakeLists.txt) removes the split where attnlab's flags compile Eigen; this covers a
// program compiled without them.
void pin_eigen_blocking() {
  set_eigen_cache_sizes(pinned_cache_sizes());
  Eigen::setNbThreads(1);
}

CacheSizes eigen_cache_sizes() { return {Eigen::l1CacheSize(), Eigen::l2CacheSize(), Eigen::l3CacheSize()}; }

void set_eigen_cache_sizes(const CacheSizes& sizes) { Eigen::setCpuCacheSizes(sizes.l1, sizes.l2, sizes.l3); }

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

// The pin, before main() in every program that links attnlab and when a module linking it (the Python module) loads:
// the products' summation order is then the same on every CPU, whoever calls the library. Eigen reads its cache
// sizes lazily, on the first product or query (a function-local static), so this initializer needs no order among
// others: it queries and then overrides them, and a product made later in any initializer or in main() sees the pin.
// The library is linked with --undefined=attnlab_eigen_pinned (lib/CMakeLists.txt), so that this object, and with it
// this initializer, is always part of the program.
extern "C" {
extern const int attnlab_eigen_pinned;
const int attnlab_eigen_pinned = (attnlab::pin_eigen_blocking(), 1);
}
