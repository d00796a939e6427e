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
  flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
  # No ISA variant (the same code again), no Python module (a sanitized .so would need the runtime preloaded into
  # python3), no examples; -O1 keeps the sanitized tests fast enough.
  # Without unity batches: each source compiled on its own, so that one relying on another's includes or clashing
  # with another's anonymous-namespace names is caught here (the other builds batch them; CMakeLists.txt).
  # shellcheck disable=SC2046  # (empty or two words)
  cmake $(generator_args "$build") -S "$ATTNLAB_ROOT" -B "$build" -DATTNLAB_UNITY_BUILD=OFF \
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
        -R '^(AllMethods|[A-Za-z]+\.|script\.(exact_numpy|cli_errors|experiments)|fuzz\.)' \
        -E '^(script\.(findings|notebooks|install_consumer|trained_attention|bench_peers)|python\.|example\.)'
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
"$ATTNLAB_ROOT/tools/setup.sh" --test-stack
cd "$ATTNLAB_BUILD"
ctest --output-on-failure -j "$ATTNLAB_JOBS" --timeout 900
