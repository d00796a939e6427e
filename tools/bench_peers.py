#!/usr/bin/env python3
"""The peer a researcher would otherwise run: PyTorch eager transcriptions of attnlab's methods at their defaults
(d = 64, one head), timed on this machine, for the side-by-side benchmark (tools/bench.sh runs it in the same job as
attnlab's Google Benchmark suite and draws the comparison).

    tools/bench_peers.py [--out results/bench/peers.csv] [--n 1024,4096,16384] [--dtype f32,f64] [--threads 2]
    tools/bench_peers.py --backward [--out results/bench/peers_backward.csv] ...

--backward times PyTorch autograd of the same transcriptions instead: `backward` (torch.autograd.grad of the output
for an upstream gradient dO of N(0, 1), the graph built once outside the timed call and retained) and `step` (the
forward with its graph, then that backward). Autograd keeps what the forward saved: exact attention's n × n softmax
(4 GiB at n = 16384 in float64 — the memory attnlab's O(n) backward avoids). Transformer-VQ's codebook is fitted
under no_grad (a trained model holds it; Transformer-VQ trains it by k-means, not by the loss). Its keys' gradient is
the straight-through estimator K̂ = K + sg(C[a] − K) (Lingle 2023, as attnlab's): eager PyTorch has no linear-time
form of it (dK̂_j depends on v_j and every query), so the `vq` row differentiates softmax(s·Q K̂ᵀ) V — quadratic, as
a user would write it — and `vq:no-dK` the linear forward above, whose keys reach the loss only through the fixed
codebook (dQ and dV only: less than attnlab computes).

Debian's python3-torch (CPU), never a dependency of attnlab. Each transcription (tools/eager_attention.py) is the
straightforward eager code of the method's equations (what one writes in a notebook), with random parameters
(Performer's ω, Linformer's E, F) drawn once outside the timed call, as attnlab caches them. Time: the best of
several calls after a warm-up. OpenBLAS picks generic kernels on some virtual CPUs: set OPENBLAS_CORETYPE to the real
core (Haswell on AVX2, SkylakeX on AVX-512) before running; the value in force is recorded in every row.
"""
import argparse
import csv
import os
import sys
import time

try:
    import torch
except ImportError:
    sys.exit(f"bench_peers: torch is missing for {sys.executable}; apt-get install python3-torch, "
             "or set ATTNLAB_PYTHON")


# The transcriptions (batched over leading dimensions, any device; on these 2-D inputs the same operations and
# bits as always) live in tools/eager_attention.py, shared with tools/bench_gpu.py and tools/gpu_precision.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eager_attention import (codebook, exact, linear, local, nystrom, linformer, params, performer,  # noqa: E402,F401
                             probsparse, reformer, vq, vq_straight_through)

METHODS = {"exact": exact, "linear": linear, "performer": performer, "nystrom": nystrom, "linformer": linformer,
           "local": local, "reformer": reformer, "vq": vq, "probsparse": probsparse}


def best_time(fn, min_calls=3, budget=1.0):
    fn()   # warm-up
    times, t_end = [], time.perf_counter() + budget
    while len(times) < min_calls or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), len(times)


# --backward: Transformer-VQ's training form under its name, the linear forward's autograd beside it.
BACKWARD_METHODS = {**METHODS, "vq": vq_straight_through, "vq:no-dK": vq}


def grad_times(fn, q, k, v, p, d_out):
    """(backward alone, forward + backward) of autograd through fn, each the best of several calls."""
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fn(*x, p)
    backward, calls = best_time(lambda: torch.autograd.grad(out, x, d_out, retain_graph=True, allow_unused=True))
    del out

    def step():
        torch.autograd.grad(fn(*x, p), x, d_out, allow_unused=True)

    return backward, best_time(step)[0], calls


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/bench/peers.csv")
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--dtype", default="f32,f64")
    ap.add_argument("--methods", default=None, help="comma list (default: every transcription)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--max-quadratic-n", type=int, default=16384, help="exact attention forms n×n: largest n")
    ap.add_argument("--backward", action="store_true", help="time autograd's backward and the training step")
    a = ap.parse_args(argv)
    if a.backward and a.out == ap.get_default("out"):
        a.out = "results/bench/peers_backward.csv"
    table = BACKWARD_METHODS if a.backward else METHODS
    quadratic = {"exact", "vq"} if a.backward else {"exact"}   # the n × n ones (vq: its straight-through form)
    a.methods = a.methods or ",".join(table)
    bad = [m for m in a.methods.split(",") if m not in table]
    if bad:
        ap.error(f"--methods: unknown {bad}; valid: {', '.join(table)}")
    torch.set_num_threads(a.threads)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    rows = []
    coretype = os.environ.get("OPENBLAS_CORETYPE", "(auto)")
    with torch.set_grad_enabled(a.backward):
        for dt in a.dtype.split(","):
            dtype = {"f32": torch.float32, "f64": torch.float64}[dt]
            for n in map(int, a.n.split(",")):
                gen = torch.Generator().manual_seed(1)
                q, k, v = (torch.randn(n, 64, generator=gen).to(dtype) for _ in range(3))
                p = params(n, 64, dtype, gen)
                for name in a.methods.split(","):
                    if name in quadratic and n > a.max_quadratic_n:
                        continue
                    common = {"threads": a.threads, "torch": torch.__version__, "openblas_coretype": coretype,
                              "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
                    if a.backward:
                        d_out = torch.randn(n, 64, generator=gen).to(dtype)
                        back, step, calls = grad_times(BACKWARD_METHODS[name], q, k, v, p, d_out)
                        rows.append({"method": name, "n": n, "d": 64, "dtype": dt, "backward_seconds": back,
                                     "step_seconds": step, "calls": calls, **common})
                        print(f"torch {name:10s} {dt} n={n:6d}: backward {back * 1e3:9.3f} ms, "
                              f"step {step * 1e3:9.3f} ms", file=sys.stderr, flush=True)
                        continue
                    secs, calls = best_time(lambda: METHODS[name](q, k, v, p))
                    rows.append({"method": name, "n": n, "d": 64, "dtype": dt, "seconds": secs, "calls": calls,
                                 **common})
                    print(f"torch {name:10s} {dt} n={n:6d}: {secs * 1e3:9.3f} ms", file=sys.stderr, flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
