#!/usr/bin/env bash
# The side-by-side benchmark in one job: attnlab's Google Benchmark suite (every registered method at its defaults,
# the GEMM yardstick, f32 and f64) and the PyTorch eager transcriptions (tools/bench_peers.py), then the table and
# the figure. Writes results/bench/{attnlab.json,peers.csv,table.md,bench.png} and re-renders README.md (its table).
#   tools/bench.sh [--quick]     (--quick: n ≤ 4096, float32 only, a few minutes)
# OpenBLAS (PyTorch's BLAS here) mis-detects some virtual CPUs and then runs generic kernels: OPENBLAS_CORETYPE is set
# to the real core (Haswell for AVX2, SkylakeX for AVX-512) unless already set, and recorded in the results.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
quick=0
[ "${1:-}" = "--quick" ] && quick=1
"$ATTNLAB_ROOT/tools/setup.sh" --python-stack --bench --target attnlab_bench_methods
out="$ATTNLAB_ROOT/results/bench"
mkdir -p "$out"
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -q avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; else export OPENBLAS_CORETYPE=Haswell; fi
fi
# Both processes keep freed buffers mapped (glibc's allocator otherwise returns every large buffer to the kernel,
# and the next call pays a page fault per 4 KiB to get it back: half of Nyström's time at n = 65536 in float64).
# The benchmark then measures the methods' kernels in steady state, the same way for attnlab and PyTorch; recorded.
export GLIBC_TUNABLES="${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184}"
echo "bench: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, GLIBC_TUNABLES=$GLIBC_TUNABLES, $(nproc) threads"
filter='.*'
ns=1024,4096,16384
dtypes=f32,f64
if [ "$quick" = 1 ]; then filter='/f32/n:(1024|4096)/'; ns=1024,4096; dtypes=f32; fi
"$ATTNLAB_BUILD/bin/attnlab_bench_methods" --benchmark_filter="$filter" --benchmark_out="$out/attnlab.json" \
  --benchmark_out_format=json --benchmark_min_time=0.2
"$(attnlab_python)" "$ATTNLAB_ROOT/tools/bench_peers.py" --out "$out/peers.csv" --n "$ns" --dtype "$dtypes"
"$(attnlab_python)" "$ATTNLAB_ROOT/tools/plot_bench.py" --dir "$out"
"$(attnlab_python)" "$ATTNLAB_ROOT/tools/findings.py"   # README quotes the float32 table
