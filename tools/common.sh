# Shared by the tools/ scripts: where things are, and which Python to use.
# shellcheck shell=bash
ATTNLAB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ATTNLAB_BUILD=${ATTNLAB_BUILD:-$ATTNLAB_ROOT/build}
ATTNLAB_JOBS=${ATTNLAB_JOBS:-$(nproc 2>/dev/null || echo 2)}

# The generator for a build directory DIR: Ninja (setup.sh installs it) for a new one — it compiles a target's sources
# while the targets it links are still building, which Make does not (measured: 349 → 316 s for the command and the
# module) — and whatever an existing DIR was configured with (CMake refuses to switch).
generator_args() {
  local cache=$1/CMakeCache.txt
  if [ -e "$cache" ]; then
    grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$cache" && echo "-G Ninja"
  elif command -v ninja >/dev/null; then
    echo "-G Ninja"
  fi
  return 0
}

# The Python that has Debian's numpy (and matplotlib, pandas, torch): ATTNLAB_PYTHON if set, else
# /usr/bin/python3, else the first python3 on PATH that imports numpy. Never blindly the first python3.
attnlab_python() {
  if [ -n "${ATTNLAB_PYTHON:-}" ]; then echo "$ATTNLAB_PYTHON"; return; fi
  local c
  for c in /usr/bin/python3 $(type -ap python3 2>/dev/null); do
    if [ -x "$c" ] && "$c" -c "import numpy" >/dev/null 2>&1; then echo "$c"; return; fi
  done
  echo /usr/bin/python3
}

# The best OpenBLAS core type this CPU runs (OpenBLAS mis-detects some virtual CPUs and then runs generic kernels).
best_openblas_coretype() {
  if grep -q avx512f /proc/cpuinfo; then echo SkylakeX; else echo Haswell; fi
}

# The fast build (tools/bench.sh's cost figures, tools/test.sh --fast-build): -march=native and Eigen's products
# through OpenBLAS. Configures DIR with these flags and any given after it.
configure_fast_build() {
  local dir=$1
  shift
  # shellcheck disable=SC2046  # (empty or two words)
  cmake $(generator_args "$dir") -S "$ATTNLAB_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
        -DATTNLAB_USE_BLAS=ON -DATTNLAB_NATIVE=ON \
        -DATTNLAB_BUILD_PYTHON=OFF -DATTNLAB_BUILD_EXAMPLES=OFF "$@" >/dev/null
}

# Installs the Debian packages among "$@" that are missing (as root, or through sudo), saying which under the name
# $1 (the calling script's); apt's lists are fetched at most once an hour (a later call, e.g. reproduce.sh's second
# one for the Python stack, uses them). APT_INSTALL_OPTIONS: extra options of apt-get install.
install_debian_packages() {
  local who=$1 missing=() p sudo=""
  shift
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$who: all $# Debian packages present"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -60 2>/dev/null | head -1)" ]; then
    $sudo apt-get update -qq
  fi
  echo "$who: installing ${missing[*]}"
  # shellcheck disable=SC2086  # (options, word-split on purpose)
  $sudo apt-get install -y -qq --no-install-recommends ${APT_INSTALL_OPTIONS:-} "${missing[@]}" >/dev/null
}
