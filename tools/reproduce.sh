#!/usr/bin/env bash
# Sets up, builds, and runs attnlab's main job: every registered method against exact attention on the
# default generated problem, written as tidy CSV under results/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# Same build (tests included) as tools/test.sh: one build directory whose options never flip between scripts.
"$ATTNLAB_ROOT/tools/setup.sh"
mkdir -p "$ATTNLAB_ROOT/results"
out="$ATTNLAB_ROOT/results/compare_default.csv"
"$ATTNLAB_BUILD/bin/attnlab" compare --all --n 1024 --d 64 --seed 0 --dtype f64 --csv "$out"
echo "reproduce: results in $out"
