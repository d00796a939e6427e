#!/usr/bin/env bash
# Sets up (packages, build), then runs attnlab's main job: every method against exact attention on the default
# generated problem, every experiment at the quick preset (--preset paper for the papers' sizes), and renders
# every figure. Also trains the small transformer whose attention is the `trained`/`initialized` source
# (tools/trained_attention.py, ~4 min on 2 cores, cached in data/attention). Each run recomputes every CSV from
# scratch (the committed ones are the previous run's), except after an interrupted run: then the finished points are
# kept and the sweeps resume.
#   tools/reproduce.sh [--preset quick|paper]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
preset=quick
if [ "${1:-}" = "--preset" ]; then preset=${2:?--preset needs quick or paper}; fi
# Same build (tests included) as tools/test.sh: one build directory whose options never flip between scripts.
"$ATTNLAB_ROOT/tools/setup.sh" --python-stack
cd "$ATTNLAB_ROOT"
start=$(date +%s)
out_dir=results
[ "$preset" = quick ] || out_dir=results/$preset
mkdir -p "$out_dir"
marker=$out_dir/.reproduce-incomplete
if [ -e "$marker" ]; then
  echo "reproduce: resuming the interrupted run in $out_dir/"
else
  rm -f "$out_dir"/*.csv "$out_dir"/*.csv.config "$out_dir"/*.csv.config.txt
fi
touch "$marker"
"$(attnlab_python)" tools/trained_attention.py --out data/attention
build/bin/attnlab compare --all --n 1024 --d 64 --seed 0 --dtype f64 --csv "$out_dir/compare_default.csv"
for experiment in $(build/bin/attnlab run --help | awk '/^Subcommands:/{s=1;next} s&&NF{print $1}'); do
  build/bin/attnlab run "$experiment" --preset "$preset" --out "$out_dir/$experiment.csv"
done
rm -f "$marker"
"$(attnlab_python)" tools/plot.py --results "$out_dir"
echo "reproduce: CSVs in $out_dir/, figures in $out_dir/figures/ ($(( $(date +%s) - start )) s)"
