#!/usr/bin/env python3
"""Costs on the device the user runs (issue 40, item 2): the eager PyTorch transcriptions of attnlab's methods
(tools/eager_attention.py, the ones tools/bench_peers.py times on the CPU) against the exact attention that device
already has — PyTorch's fused `torch.nn.functional.scaled_dot_product_attention` where torch has it (torch >= 2.0),
softmax(s·QKᵀ)V materialised otherwise — in bfloat16, float16 and float32, forward and forward + backward,
non-causal and causal where the method has a causal form (exact with is_causal, linear attention and Performer by
prefix sums over blocks, the local window looking back), one sequence of H heads (default 16) of head dimension d.

    tools/bench_gpu.py [--n 1024,...] [--dtypes bf16,fp16,fp32] [--d 64,128] [--heads 16] [--pass fwd,fwd+bwd]
                       [--causal no,yes] [--methods exact,linear,...] [--out results/bench/gpu_{tag}.csv]
                       [--max-seconds S] [--budget-s S] [--resume] [--table-only]

On CUDA when torch sees one, the CPU otherwise (n = 256, 512, 1024 by default there, so that CI runs it). Random
parameters (Performer's ω, Linformer's E and F, the LSH rotations, the k-means seeds, ProbSparse's samples) are drawn
once per (d, n) outside the timed calls, shared by the heads. Time: one warm-up call (whose output is checked: the
non-finite entries and the all-zero output rows are counted — float16 linear attention's normaliser overflows to inf
and its output becomes 0 without an error, issue 39), then repeats until --repeats calls or --rep-budget seconds
(at least --min-repeats, at least one), each timed by CUDA events around the call (synchronised) or
time.perf_counter on the CPU; the row gives the median. `fwd` runs under no_grad; `fwd+bwd` is the forward with its
graph and torch.autograd.grad of the output for an upstream gradient of N(0, 1) (Transformer-VQ's codebook is fitted
under no_grad: no dK, as bench_peers' `vq:no-dK`). A cell that runs out of memory is a row with status `oom`, one
whose dtype the device's kernels lack `unsupported: <error>` (float16 on Debian's torch 1.13 CPU), and a method stops
growing n after an oom or a call slower than --max-seconds (rows `skipped: ...`). Rows are appended and flushed as
they are measured: a killed run keeps them, and --resume measures only the missing cells.

Writes the tidy CSV (one row per method, budget, n, d, dtype, pass, causal; the device, torch, CUDA, cuDNN, threads
and the exact kernel in every row) and beside it the markdown table (same name, .md): per (dtype, d, pass, causal)
the exact time and each method's speed-up = exact ms / method ms per n, and its crossover length against exact
attention (`crossover`).
"""
import argparse
import csv
import gc
import math
import os
import re
import statistics
import sys
import time

try:
    import torch
except ImportError:
    sys.exit(f"bench_gpu: torch is missing for {sys.executable}; apt-get install python3-torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eager_attention as ea  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PASSES = ("fwd", "fwd+bwd")
# exact: the fused kernel where torch has one; exact_eager: materialised (opt-in: n² memory)
METHODS = ["exact", "exact_eager"] + [m for m in ea.METHODS if m != "exact"]
DEFAULT_METHODS = [m for m in METHODS if m != "exact_eager"]
CAUSAL = ea.CAUSAL | {"exact_eager"}
FIELDS = ["method", "budget", "heads", "d", "n", "dtype", "pass", "causal", "status", "ms", "ms_min", "ms_max",
          "repeats", "nonfinite", "zero_rows", "grad_nonfinite", "peak_mib", "exact_impl", "sdpa_kernels", "note",
          "device", "device_name", "torch", "cuda", "cudnn", "threads", "tf32"]
KEY = ("method", "budget", "heads", "d", "n", "dtype", "pass", "causal")
OOM = tuple(e for e in (getattr(torch.cuda, "OutOfMemoryError", None), getattr(torch, "OutOfMemoryError", None)) if e)


# ------------------------------------------------------------------------------------------- the device
def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def device_info(dev):
    """What every row records about where it was measured."""
    cuda = dev.type == "cuda"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"device": dev.type, "device_name": torch.cuda.get_device_name(dev) if cuda else cpu_name(),
            "torch": torch.__version__, "cuda": torch.version.cuda or "", "cudnn": cudnn or "",
            "threads": torch.get_num_threads(), "tf32": torch.backends.cuda.matmul.allow_tf32 if cuda else ""}


def device_tag(info):
    """A short file-name tag: the first token of the GPU's name with a digit (NVIDIA H200 → h200), else cpu."""
    if info["device"] != "cuda":
        return "cpu"
    for token in info["device_name"].lower().replace("nvidia", "").replace("geforce", "").split():
        if any(ch.isdigit() for ch in token):
            return re.sub(r"[^a-z0-9]", "", token.split("-")[0]) or "cuda"
    return "cuda"


def exact_impl():
    return "sdpa" if ea.HAS_SDPA else "eager"


def sdpa_kernels(dev, dtype, d, heads):
    """The fused SDPA kernels that accept this dtype and head dimension on dev (a forward at n = 128 under
    torch.nn.attention.sdpa_kernel, torch >= 2.3); torch picks among them by its own priority. '' where unknown."""
    if not ea.HAS_SDPA:
        return ""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return ""
    import warnings
    x = torch.zeros(1, heads, 128, d, dtype=dtype, device=dev)
    ok = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel([backend]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.nn.functional.scaled_dot_product_attention(x, x, x)
            ok.append(name.split("_")[0].lower())
        except Exception:  # noqa: BLE001 — a kernel that refuses this shape or dtype
            pass
    return "|".join(ok)


def call(name, q, k, v, p, causal):
    if name == "exact":
        return ea.exact_sdpa(q, k, v, p, causal) if ea.HAS_SDPA else ea.call("exact", q, k, v, p, causal)
    return ea.call("exact" if name == "exact_eager" else name, q, k, v, p, causal)


def note(name, passname, causal):
    out = []
    if name == "exact":
        out.append("fused scaled_dot_product_attention" if ea.HAS_SDPA else "materialised (torch has no SDPA)")
    if causal and name in ("linear", "performer"):
        out.append("causal: prefix sums over blocks of 64")
    if name == "vq" and passname == "fwd+bwd":
        out.append("no dK (codebook fitted under no_grad)")
    return "; ".join(out)


def status_of(e):
    msg = " ".join(str(e).split())[:200]
    if (OOM and isinstance(e, OOM)) or "out of memory" in msg.lower():
        return "oom"
    if isinstance(e, NotImplementedError) or "not implemented for" in msg or "not supported" in msg.lower():
        return f"unsupported: {msg}"
    return f"error: {type(e).__name__}: {msg}"


def free(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- one cell
def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed_calls(fn, dev, a):
    """Seconds of repeated calls of fn after the warm-up: CUDA events around each call on the GPU, perf_counter on
    the CPU; at least one, at least --min-repeats while the total stays under --rep-budget, at most --repeats; stops
    after one call slower than --max-seconds."""
    times = []
    while len(times) < a.repeats:
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if times[-1] > a.max_seconds or (sum(times) > a.rep_budget and len(times) >= a.min_repeats):
            break
        if sum(times) > 4 * a.rep_budget:
            break
    return times


def measure(name, causal, passname, x, p, d_out, dev, a):
    """One cell: {status, ms, ..., nonfinite, zero_rows, grad_nonfinite, peak_mib}."""
    def fwd():
        with torch.no_grad():
            return call(name, *x, p, causal)

    def step():
        out = call(name, *x, p, causal)
        return out, torch.autograd.grad(out, x, d_out, allow_unused=True)

    fn = fwd if passname == "fwd" else step
    row = {}
    try:
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        res = fn()   # warm-up, checked
        sync(dev)
        out, grads = (res, ()) if passname == "fwd" else res
        row["nonfinite"] = int((~torch.isfinite(out)).sum())
        row["zero_rows"] = int((out == 0).all(-1).sum())
        row["grad_nonfinite"] = sum(int((~torch.isfinite(g)).sum()) for g in grads if g is not None) \
            if passname != "fwd" else ""
        del res, out, grads
        times = timed_calls(lambda: fn(), dev, a)
        if dev.type == "cuda":
            row["peak_mib"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
        row.update(status="ok", ms=round(statistics.median(times) * 1e3, 4), ms_min=round(min(times) * 1e3, 4),
                   ms_max=round(max(times) * 1e3, 4), repeats=len(times))
    except Exception as e:  # noqa: BLE001 — every failure is a row
        row = {"status": status_of(e)}
    if row["status"] == "oom":
        free(dev)
    return row


# ------------------------------------------------------------------------------------------- crossovers
def crossover(ns, speedups):
    """Where a method overtakes exact attention for good: ("at", n*) with n* the smallest length from which it is
    faster at every measured n — between the last grid point where speed-up ≤ 1 and the next, interpolated linearly
    in log n on log(speed-up) (n* = that grid point when its speed-up is exactly 1); ("below", n₀) when it is
    already faster at the smallest measured n₀; ("none", n_max) when it is not faster at the largest; None without
    data. Non-positive or missing speed-ups are dropped."""
    pts = sorted((n, s) for n, s in zip(ns, speedups) if s is not None and s > 0 and math.isfinite(s))
    if not pts:
        return None
    logs = [math.log(s) for _, s in pts]
    if logs[-1] <= 0:
        return ("none", pts[-1][0])
    slow = [i for i, lg in enumerate(logs) if lg <= 0]
    if not slow:
        return ("below", pts[0][0])
    i = slow[-1]
    (n0, _), (n1, _) = pts[i], pts[i + 1]
    frac = -logs[i] / (logs[i + 1] - logs[i])
    return ("at", math.exp(math.log(n0) + frac * (math.log(n1) - math.log(n0))))


def crossover_text(c):
    if c is None:
        return "—"
    kind, n = c
    return {"at": f"≈ {n:,.0f}", "below": f"below {n:,}", "none": f"none up to {n:,}"}[kind]


def speedup_text(s):
    return f"{s:.2f}×" if s < 10 else (f"{s:.1f}×" if s < 100 else f"{s:.0f}×")


# ------------------------------------------------------------------------------------------- the table
def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(rows):
    """The markdown text for the rows of one run (strings, as the CSV holds them)."""
    if not rows:
        return "# bench_gpu\n\nNo rows.\n"
    r0 = rows[0]
    heads = sorted({r["heads"] for r in rows})
    lines = [f"# Eager approximations against exact attention on {r0['device_name']}", "",
             f"`tools/bench_gpu.py` on {r0['device_name']} ({r0['device']}): torch {r0['torch']}, "
             f"CUDA {r0['cuda'] or '—'}, cuDNN {r0['cudnn'] or '—'}, {r0['threads']} CPU threads"
             + (f", TF32 matmul {r0['tf32']}" if r0["tf32"] != "" else "")
             + f"; one sequence of {'/'.join(heads)} heads. Exact attention: "
             + ("PyTorch's fused `scaled_dot_product_attention`" if r0["exact_impl"] == "sdpa"
                else "materialised softmax(s·QKᵀ)V (this torch has no scaled_dot_product_attention)")
             + ". Speed-up = exact ms / method ms (> 1: the method is faster), each the median of repeated calls "
             "after a warm-up; crossover: the smallest n from which the method is faster at every measured n, "
             "interpolated in log n between the grid points where log(speed-up) changes sign. "
             "oom: out of memory; skip: not run after an oom or a call over --max-seconds at a smaller n; "
             "unsup.: the dtype's kernels are missing; † the output had non-finite entries or all-zero rows "
             "(listed below).", ""]
    groups = {}
    for r in rows:
        groups.setdefault((r["pass"], r["dtype"], int(r["d"]), r["causal"]), []).append(r)
    order = lambda g: (PASSES.index(g[0]) if g[0] in PASSES else 9, list(DTYPES).index(g[1])  # noqa: E731
                       if g[1] in DTYPES else 9, g[2], g[3])
    for g in sorted(groups, key=order):
        grp = groups[g]
        ns = sorted({int(r["n"]) for r in grp})
        cell = {(r["method"], int(r["n"])): r for r in grp}
        base = "exact" if any(m == "exact" for m, _ in cell) else "exact_eager"
        methods = [m for m in METHODS if m != base and any(mm == m for mm, _ in cell)]
        kernels = sorted({r["sdpa_kernels"] for r in grp if r["method"] == "exact" and r["sdpa_kernels"]})
        lines += [f"## {g[1]}, d = {g[2]}, {'forward' if g[0] == 'fwd' else 'forward + backward'}, "
                  f"{'causal' if g[3] == 'True' else 'non-causal'}"
                  + (f" (SDPA kernels available: {', '.join(kernels)})" if kernels else ""), "",
                  "| n | exact ms | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
        speed = {m: [] for m in methods}
        for n in ns:
            e = cell.get((base, n))
            ems = float(e["ms"]) if e and e["status"] == "ok" else None
            cols = [f"{ems:.4g}" if ems else short(e)]
            for m in methods:
                r = cell.get((m, n))
                if r and r["status"] == "ok" and ems:
                    s = ems / float(r["ms"])
                    speed[m].append((n, s))
                    cols.append(speedup_text(s) + ("†" if flagged(r) else ""))
                elif r and r["status"] == "ok":
                    cols.append(f"({float(r['ms']):.4g} ms)" + ("†" if flagged(r) else ""))
                else:
                    cols.append(short(r))
            lines.append(f"| {n:,} | " + " | ".join(cols) + " |")
        lines.append("| crossover | | " + " | ".join(
            crossover_text(crossover([n for n, _ in speed[m]], [s for _, s in speed[m]])) for m in methods) + " |")
        lines.append("")
    bad = [r for r in rows if r["status"] == "ok" and flagged(r)]
    if bad:
        lines += ["## Non-finite or all-zero outputs", "",
                  "| method | dtype | d | pass | causal | n | non-finite entries | all-zero rows | non-finite grads |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['dtype']} | {r['d']} | {r['pass']} | {r['causal']} | {int(r['n']):,} | "
                  f"{r['nonfinite']} | {r['zero_rows']} | {r['grad_nonfinite'] or '—'} |" for r in bad]
        lines.append("")
    odd = sorted({(r["method"], r["dtype"], r["status"]) for r in rows if r["status"].startswith(("unsup", "error"))})
    if odd:
        lines += ["## Not run", ""] + [f"- {m}, {dt}: {st}" for m, dt, st in odd] + [""]
    return "\n".join(lines)


def flagged(r):
    return any(r.get(c) not in ("", "0", None) for c in ("nonfinite", "zero_rows", "grad_nonfinite"))


def short(r):
    if r is None:
        return "—"
    st = r["status"]
    return {"oom": "oom"}.get(st) or ("skip" if st.startswith("skipped") else "unsup." if st.startswith("unsup")
                                      else "err" if st.startswith("error") else "—")


# ------------------------------------------------------------------------------------------- the run
def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default=None, help="lengths (default: CUDA 1024..65536 by ×2; CPU 256,512,1024)")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--d", default="64,128", help="head dimensions")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--pass", dest="passes", default="fwd,fwd+bwd")
    ap.add_argument("--causal", default="no,yes", help="no, yes, or no,yes (both)")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"of {','.join(METHODS)}")
    ap.add_argument("--out", default="results/bench/gpu_{tag}.csv", help="{tag}: the device (h200, cpu, ...)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop growing n for a method after a call slower than this (default CUDA 1, CPU 5)")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting cells after this many seconds (0: no)")
    ap.add_argument("--repeats", type=int, default=10, help="at most this many timed calls per cell")
    ap.add_argument("--min-repeats", type=int, default=3)
    ap.add_argument("--rep-budget", type=float, default=0.25, help="seconds of timed calls per cell, about")
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when torch sees one)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--resume", action="store_true", help="keep the CSV's rows and measure the missing cells only")
    ap.add_argument("--table-only", action="store_true", help="write the .md from the CSV, measure nothing")
    a = ap.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.threads:
        torch.set_num_threads(a.threads)
    info = device_info(dev)
    out = a.out.replace("{tag}", device_tag(info))
    md = os.path.splitext(out)[0] + ".md"
    if a.table_only:
        with open(md, "w") as f:
            f.write(table(read_rows(out)))
        print(md)
        return 0
    cuda = dev.type == "cuda"
    ns = [int(x) for x in (a.n or ("1024,2048,4096,8192,16384,32768,65536" if cuda else "256,512,1024")).split(",")]
    a.max_seconds = a.max_seconds or (1.0 if cuda else 5.0)
    dtypes = a.dtypes.split(",")
    ds = [int(x) for x in a.d.split(",")]
    passes = a.passes.split(",")
    causals = [{"no": False, "yes": True}[c] for c in a.causal.split(",")]
    methods = a.methods.split(",")
    for what, got, valid in (("--dtypes", dtypes, DTYPES), ("--pass", passes, PASSES), ("--methods", methods, METHODS)):
        if set(got) - set(valid):
            ap.error(f"{what}: unknown {sorted(set(got) - set(valid))}; valid: {', '.join(valid)}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    old = read_rows(out) if a.resume else []
    if old and old[0]["device_name"] != info["device_name"]:
        sys.exit(f"bench_gpu: --resume: {out} was measured on {old[0]['device_name']}, this is {info['device_name']}")
    done = {tuple(r[c] for c in KEY): r for r in old}
    f = open(out, "a" if old else "w", newline="")
    w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
    if not old:
        w.writeheader()
        f.flush()
    print(f"bench_gpu: {info['device_name']} ({dev.type}), torch {info['torch']}, CUDA {info['cuda'] or '-'}, "
          f"exact = {exact_impl()}, {len(done)} cells already measured -> {out}", file=sys.stderr, flush=True)
    t_start = time.monotonic()
    params_cache, measured, stopped = {}, 0, False
    stop = {}   # (method, dtype, d, pass, causal) -> why larger n are skipped
    kernels = {}
    for passname in passes:
        for dt in dtypes:
            dtype = DTYPES[dt]
            for d in ds:
                if cuda and (dt, d) not in kernels:
                    kernels[(dt, d)] = sdpa_kernels(dev, dtype, d, a.heads)
                for causal in causals:
                    for n in ns:
                        todo = [m for m in methods if not causal or m in CAUSAL]
                        x = p = d_out = None
                        for name in todo:
                            base = {"method": name, "budget": ea.BUDGETS.get(name, "") if name != "exact_eager"
                                    else "", "heads": a.heads, "d": d, "n": n, "dtype": dt, "pass": passname,
                                    "causal": causal}
                            skey = (name, dt, d, passname, causal)
                            prev = done.get(tuple(str(base[c]) for c in KEY))
                            if prev is not None:
                                if prev["status"] == "oom" or (prev["status"] == "ok" and
                                                               float(prev["ms_max"]) > a.max_seconds * 1e3):
                                    stop.setdefault(skey, f"{prev['status']} at n={n}" if prev["status"] == "oom"
                                                    else f"a call took {float(prev['ms_max']) / 1e3:.2f} s at n={n}")
                                continue
                            if a.budget_s and time.monotonic() - t_start > a.budget_s:
                                stopped = True
                                break
                            row = {**base, "exact_impl": exact_impl(), "sdpa_kernels": kernels.get((dt, d), ""),
                                   "note": note(name, passname, causal), **info}
                            if skey in stop:
                                row["status"] = f"skipped: {stop[skey]}"
                            else:
                                if x is None:
                                    x, p, d_out = make_inputs(n, d, dtype, a, dev, passname, params_cache)
                                row.update(measure(name, causal, passname, x, p, d_out, dev, a))
                                if row["status"] == "oom":
                                    stop[skey] = f"oom at n={n}"
                                elif row["status"] == "ok" and row["ms_max"] > a.max_seconds * 1e3:
                                    stop[skey] = f"a call took {row['ms_max'] / 1e3:.2f} s at n={n}"
                                measured += 1
                            w.writerow(row)
                            f.flush()
                            ms = f"{row['ms']:10.4f} ms" if row["status"] == "ok" else row["status"]
                            print(f"[{time.monotonic() - t_start:6.1f} s] {passname:7s} {dt} d={d:3d} "
                                  f"{'causal' if causal else 'full  '} n={n:6d} {name:11s} {ms}"
                                  + (f"  non-finite {row['nonfinite']}, zero rows {row['zero_rows']}"
                                     if row["status"] == "ok" and flagged({k: str(v) for k, v in row.items()})
                                     else ""), file=sys.stderr, flush=True)
                        del x, p, d_out
                        if stopped:
                            break
                    free(dev)
                    if stopped:
                        break
                if stopped:
                    break
            if stopped:
                break
        if stopped:
            break
    f.close()
    if stopped:
        print(f"bench_gpu: --budget-s {a.budget_s:g} reached after {measured} cells; --resume measures the rest",
              file=sys.stderr, flush=True)
    with open(md, "w") as fm:
        fm.write(table(read_rows(out)))
    print(out)
    print(md)
    return 0


def make_inputs(n, d, dtype, a, dev, passname, cache):
    """Q, K, V of N(0, 1) (drawn in float32 on dev from one seed per (d, n), then cast: every dtype rounds the same
    numbers), the parameters of (d, n) drawn once on the CPU, and the upstream gradient for fwd+bwd."""
    gen = torch.Generator(device=dev).manual_seed(a.seed * 1000003 + n * 131 + d)
    x = [torch.randn(a.heads, n, d, generator=gen, device=dev).to(dtype) for _ in range(3)]
    d_out = torch.randn(a.heads, n, d, generator=gen, device=dev).to(dtype) if passname != "fwd" else None
    if passname != "fwd":
        x = [t.requires_grad_() for t in x]
    if (n, d) not in cache:
        cache[(n, d)] = ea.params(n, d, torch.float64, torch.Generator().manual_seed(a.seed))
    return x, ea.to_device(cache[(n, d)], dev, dtype), d_out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
