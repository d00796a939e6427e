// Results that do not depend on the machine: Eigen picks its GEMM blocking (and with it the order in which a long
// product's terms are summed) from the cache sizes it reads from the CPU, so the same product can differ in its
// last bits between an AMD and an Intel machine. The attnlab command pins the sizes it assumes.
#pragma once

#include <string>

namespace attnlab {

/// Fixes the cache sizes Eigen's products assume (L1 48 KiB, L2 1 MiB, L3 384 MiB: what Eigen reads on the AMD
/// EPYC machines the committed results were made on), so that blocking, and summation order, are the same on
/// every CPU. Call once at start-up, before any product; it changes only speed on a machine with other caches.
void pin_eigen_blocking();

/// What computes the products: "Eigen's own kernels" (the default build: the same bits on every CPU), or OpenBLAS
/// with its core type when built with ATTNLAB_USE_BLAS (fast on each CPU, bits following that CPU's kernels: for
/// cost figures, not for committed error values). Benchmarks record it beside their timings.
std::string product_backend();

}  // namespace attnlab
