#!/usr/bin/env bash
# attnlab installs and is usable from another CMake project with find_package(attnlab).
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
mkdir -p "$work/consumer"
cat > "$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(consumer CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(attnlab REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE attnlab::attnlab)
CM
cat > "$work/consumer/main.cpp" <<'CPP'
#include <attnlab/attnlab.hpp>  // the umbrella header compiles on its own from the installed tree
#include <cstdio>
int main() {
  attnlab::Rng rng(1);
  auto q = attnlab::gaussian_matrix<double>(40, 8, rng), k = attnlab::gaussian_matrix<double>(40, 8, rng),
       v = attnlab::gaussian_matrix<double>(40, 4, rng);
  auto m = attnlab::make_method<double>("exact");
  m->compute(q, k);
  const double err = (m->output(v) - attnlab::exact_matrix<double>(q, k, {}) * v).norm();
  // A typed class with its options struct (attnlab/methods/nystrom.hpp): the same method as the spec.
  attnlab::NystromOptions o;
  o.landmarks = 10;
  attnlab::NystromMethod<double> nys(o);
  nys.compute(q, k);
  auto by_spec = attnlab::make_method<double>("nystrom:landmarks=10");
  by_spec->compute(q, k);
  const double same = (nys.output(v) - by_spec->output(v)).norm();
  std::printf("consumer: %s err=%g; %s same=%g\n", m->spec().c_str(), err, nys.spec().c_str(), same);
  return err < 1e-12 && same == 0 ? 0 : 1;
}
CPP
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
  >/dev/null
cmake --build "$work/consumer/build" -j2 >/dev/null
"$work/consumer/build/consumer"
# The Python module, when built, installs under the prefix where Debian's python3 looks (lib/python3.X/dist-packages).
# The module is a package: attnlab/__init__.py over the compiled attnlab/_core.
if ls "$build"/python/attnlab/_core*.so >/dev/null 2>&1; then
  site=$(ls -d "$work"/prefix/lib/python3.*/dist-packages)
  ls "$site"/attnlab/__init__.py "$site"/attnlab/_core*.so >/dev/null
  PYTHONPATH="$site" /usr/bin/python3 -c "
import attnlab, numpy as np
q = np.eye(4); o = attnlab.apply('exact', q, q, q)
assert o.shape == (4, 4) and attnlab.__file__.startswith('$site'), attnlab.__file__
print('module installed:', attnlab.__file__)"
fi
