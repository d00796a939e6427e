#!/usr/bin/env bash
# libFuzzer on attnlab's parsers of untrusted text (the .npy reader and the method spec parser, with the method each
# spec builds run on a tiny problem): the fuzz target of tests/fuzz/fuzz_inputs.cpp, built with clang's
# -fsanitize=fuzzer,address,undefined in build-fuzz/, run for SECONDS (default 60) from the corpus in
# build-fuzz/corpus (kept between runs). The test suite runs the same target through a bounded, deterministic mutation
# driver (ctest fuzz.inputs); this is the open-ended search. A finding is written as build-fuzz/crash-*.
#   tools/fuzz.sh [SECONDS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
seconds="${1:-60}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: tools/fuzz.sh [SECONDS]" >&2; exit 2; }
"$ATTNLAB_ROOT/tools/setup.sh" --no-build
if ! command -v clang++ >/dev/null || ! dpkg -s libomp-dev >/dev/null 2>&1; then
  echo "fuzz.sh: installing clang (libFuzzer)" >&2
  apt-get install -y -qq clang libomp-dev >/dev/null
fi
build="$ATTNLAB_ROOT/build-fuzz"
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
CC=clang CXX=clang++ cmake -S "$ATTNLAB_ROOT" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" -DCMAKE_CXX_FLAGS="$flags" -DATTNLAB_LIBFUZZER=ON \
  -DATTNLAB_TEST_ISA_VARIANT=OFF -DATTNLAB_BUILD_PYTHON=OFF -DATTNLAB_BUILD_EXAMPLES=OFF -DATTNLAB_BUILD_CLI=OFF \
  >/dev/null
cmake --build "$build" -j "$ATTNLAB_JOBS" --target attnlab_libfuzzer
mkdir -p "$build/corpus"
cd "$build"
export OMP_NUM_THREADS=1
exec "$build/tests/attnlab_libfuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 "$build/corpus"
