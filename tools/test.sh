#!/usr/bin/env bash
# Sets up (packages, build with tests) and runs the whole test suite: GoogleTest through ctest and the script
# tests that check the command against numpy.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$ATTNLAB_ROOT/tools/setup.sh" --python-stack
cd "$ATTNLAB_BUILD"
ctest --output-on-failure -j "$ATTNLAB_JOBS" --timeout 900
