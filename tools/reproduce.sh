#!/usr/bin/env bash
# Sets up (packages, build), then runs attnlab's main job: every method against exact attention on the default
# generated problem, every experiment at the quick preset (--preset paper for the papers' sizes), and renders
# every figure. Finished points of an interrupted run are kept: running it again resumes.
#   tools/reproduce.sh [--preset quick|paper]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
preset=quick
if [ "${1:-}" = "--preset" ]; then preset=${2:?--preset needs quick or paper}; fi
# Same build (tests included) as tools/test.sh: one build directory whose options never flip between scripts.
"$ATTNLAB_ROOT/tools/setup.sh" --python-stack
cd "$ATTNLAB_ROOT"
mkdir -p results
start=$(date +%s)
build/bin/attnlab compare --all --n 1024 --d 64 --seed 0 --dtype f64 --csv results/compare_default.csv
out_dir=results
[ "$preset" = quick ] || out_dir=results/$preset
for experiment in $(build/bin/attnlab run --help | awk '/^Subcommands:/{s=1;next} s&&NF{print $1}'); do
  build/bin/attnlab run "$experiment" --preset "$preset" --out "$out_dir/$experiment.csv"
done
"$(attnlab_python)" tools/plot.py --results "$out_dir"
echo "reproduce: CSVs in $out_dir/, figures in $out_dir/figures/ ($(( $(date +%s) - start )) s)"
