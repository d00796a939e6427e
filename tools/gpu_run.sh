#!/usr/bin/env bash
# The GPU evidence of issues 40 and 39 in one bounded run, from the repository root of a machine with a GPU:
#
#   OUT=/path/to/folder bash tools/gpu_run.sh
#
# nvidia-smi -L and the torch versions, then tools/bench_gpu.py's default grid (CUDA: n = 1024 … 65536, bf16/fp16/fp32,
# d = 64 and 128, forward and forward + backward, non-causal and causal; it stops starting cells after
# GPU_RUN_BENCH_BUDGET seconds, default 270, and is killed at 420 s — its rows are flushed as measured, and the table
# is rebuilt from them if it was killed), then tools/gpu_precision.py (killed at 120 s). Writes five files, flat,
# into $OUT: gpu_<device>.csv, gpu_<device>.md, gpu_precision.csv, gpu_precision.npz and log.txt (everything
# printed). The interpreter is $ATTNLAB_PYTHON, else python3 (the one with CUDA torch). GPU_RUN_QUICK=1 runs tiny
# sizes (a check on the CPU in seconds: tests/scripts/test_bench_gpu.py).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?"OUT must name the folder for the results"}
PY=${ATTNLAB_PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"

if [ "${GPU_RUN_QUICK:-0}" = 1 ]; then
  bench_args=(--n 64,128 --d 16 --heads 2 --dtypes fp32,bf16 --repeats 3)
  precision_args=(--n 256 --temps 1,4 --heads 1 --npz-n 256)
else
  bench_args=(--budget-s "${GPU_RUN_BENCH_BUDGET:-270}")
  precision_args=()
fi

main() {
  local start rc_bench rc_table rc_precision
  start=$(date +%s)
  echo "== gpu_run.sh $(date -u +%FT%TZ) in $ROOT," \
       "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi -L || echo "(no nvidia-smi)"
  "$PY" -c 'import sys, numpy, torch
print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__,
      "CUDA", torch.version.cuda, "threads", torch.get_num_threads(),
      "cuDNN", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device: the CPU")'

  echo "== bench_gpu.py ${bench_args[*]}"
  timeout -k 10 420 "$PY" "$ROOT/tools/bench_gpu.py" --out "$OUT/gpu_{tag}.csv" "${bench_args[@]}"
  rc_bench=$?
  rc_table=0
  if [ "$rc_bench" != 0 ]; then
    echo "== bench_gpu.py ended with $rc_bench: the table from the rows it wrote"
    timeout -k 10 60 "$PY" "$ROOT/tools/bench_gpu.py" --out "$OUT/gpu_{tag}.csv" --table-only
    rc_table=$?
  fi
  echo "== bench: $(( $(date +%s) - start )) s so far"

  echo "== gpu_precision.py ${precision_args[*]}"
  timeout -k 10 120 "$PY" "$ROOT/tools/gpu_precision.py" --out "$OUT/gpu_precision.csv" \
    --npz "$OUT/gpu_precision.npz" "${precision_args[@]}"
  rc_precision=$?
  echo "== done in $(( $(date +%s) - start )) s: bench_gpu rc $rc_bench (table rc $rc_table), gpu_precision rc" \
       "$rc_precision"
  ls -l "$OUT"
  [ "$rc_bench" = 0 ] && [ "$rc_table" = 0 ] && [ "$rc_precision" = 0 ]
}

main 2>&1 | tee "$OUT/log.txt"
