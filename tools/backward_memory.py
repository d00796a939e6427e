"""Peak memory of exact attention's backward (attnlab.backward("exact", ...): FlashAttention-2's Algorithm 2, O(n)
memory) against n, float32, d = 64: each n in a fresh process (its peak resident set, ru_maxrss, is that process's
alone), beside the bytes of its inputs and outputs and of the n × n matrix a materializing backward (PyTorch autograd
of softmax(QKᵀ)V keeps P) would hold.

    /usr/bin/python3 tools/backward_memory.py [--n 4096 16384 65536] [--out results/bench/backward_memory.csv]

Writes a tidy CSV (n, d, metric, value): peak_rss_bytes, baseline_rss_bytes (the same process after loading the
module and making the inputs, before the call), arrays_bytes (Q, K, V, dO in; dQ, dK, dV out), p_matrix_bytes, and
seconds. Needs the built module (PYTHONPATH=build/python, as tools/test.sh sets it).
"""
import argparse
import csv
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import numpy as np
import attnlab
n, d = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(4))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
dq, dk, dv = attnlab.backward("exact", q, k, v, do)
seconds = time.perf_counter() - t
assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "base": base,
                  "seconds": seconds}))
"""


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--out", default="results/bench/backward_memory.csv")
    a = ap.parse_args(argv)
    rows = []
    for n in a.n:
        r = subprocess.run([sys.executable, "-c", CHILD, str(n), str(a.d)], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"backward_memory: n = {n} failed: {r.stderr.strip().splitlines()[-1:]}")
        m = json.loads(r.stdout)
        values = {"peak_rss_bytes": m["peak"], "baseline_rss_bytes": m["base"], "arrays_bytes": 7 * n * a.d * 4,
                  "p_matrix_bytes": n * n * 4, "seconds": round(m["seconds"], 3)}
        rows += [{"n": n, "d": a.d, "metric": k, "value": v} for k, v in values.items()]
        print(f"n = {n:6d}: peak {m['peak'] / 2**20:8.1f} MiB (before the call {m['base'] / 2**20:7.1f} MiB; "
              f"arrays {values['arrays_bytes'] / 2**20:6.1f} MiB; P would be {values['p_matrix_bytes'] / 2**30:6.2f} "
              f"GiB), {m['seconds']:.1f} s", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".partial", "w", newline="") as f:
        w = csv.DictWriter(f, ["n", "d", "metric", "value"])
        w.writeheader()
        w.writerows(rows)
    os.replace(a.out + ".partial", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
