#!/usr/bin/env bash
# Sets up (packages, build), then runs attnlab's main job: every method against exact attention on the default
# generated problem, every experiment at the quick preset (--preset paper for the papers' sizes), and renders
# every figure. The `trained`/`initialized` sources come from tools/trained_attention.py: it exports the small
# transformer's attention into data/attention (and the causal model's into data/attention_causal, from
# models/trained_attention_causal.pt), from the committed weights models/trained_attention.pt when their
# training key matches (training is deterministic: they are what training gives), else it trains (~4 min on one
# core, beside the build) and writes them. The `pretrained` source (all-MiniLM-L6-v2's heads, their upstream
# gradients) comes from tools/pretrained.py --export data/pretrained (~10 s, from the wheel the set-up fetched;
# the committed checksums, models/pretrained.export.json, on every x86-64 CPU). Each run recomputes every CSV of the
# main job from scratch (the committed ones are the previous run's), except after an interrupted run: then the
# finished points are kept and the sweeps resume. The CSVs of the tools it does not run are kept.
#   tools/reproduce.sh [--preset quick|paper]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
preset=quick
if [ "${1:-}" = "--preset" ]; then preset=${2:?--preset needs quick or paper}; fi
cd "$ATTNLAB_ROOT"
t0=$(date +%s)
# The packages the build needs first; then the build in the foreground while, in the background, the Python stack
# (matplotlib, pandas, torch) is installed and the model's attention exported (log: data/trained_attention.log).
# The install and the exports run at the build's priority: the build uses both cores throughout, so at nice 19 they
# only starve until the build is done and then run alone, while side by side all finish sooner. The exports are one
# torch thread each (no OpenMP pool to oversubscribe) and ~20 CPU-s: at nice 19 they ran after the build, 20 s of one
# core while the other idled (2026-11-29, a 2-core Intel Xeon: the build done after 381 s, the exports after 401 s).
"$ATTNLAB_ROOT/tools/setup.sh" --no-build
mkdir -p data
echo "reproduce: installing the Python stack and exporting the small transformer's and the pretrained model's" \
     "attention in the background (log: data/trained_attention.log)"
{ "$ATTNLAB_ROOT/tools/setup.sh" --python-stack --no-build &&
  "$(attnlab_python)" tools/trained_attention.py --out data/attention --weights models/trained_attention.pt &&
  "$(attnlab_python)" tools/trained_attention.py --objective causal --out data/attention_causal \
    --weights models/trained_attention_causal.pt &&
  "$(attnlab_python)" tools/pretrained.py --export data/pretrained; } > data/trained_attention.log 2>&1 &
train_pid=$!
trap 'kill $train_pid 2>/dev/null || true' EXIT
# Same configuration as tools/test.sh (options never flip between scripts), but only the command and the Python
# module (tools/dropin.py runs the trained models through it) are built here.
"$ATTNLAB_ROOT/tools/setup.sh" --target attnlab_cli --target attnlab_python
t_build=$(date +%s)
if ! wait $train_pid; then
  echo "reproduce: the Python stack's install, tools/trained_attention.py or tools/pretrained.py failed:" >&2
  tail -5 data/trained_attention.log >&2
  exit 1
fi
trap - EXIT
grep -v Warning data/trained_attention.log | grep -E "wrote|^pretrained: .*(windows|up to date)"
start=$(date +%s)
echo "reproduce: packages, build and model export took $(( start - t0 )) s (the build done after $(( t_build - t0 )) s)"
out_dir=results
[ "$preset" = quick ] || out_dir=results/$preset
mkdir -p "$out_dir"
marker=$out_dir/.reproduce-incomplete
# What the main job writes: the command's experiments, then the PyTorch studies below. Only these are recomputed; every
# other CSV under results/ comes from a tool the main job does not run (tools/pretrained_study.py's pretrained_*,
# tools/stabilisers.py's stabilisers) and is kept, since the findings read it (a fresh clone's main job deleted
# stabilisers.csv.gz, and tools/findings.py then failed on its missing numbers).
experiments=$(build/bin/attnlab run --help | awk '/^Subcommands:/{s=1;next} s&&NF{print $1}')
outputs=(compare_default.csv timings.csv dropin.csv.gz finetune.csv.gz precision_model.csv.gz)
for experiment in $experiments; do outputs+=("$experiment.csv.gz"); done
if [ -e "$marker" ]; then
  echo "reproduce: resuming the interrupted run in $out_dir/"
else
  for f in "${outputs[@]}"; do rm -f "$out_dir/$f" "$out_dir/$f.config" "$out_dir/$f.partial"; done
fi
touch "$marker"
# The paper preset's scaling sweep reaches n = 65536, where a materialized float32 P is 16 GiB: the memory limit
# (ATTNLAB_MAX_MEMORY, default 8G) refuses it instead of letting it swap; the refusal is a row in the CSV.
limit=()
[ "$preset" = quick ] || limit=(--max-memory "${ATTNLAB_MAX_MEMORY:-8G}")
build/bin/attnlab compare --all --n 1024 --d 64 --seed 0 --dtype f64 --csv "$out_dir/compare_default.csv"
# Wall-clock time per experiment, kept beside the CSVs (a resumed run times only what it computed).
timings=$out_dir/timings.csv
[ -e "$timings" ] || echo "experiment,preset,seconds,cores" > "$timings"
# One experiment of the command, timed.
run_experiment() {
  local experiment=$1 t_exp
  shift
  t_exp=$(date +%s)
  build/bin/attnlab "${limit[@]}" run "$experiment" --preset "$preset" --out "$out_dir/$experiment.csv.gz" "$@"
  echo "$experiment,$preset,$(( $(date +%s) - t_exp )),$(nproc)" >> "$timings"
}
# One PyTorch study (tools/NAME.py, resumable like the rest), timed; skipped when its CSV is there.
run_study() {
  local name=$1 t_exp
  shift
  [ -e "$out_dir/$name.csv.gz" ] && return 0
  t_exp=$(date +%s)
  ATTNLAB_BUILD="$ATTNLAB_BUILD" "$(attnlab_python)" "tools/$name.py" --out "$out_dir/$name.csv.gz" "$@"
  echo "$name,$preset,$(( $(date +%s) - t_exp )),$(nproc)" >> "$timings"
}
# First what times something, alone: nothing else shares the machine while it measures. The experiments of the
# command, then fine-tuning after the swap: each family trained on inside the trained models through attnlab's
# backward, its units side by side, one thread each (the step times are one thread's, the other core training too:
# on 2 cores, single-threaded processes use them better than one of two threads, whose small torch calls scale
# poorly).
for experiment in $experiments; do
  [ "$experiment" = precision ] || run_experiment "$experiment"
done
jobs=$(( $(nproc) < 4 ? $(nproc) : 4 ))
run_study finetune --preset "$preset" --jobs "$jobs" --threads 1
# Then what times nothing, side by side: the precision experiment (its points side by side), the drop-in study (the
# trained models with each approximation swapped in: processes of one thread), the models with their attention in
# emulated bf16 / fp16 storage, and the figures of what is finished. No value depends on threads or processes but a
# few of the drop-in study's last bits on torch's threads (the committed CSV is this run's: one thread).
# OpenMP's waiting threads sleep instead of spinning (OMP_WAIT_POLICY=passive; a process's default is every core):
# beside other processes, spinning threads took their cores (the models in bf16/fp16 at attnlab's default threads
# took 339 s instead of ~50).
export OMP_WAIT_POLICY=passive
# A script's background jobs ignore Ctrl-C: an interrupt stops them all (their finished work is kept), not the
# script alone, or a rerun would find them still writing.
trap 'trap - INT TERM; kill 0' INT TERM
pids=()
run_experiment precision & pids+=($!)
run_study dropin --preset "$preset" --jobs "$jobs" --threads 1 & pids+=($!)
run_study precision_model --threads 1 & pids+=($!)
late=(dropin precision)   # figures drawn after these runs
early=()
plots=$("$(attnlab_python)" -c "import sys; sys.path.insert(0, 'tools'); import plot
print(*[n for n in plot.PLOTS if plot.csv_path(sys.argv[1], n)])" "$out_dir")
for name in $plots; do
  [[ " ${late[*]} " == *" $name "* ]] || early+=("$name")
done
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$(attnlab_python)" tools/plot.py --results "$out_dir" "${early[@]}" \
  > "$out_dir/.figures.log" & pids+=($!)
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
trap - INT TERM
if [ "$failed" = 1 ]; then
  echo "reproduce: a run failed (above); rerunning tools/reproduce.sh resumes it" >&2
  exit 1
fi
rm -f "$marker"
# The last figures and the findings read the same CSVs and nothing of each other: drawn side by side.
cat "$out_dir/.figures.log" && rm -f "$out_dir/.figures.log"
"$(attnlab_python)" tools/plot.py --results "$out_dir" "${late[@]}" &
plot_pid=$!
if [ "$preset" = quick ]; then
  "$(attnlab_python)" tools/findings.py --results "$out_dir"   # the numbers README.md, docs/ and the notebooks quote
else  # the findings are defined on the quick grid; on another one they are a convenience, not a requirement
  "$(attnlab_python)" tools/findings.py --results "$out_dir" ||
    echo "reproduce: tools/findings.py could not summarise $out_dir (its findings are defined on the quick grid)" >&2
fi
wait $plot_pid
now=$(date +%s)
echo "reproduce: CSVs in $out_dir/, figures in $out_dir/figures/" \
     "(experiments $(( now - start )) s, all $(( now - t0 )) s)"
