#!/usr/bin/env bash
# The side-by-side benchmark in one job: attnlab's Google Benchmark suite (every registered method at its defaults,
# the GEMM yardstick, f32 and f64) from two builds, and the PyTorch eager transcriptions (tools/bench_peers.py), then
# the table and the figure. Writes results/bench/{attnlab.json,attnlab_fast.json,peers.csv,merged.csv,table.md,
# bench.png, attnlab_tunables.json, peers_tunables.csv, cost_paths.md; the backward suite's backward.json,
# backward_fast.json, peers_backward.csv, backward.md, backward.png} and re-renders docs/benchmarks.md (its tables).
#   tools/bench.sh [--quick] [--backward-only]   (--quick: n ≤ 4096, float32 only, a few minutes; --backward-only:
#                                                the backward suite and PyTorch autograd only, tables re-rendered)
# The two attnlab builds:
#   default  build/ as tools/setup.sh makes it: x86-64-v3, Eigen's own kernels — the same bits on every CPU, the
#            build that makes the committed results;
#   fast     build-bench/: -march=native, Eigen's products through OpenBLAS (ATTNLAB_USE_BLAS) — the BLAS PyTorch
#            uses here, with the same core type, so that the comparison measures the methods' kernels, not two GEMM
#            libraries. Its bits follow this CPU's kernels: for cost figures only.
# OpenBLAS mis-detects some virtual CPUs and then runs generic kernels: OPENBLAS_CORETYPE is set to the best core
# this CPU runs (SkylakeX with AVX-512, else Haswell with AVX2), for PyTorch and the fast build alike, and recorded;
# BENCH_OPENBLAS_CORETYPE=… chooses another (an inherited OPENBLAS_CORETYPE is not trusted: shells set Haswell).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
quick=0 backward_only=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    --backward-only) backward_only=1 ;;   # the backward suite and its peers only (the forward tables kept)
    *) echo "bench: unknown argument $arg (--quick, --backward-only)" >&2; exit 2 ;;
  esac
done
"$ATTNLAB_ROOT/tools/setup.sh" --python-stack --bench --target attnlab_bench_methods --target attnlab_bench_backward
fast_build="${ATTNLAB_BENCH_BUILD:-$ATTNLAB_ROOT/build-bench}"
configure_fast_build "$fast_build" -DATTNLAB_BUILD_BENCH=ON -DATTNLAB_BUILD_TESTS=OFF -DATTNLAB_BUILD_CLI=OFF
cmake --build "$fast_build" --target attnlab_bench_methods --target attnlab_bench_backward -j"$(nproc)" >/dev/null
out="$ATTNLAB_ROOT/results/bench"
mkdir -p "$out"
best=$(best_openblas_coretype)
if [ -n "${OPENBLAS_CORETYPE:-}" ] && [ "$OPENBLAS_CORETYPE" != "${BENCH_OPENBLAS_CORETYPE:-$best}" ]; then
  echo "bench: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE inherited; using ${BENCH_OPENBLAS_CORETYPE:-$best}" >&2
fi
export OPENBLAS_CORETYPE="${BENCH_OPENBLAS_CORETYPE:-$best}"
# The allocator as users run it: no GLIBC_TUNABLES (an inherited one is dropped and said). The headline tables are
# taken so; the default build and PyTorch are run a second time with glibc's mmap/trim thresholds raised (freed
# buffers stay mapped), which is what the committed tables used to assume, to show what that setting changes: the
# library must not need it (attnlab's methods reuse their buffers across calls; tools/cost_paths.py shows both).
if [ -n "${GLIBC_TUNABLES:-}" ]; then
  echo "bench: GLIBC_TUNABLES=$GLIBC_TUNABLES inherited; unset for the headline runs" >&2
fi
unset GLIBC_TUNABLES
tunables="glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"
echo "bench: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, $(nproc) threads; headline without GLIBC_TUNABLES"
filter='.*'
ns=1024,4096,16384
dtypes=f32,f64
if [ "$quick" = 1 ]; then filter='/f32/n:(1024|4096)/'; ns=1024,4096; dtypes=f32; fi
run_suite() {  # build-dir json [env assignments...]
  local bin=$1/bin json=$2
  shift 2
  env "$@" "$bin/${suite:-attnlab_bench_methods}" --benchmark_filter="$filter" --benchmark_out="$json" \
    --benchmark_out_format=json --benchmark_min_time=0.2
}
if [ "$backward_only" = 0 ]; then
  echo "bench: attnlab, default build"
  run_suite "$ATTNLAB_BUILD" "$out/attnlab.json"
  echo "bench: attnlab, fast build"
  run_suite "$fast_build" "$out/attnlab_fast.json"
  echo "bench: attnlab, default build, GLIBC_TUNABLES=$tunables"
  run_suite "$ATTNLAB_BUILD" "$out/attnlab_tunables.json" GLIBC_TUNABLES="$tunables"
  "$(attnlab_python)" "$ATTNLAB_ROOT/tools/bench_peers.py" --out "$out/peers.csv" --n "$ns" --dtype "$dtypes"
  GLIBC_TUNABLES="$tunables" "$(attnlab_python)" "$ATTNLAB_ROOT/tools/bench_peers.py" --out "$out/peers_tunables.csv" \
    --n "$ns" --dtype "$dtypes"
  # Every path that reports a cost (the benchmark, `run scaling`, `compare`, the module) on the same methods and size,
  # in this run: their ratios to the benchmark should be ~1.
  "$(attnlab_python)" "$ATTNLAB_ROOT/tools/cost_paths.py" --n 4096 --out "$out/cost_paths.md"
fi
# The backward suite (every method's backward and training step, exact's against the GEMM) and PyTorch autograd of
# the same transcriptions, without GLIBC_TUNABLES.
echo "bench: backward, default and fast builds"
suite=attnlab_bench_backward run_suite "$ATTNLAB_BUILD" "$out/backward.json"
suite=attnlab_bench_backward run_suite "$fast_build" "$out/backward_fast.json"
"$(attnlab_python)" "$ATTNLAB_ROOT/tools/bench_peers.py" --backward --out "$out/peers_backward.csv" --n "$ns" \
  --dtype "$dtypes"
"$(attnlab_python)" "$ATTNLAB_ROOT/tools/plot_bench.py" --dir "$out"
"$(attnlab_python)" "$ATTNLAB_ROOT/tools/findings.py"   # docs/benchmarks.md quotes the float32 table
