#!/usr/bin/env bash
# Sets up (packages, build with tests) and runs the whole test suite: GoogleTest through ctest, the script tests that
# check the command against numpy, the Python module's pytest suite, the examples and the bounded fuzz run.
#   tools/test.sh               the suite (what CI runs)
#   tools/test.sh --sanitize    the C++ suite, the command's script tests and the fuzz driver again, built with
#                               AddressSanitizer + UndefinedBehaviorSanitizer in build-sanitize/ (every finding fatal)
#   tools/test.sh --fast-build  the GoogleTest suite on tools/bench.sh's fast build (build-bench-tests/: -march=native,
#                               products through OpenBLAS): its bits follow the CPU, its results must hold the same
#                               tolerances
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ "${1:-}" = "--sanitize" ]; then
  "$ATTNLAB_ROOT/tools/setup.sh" --python-stack --no-build
  build="$ATTNLAB_ROOT/build-sanitize"
  # UBSan without its null and alignment checks, which instrument every reference Eigen binds and took a third of
  # the sanitized build's time (measured on the heaviest test source: 130 s with them, 97 s without): a null
  # dereference still stops the run (ASan reports the SEGV with its stack), and x86-64 does not fault on an
  # unaligned access (an aligned vector load of misaligned data faults, and ASan reports the SEGV too).
  flags="-fsanitize=address,undefined -fno-sanitize=null,alignment -fno-sanitize-recover=all -fno-omit-frame-pointer"
  flags+=" -g1"
  # Built for this CPU (-march=native): on an AVX-512 machine that is the other code path (the normal build is
  # x86-64-v3, AVX2), so the whole C++ suite also runs there — once, instead of a second normal build of the library
  # (docs/testing.md, "Both code paths"). No Python module (a sanitized .so would need the runtime preloaded into
  # python3), no examples; -O1 keeps the sanitized tests fast enough. In unity batches like the other builds: file by
  # file the sanitized build alone outlasted CI's time on a 2-core machine (`-DATTNLAB_UNITY_BUILD=OFF` checks that
  # each source compiles on its own; docs/testing.md).
  # shellcheck disable=SC2046  # (empty or two words)
  cmake $(generator_args "$build") -S "$ATTNLAB_ROOT" -B "$build" -DATTNLAB_NATIVE=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" \
        -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
        -DATTNLAB_TEST_ISA_VARIANT=OFF -DATTNLAB_BUILD_PYTHON=OFF -DATTNLAB_BUILD_EXAMPLES=OFF \
        -DATTNLAB_PYTHON="$(attnlab_python)" >/dev/null
  cmake --build "$build" -j "$ATTNLAB_JOBS" --target attnlab_tests attnlab_cli attnlab_fuzz
  cd "$build"
  # Leaks are reported too; OpenMP's runtime keeps its thread pool for the process's life: not a leak of ours.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
  export LSAN_OPTIONS="suppressions=$ATTNLAB_ROOT/tests/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  start=$(date +%s)
  ctest --output-on-failure -j "$ATTNLAB_JOBS" --timeout 1800 \
        -R '^(AllMethods/|[A-Z][A-Za-z0-9]*\.|script\.(exact_numpy|cli_errors|experiments)$|fuzz\.)'
  echo "test.sh --sanitize: passed in $(( $(date +%s) - start )) s of tests"
  exit 0
fi
if [ "${1:-}" = "--fast-build" ]; then
  "$ATTNLAB_ROOT/tools/setup.sh" --no-build
  build="$ATTNLAB_ROOT/build-bench-tests"
  configure_fast_build "$build" -DATTNLAB_TEST_ISA_VARIANT=OFF
  cmake --build "$build" -j "$ATTNLAB_JOBS" --target attnlab_tests
  export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$(best_openblas_coretype)}"
  "$build/tests/attnlab_tests"
  exit 0
fi
# The -march=native path is tested in the sanitized build (above), not by a second build of the library here.
"$ATTNLAB_ROOT/tools/setup.sh" --test-stack -- -DATTNLAB_TEST_ISA_VARIANT=OFF
cd "$ATTNLAB_BUILD"
ctest --output-on-failure -j "$ATTNLAB_JOBS" --timeout 900
