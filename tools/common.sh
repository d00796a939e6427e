# Shared by the tools/ scripts: where things are, and which Python to use.
# shellcheck shell=bash
ATTNLAB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ATTNLAB_BUILD=${ATTNLAB_BUILD:-$ATTNLAB_ROOT/build}
ATTNLAB_JOBS=${ATTNLAB_JOBS:-$(nproc 2>/dev/null || echo 2)}

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
