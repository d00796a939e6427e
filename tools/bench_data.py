"""The side-by-side benchmark's runs as frames (results/bench: Google Benchmark's attnlab.json and attnlab_fast.json
from tools/bench.sh, peers.csv from tools/bench_peers.py, and the same runs with GLIBC_TUNABLES). No matplotlib:
tools/plot_bench.py draws the table and figure from these, tools/findings.py quotes them."""
import json
import os

import pandas as pd

BUILDS = {"default": "attnlab.json", "fast": "attnlab_fast.json"}


def read_suite(path, build):
    bm = json.load(open(path))
    rows = []
    for b in bm["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        name, dtype, n = b["name"].split("/")[:3]
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        rows.append({"build": build, "method": name, "dtype": dtype, "n": int(n.split(":")[1]),
                     "attnlab_s": b["real_time"] * unit})
    return pd.DataFrame(rows), bm.get("context", {})


def load(dirname):
    """One row per (build, method, dtype, n): attnlab's time, PyTorch's, their ratio, the speed-up over exact
    attention in the same build and run."""
    frames, contexts = [], {}
    for build, fname in BUILDS.items():
        if os.path.exists(os.path.join(dirname, fname)):
            f, contexts[build] = read_suite(os.path.join(dirname, fname), build)
            frames.append(f)
    ours = pd.concat(frames, ignore_index=True)
    peers = pd.read_csv(os.path.join(dirname, "peers.csv")).rename(columns={"seconds": "torch_s"})
    if "glibc_tunables" not in peers:
        peers["glibc_tunables"] = ""
    both = ours.merge(peers[["method", "dtype", "n", "torch_s", "openblas_coretype", "glibc_tunables"]],
                      on=["method", "dtype", "n"], how="left")
    exact = ours[ours.method == "exact"].set_index(["build", "dtype", "n"])["attnlab_s"]
    both["speedup_vs_exact"] = [exact.get((r.build, r.dtype, r.n), float("nan")) / r.attnlab_s
                                for r in both.itertuples()]
    both["torch_over_attnlab"] = both.torch_s / both.attnlab_s
    for build, c in contexts.items():
        both.loc[both.build == build, "arch"] = c.get("attnlab_arch", "")
        both.loc[both.build == build, "products"] = c.get("attnlab_products", "")
    return both, contexts


def allocator_frame(dirname):
    """(frame, context): per (method, dtype, n) the default build's time without and with GLIBC_TUNABLES (attnlab_s,
    attnlab_s_tunables, ratio) and PyTorch's (seconds, seconds_tunables, torch_ratio); (None, {}) without those runs."""
    pairs = [("attnlab.json", "attnlab_tunables.json"), ("peers.csv", "peers_tunables.csv")]
    if not all(os.path.exists(os.path.join(dirname, f)) for p in pairs for f in p):
        return None, {}
    plain, _ = read_suite(os.path.join(dirname, "attnlab.json"), "default")
    tuned, ctx = read_suite(os.path.join(dirname, "attnlab_tunables.json"), "default")
    a = plain.merge(tuned, on=["method", "dtype", "n"], suffixes=("", "_tunables"))
    tp = pd.read_csv(os.path.join(dirname, "peers.csv")).merge(pd.read_csv(os.path.join(dirname, "peers_tunables.csv")),
                                                               on=["method", "dtype", "n"], suffixes=("", "_tunables"))
    a = a.merge(tp[["method", "dtype", "n", "seconds", "seconds_tunables"]], on=["method", "dtype", "n"], how="left")
    a["ratio"] = a.attnlab_s / a.attnlab_s_tunables
    a["torch_ratio"] = a.seconds / a.seconds_tunables
    return a, ctx


# ---- the backward suite (bench/bench_backward.cpp, tools/bench_peers.py --backward) ----------------------------
BACKWARD_BUILDS = {"default": "backward.json", "fast": "backward_fast.json"}
EXACT_BACKWARD_FLOPS = 10   # × n²·d: FlashAttention-2's count (S again, dV, dP, dQ, dK)


def read_backward_suite(path, build):
    """One row per (method, dtype, n) of one build: backward_s, step_s; the GEMM yardstick as method 'gemm' (its time
    in backward_s and its rate in gflops)."""
    bm = json.load(open(path))
    rows = {}
    for b in bm["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        parts = b["name"].split("/")
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        if parts[0] == "gemm":
            kind, method, dtype, n = "backward", "gemm", parts[1], parts[2]
        else:
            kind, method, dtype, n = parts[:4]
        r = rows.setdefault((method, dtype, int(n.split(":")[1])), {"build": build})
        r[f"{kind}_s"] = b["real_time"] * unit
    out = pd.DataFrame([{"method": m, "dtype": dt, "n": n, **r} for (m, dt, n), r in rows.items()])
    gemm = out.method == "gemm"   # S = QKᵀ: 2·n²·d flops
    out.loc[gemm, "gflops"] = 2 * out[gemm].n.astype(float) ** 2 * 64 / out[gemm].backward_s / 1e9
    return out, bm.get("context", {})


def load_backward(dirname):
    """(frame, contexts): per (build, method, dtype, n) attnlab's backward and step times, PyTorch autograd's
    (torch_backward_s, torch_step_s), their ratios (torch over attnlab: above 1, attnlab faster); for exact, its
    backward's rate (10·n²·d flops) and that rate over the in-run GEMM's best rate at the dtype (gemm_fraction)."""
    frames, contexts = [], {}
    for build, fname in BACKWARD_BUILDS.items():
        if os.path.exists(os.path.join(dirname, fname)):
            f, contexts[build] = read_backward_suite(os.path.join(dirname, fname), build)
            frames.append(f)
    if not frames:
        return None, {}
    d = pd.concat(frames, ignore_index=True)
    peers = os.path.join(dirname, "peers_backward.csv")
    if os.path.exists(peers):
        p = pd.read_csv(peers).rename(columns={"backward_seconds": "torch_backward_s", "step_seconds": "torch_step_s"})
        d = d.merge(p[["method", "dtype", "n", "torch_backward_s", "torch_step_s", "openblas_coretype"]],
                    on=["method", "dtype", "n"], how="left")
        d["torch_over_attnlab_backward"] = d.torch_backward_s / d.backward_s
        d["torch_over_attnlab_step"] = d.torch_step_s / d.step_s
    gemm = d[d.method == "gemm"].groupby(["build", "dtype"]).gflops.max()
    exact = d.method == "exact"
    d.loc[exact, "exact_gflops"] = EXACT_BACKWARD_FLOPS * d[exact].n.astype(float) ** 2 * 64 / d[exact].backward_s / 1e9
    d["gemm_best_gflops"] = [gemm.get((r.build, r.dtype), float("nan")) for r in d.itertuples()]
    d.loc[exact, "gemm_fraction"] = d[exact].exact_gflops / d[exact].gemm_best_gflops
    return d, contexts
