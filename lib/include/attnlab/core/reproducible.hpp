// Results that do not depend on the machine: Eigen picks its GEMM blocking (and with it the order in which a long
// product's terms are summed) from the cache sizes it reads from the CPU, so the same product can differ in its
// last bits between an AMD and an Intel machine. The library pins the sizes it assumes when a program that links it
// starts (a static initializer in lib/src/core/reproducible.cpp, kept by the link option --undefined=
// attnlab_eigen_pinned): the command, the benchmarks, the Python module and a user's program alike. Eigen's products
// also stay on one thread (EIGEN_DONT_PARALLELIZE, and Eigen::setNbThreads(1) in the same initializer): split among
// threads, a product takes another blocking depth, so the thread count would change the last bits. attnlab splits its
// own work among threads in a fixed order instead (tiles, row chunks, detail/tall_products.hpp).
// What this does to a program that links attnlab: the pinned cache sizes and the thread count are Eigen's, for the
// whole program, so the user's own Eigen products also block as pinned and run on one thread (Eigen::nbThreads() is
// 1), and the CMake target attnlab::attnlab adds EIGEN_DONT_PARALLELIZE to the user's sources. A program that calls
// Eigen::setNbThreads(n > 1) or setCpuCacheSizes afterwards changes attnlab's products too (their bits, not their
// correctness); pin_eigen_blocking() restores both.
#pragma once

#include <cstddef>
#include <string>

namespace attnlab {

/// Fixes the cache sizes Eigen's products assume (L1 48 KiB, L2 1 MiB, L3 384 MiB: what Eigen reads on the AMD
/// EPYC machines the committed results were made on), so that blocking, and summation order, are the same on
/// every CPU; it changes only speed on a machine with other caches. Also holds Eigen's products to one thread
/// (Eigen::setNbThreads(1)). Done before main() (or when the Python module loads) in every program that links
/// attnlab; call it again to undo set_eigen_cache_sizes or a later Eigen::setNbThreads.
void pin_eigen_blocking();

/// Cache sizes in bytes, as Eigen's products take them.
struct CacheSizes {
  std::ptrdiff_t l1 = 0, l2 = 0, l3 = 0;
};
/// What pin_eigen_blocking() sets.
CacheSizes pinned_cache_sizes();
/// What Eigen's products assume now (Eigen::l1CacheSize() ...), in this program (or this module).
CacheSizes eigen_cache_sizes();
/// Sets other sizes (Eigen::setCpuCacheSizes): a test's stand-in for a CPU with other caches.
void set_eigen_cache_sizes(const CacheSizes& sizes);

/// What computes the products: "Eigen's own kernels" (the default build: the same bits on every CPU), or OpenBLAS
/// with its core type when built with ATTNLAB_USE_BLAS (fast on each CPU, bits following that CPU's kernels: for
/// cost figures, not for committed error values). Benchmarks record it beside their timings.
std::string product_backend();

}  // namespace attnlab
