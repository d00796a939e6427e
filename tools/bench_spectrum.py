#!/usr/bin/env python3
"""The matrix-free spectrum solvers compared in one run (issue 11): the block Krylov solver against Spectra's Lanczos
on PᵀP for the top 32 singular values of exact attention (d = 64, Gaussian Q and K, float64), at n = 4096 — where a
dense SVD (numpy's LAPACK, and Eigen's BDCSVD inside attnlab) is the reference — and at n = 16384, where it is not
affordable; and the Eckart–Young floor `svd:rank=64` at n = 4096, block against Lanczos against dense, its value
against numpy's SVD.

    tools/bench_spectrum.py [--out results/bench] [--attnlab build/bin/attnlab] [--large-n 16384]

Writes OUT/spectrum_solvers.csv.gz (the spectrum experiment's tidy rows), OUT/svd_floor.csv (compare's rows) and
OUT/spectrum_solvers.md (the table the note and docs/benchmarks.md quote). Times are wall-clock on this machine,
taken in one job so that their ratios mean something; each solver's residuals are in the CSV.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def softmax_rows(q, k):
    s = q @ k.T / np.sqrt(q.shape[1])
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    return s


def run(cmd):
    print("bench_spectrum:", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True)
    return time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "bench"))
    ap.add_argument("--attnlab", default=os.path.join(os.environ.get("ATTNLAB_BUILD", os.path.join(ROOT, "build")),
                                                      "bin", "attnlab"))
    ap.add_argument("--n", type=int, default=4096, help="length with a dense reference")
    ap.add_argument("--large-n", default="16384", help="lengths without one (comma-separated; '' for none)")
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument("--rank", type=int, default=64, help="rank of the svd floor")
    args = ap.parse_args()
    if not os.access(args.attnlab, os.X_OK):
        sys.exit(f"bench_spectrum: {args.attnlab} not found; build it first (tools/setup.sh)")
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    n, d = args.n, 64
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, a in (("q", q), ("k", k), ("v", v)):
            paths[name] = os.path.join(tmp, f"{name}.npy")
            np.save(paths[name], a)
        spectrum_csv = os.path.join(args.out, "spectrum_solvers.csv.gz")
        if os.path.exists(spectrum_csv):
            os.remove(spectrum_csv)
        cmd = [args.attnlab, "run", "spectrum", "--sources", "gaussian", "--temperatures", "1", "--seeds", "1",
               "--n", "64", "--top", str(args.top), "--solvers", "block,lanczos", "--q", paths["q"], "--k",
               paths["k"], "--dense-limit", str(n), "--out", spectrum_csv]
        cmd += ["--large-n", args.large_n] if args.large_n else []
        run(cmd)
        svd_csv = os.path.join(args.out, "svd_floor.csv")
        r = args.rank
        run([args.attnlab, "compare", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--dtype", "f64",
             "--matrix-metrics", "on", "--method", f"svd:rank={r}", "--method", f"svd:rank={r},solver=lanczos",
             "--method", f"svd:rank={r},solver=dense", "--csv", svd_csv])
    # The independent reference: numpy's LAPACK SVD of the same P.
    t0 = time.time()
    p = softmax_rows(q, k)
    sv = np.linalg.svd(p, compute_uv=False)
    numpy_s = time.time() - t0
    floor = np.sqrt((sv[r:] ** 2).sum()) / np.linalg.norm(p)

    sp = pd.read_csv(spectrum_csv)
    lines = ["# Matrix-free top-k spectra: block Krylov against Lanczos, one run", "",
             f"Exact attention, d = 64, Gaussian Q and K, float64, top {args.top}, tolerance 1e-9·σ₁ on the "
             f"residual ‖Pᵀu − σv‖; n = {n} from numpy (seed 0) with numpy's SVD ({numpy_s:.1f} s) as reference, "
             "larger n from attnlab's generator. Command: `tools/bench_spectrum.py`.", "",
             "| n | solver | time (s) | products | vectors | peak memory (MiB) | max residual / σ₁ | "
             "max rel. diff vs numpy SVD | Lanczos time / block time |", "|---|---|---|---|---|---|---|---|---|"]
    top = sp[sp.metric == "top_singular_value"]
    for (n_i, src), g in sp[sp.spec.isin(["block", "lanczos"])].groupby(["n", "source"]):
        n_i = int(n_i)
        per = {}
        for solver, h in g.groupby("spec"):
            val = lambda m: float(h[h.metric == m].value.iloc[0])  # noqa: E731
            vals = top[(top.spec == solver) & (top.n == n_i) & (top.source == src)].sort_values("step").value.values
            diff = (np.abs(vals - sv[:len(vals)]) / sv[:len(vals)]).max() if n_i == n and src == "files" else None
            per[solver] = (val("time_s"), val("products"), val("vectors"), val("peak_memory_bytes") / 2**20,
                           h[h.metric == "residual"].value.max(), diff)
        for solver, (t, prods, vecs, mib, res, diff) in sorted(per.items()):
            ratio = per["lanczos"][0] / per["block"][0] if solver == "block" and "lanczos" in per else None
            lines.append(f"| {n_i} | {solver} | {t:.2f} | {prods:.0f} | {vecs:.0f} | {mib:.0f} | {res:.1e} | "
                         f"{'–' if diff is None else f'{diff:.1e}'} | {'' if ratio is None else f'{ratio:.1f}'} |")
    lines += ["", "Peak memory is the rise of the process's peak resident set during the call, above its inputs: "
                  "a lower bound, and for the solver that runs second at a length (Lanczos) mostly hidden, as it "
                  "reuses memory the first one freed."]
    dense = sp[(sp.metric == "singular_value") & (sp.source == "files")].sort_values("step").value.values
    if len(dense):
        lines += ["", f"attnlab's own dense spectrum (Eigen BDCSVD) at n = {n} against numpy's: largest relative "
                      f"difference over the top {args.top}: "
                      f"{(np.abs(dense[:args.top] - sv[:args.top]) / sv[:args.top]).max():.1e}."]
    cmp = pd.read_csv(svd_csv)
    lines += ["", f"## The Eckart–Young floor `svd:rank={r}` at n = {n}", "",
              f"numpy's SVD: ‖P − P_{r}‖_F / ‖P‖_F = {floor:.10f}.", "",
              "| spec | time (s) | ‖P − P̃‖_F / ‖P‖_F | rel. diff vs numpy |", "|---|---|---|---|"]
    for spec, g in cmp[cmp.method == "svd"].groupby("spec", sort=False):
        t = float(g[g.metric == "time_s"].value.iloc[0])
        f = float(g[g.metric == "P_rel_fro"].value.iloc[0])
        lines.append(f"| `{spec}` | {t:.2f} | {f:.10f} | {abs(f - floor) / floor:.1e} |")
    md = os.path.join(args.out, "spectrum_solvers.md")
    open(md, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"bench_spectrum: wrote {md}")


if __name__ == "__main__":
    main()
