#!/usr/bin/env python3
"""Issue 39's GPU observations, measured so that they can be checked: the eager transcriptions of
tools/eager_attention.py run in float64 (the reference), float32, bfloat16 and float16 — the inputs and parameters
cast to the format and every operation computed in it, as a user's code under .half() or .bfloat16() does — on
whatever device torch offers (CUDA when present), for exact attention materialised and PyTorch's fused
scaled_dot_product_attention (torch >= 2.0), linear attention (elu + 1), Performer (256 positive orthogonal
features, maxima subtracted as its reference code does), Nyströmformer (64 landmarks, 6 pseudo-inverse iterations),
Linformer (k = 256) and the local window (64).

    tools/gpu_precision.py [--n 1024,4096,16384] [--temps 0.5,1,2,4] [--formats fp64,fp32,bf16,fp16] [--heads 2]
                           [--out results/precision_gpu/gpu_precision.csv] [--npz PATH] [--npz-n 1024]

Inputs: Q, K, V of N(0, 1) entries, heads × n × d (d = 64; 2 heads, so that n = 4096 has the 524288 output entries
issue 39 counts), drawn with numpy's np.random.default_rng(seed) in float64 on the CPU, and the logits' temperature t
applied as Q·t (softmax(t·s·QKᵀ)); the methods' random parameters from np.random.default_rng(seed + 1) likewise
(eager_attention.numpy_params). So any machine rebuilds the same inputs from the seed (their sha256 is in the .npz).
Per cell (method, n, t, format): the relative Frobenius error of the output against the same method in float64 on
the same device (rounding) and against exact attention in float64 (total), the non-finite output entries, the
all-zero output rows (a row of zeros where attention averages values is a silent failure: linear attention's
normaliser φ(q)ᵀΣφ(k) overflowing float16's 65504 gives x/inf = 0), and max |output| over the finite entries. The
device, torch, CUDA, and the matmul flags that change half-precision arithmetic (TF32; cuBLAS's reduced-precision
reductions for bf16 and fp16) are in every row. A format the device's kernels lack is a row `unsupported: <error>`
(float16 on Debian's torch 1.13 CPU), out of memory a row `oom`.

For n = --npz-n and t in --npz-temps the float16 and bfloat16 outputs of exact (both), linear and Performer are
also kept in a compressed .npz as their uint16 bit patterns (`<method>__<format>__t<t>`; bfloat16 bits are the top
half of the float32's), with a `meta` JSON (seed, shapes, device, versions, the inputs' sha256), so that a CPU
emulation of the formats can be compared with the GPU's real arithmetic bit for bit.
"""
import argparse
import csv
import hashlib
import json
import os
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as e:
    sys.exit(f"gpu_precision: {e.name} is missing for {sys.executable}; apt-get install python3-torch python3-numpy")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eager_attention as ea  # noqa: E402
from bench_gpu import OOM, cpu_name, status_of  # noqa: E402

FORMATS = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
METHODS = {"exact": "", "exact_sdpa": "", "linear": "feature=elu", "performer": "features=256",
           "nystrom": "landmarks=64,iters=6", "linformer": "k=256", "local": "window=64"}
SAVED = ("exact", "exact_sdpa", "linear", "performer")
FIELDS = ["method", "budget", "n", "d", "heads", "temperature", "format", "status", "err_rounding", "err_total",
          "nonfinite", "zero_rows", "entries", "rows", "max_abs", "seed", "device", "device_name", "torch", "cuda",
          "tf32", "bf16_reduced_reduction", "fp16_reduced_reduction"]


def run(name, q, k, v, p):
    with torch.no_grad():
        if name == "exact_sdpa":
            return ea.exact_sdpa(q, k, v, p)
        return ea.call(name, q, k, v, p)


def rel(a, b):
    """‖a − b‖_F / ‖b‖_F in float64 (inf or nan when a has non-finite entries)."""
    return float(torch.linalg.norm((a - b).flatten()) / torch.linalg.norm(b.flatten()))


def inputs(n, d, heads, seed):
    """Q₀, K, V (float64 numpy, heads × n × d) and the methods' float64 parameters, from the seed alone."""
    rng = np.random.default_rng(seed)
    q0, k, v = (rng.standard_normal((heads, n, d)) for _ in range(3))
    return q0, k, v, ea.numpy_params(n, d, np.random.default_rng(seed + 1))


def bits(t):
    """The uint16 bit patterns of a float16 or bfloat16 tensor."""
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--temps", default="0.5,1,2,4", help="logit temperatures t (Q scaled by t)")
    ap.add_argument("--formats", default="fp64,fp32,bf16,fp16")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/precision_gpu/gpu_precision.csv")
    ap.add_argument("--npz", default=None, help="the bits of the half-precision outputs (default: beside --out)")
    ap.add_argument("--npz-n", type=int, default=1024)
    ap.add_argument("--npz-temps", default="1,4")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when torch sees one)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    formats, methods = a.formats.split(","), a.methods.split(",")
    for what, got, valid in (("--formats", formats, FORMATS), ("--methods", methods, METHODS)):
        if set(got) - set(valid):
            ap.error(f"{what}: unknown {sorted(set(got) - set(valid))}; valid: {', '.join(valid)}")
    temps = [float(t) for t in a.temps.split(",")]
    npz_temps = {float(t) for t in a.npz_temps.split(",")}
    npz = a.npz or os.path.splitext(a.out)[0] + ".npz"
    mm = torch.backends.cuda.matmul
    info = {"seed": a.seed, "device": dev.type, "device_name": torch.cuda.get_device_name(dev) if cuda else cpu_name(),
            "torch": torch.__version__, "cuda": torch.version.cuda or "",
            "tf32": mm.allow_tf32 if cuda else "",
            "bf16_reduced_reduction": getattr(mm, "allow_bf16_reduced_precision_reduction", "") if cuda else "",
            "fp16_reduced_reduction": getattr(mm, "allow_fp16_reduced_precision_reduction", "") if cuda else ""}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    saved, meta = {}, {**info, "d": a.d, "heads": a.heads, "n": a.npz_n, "layout": "heads × n × d",
                       "temperatures": sorted(npz_temps), "inputs": "np.random.default_rng(seed): Q0, K, V; Q = t·Q0",
                       "params": "eager_attention.numpy_params(n, d, np.random.default_rng(seed + 1))"}
    t_start = time.monotonic()
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        for n in map(int, a.n.split(",")):
            q0, k_np, v_np, p64 = inputs(n, a.d, a.heads, a.seed)
            if n == a.npz_n:
                meta["inputs_sha256"] = hashlib.sha256(q0.tobytes() + k_np.tobytes() + v_np.tobytes()).hexdigest()
            for t in temps:
                q64, k64, v64 = (torch.from_numpy(x).to(dev) for x in (q0 * t, k_np, v_np))
                pdev = ea.to_device(p64, dev)
                exact64 = run("exact", q64, k64, v64, pdev).double()   # the total error's reference
                ref = {}   # each method in float64: its rounding error's reference
                for fmt in ["fp64"] + [fm for fm in formats if fm != "fp64"]:
                    dtype = FORMATS[fmt]
                    x = [y.to(dtype) for y in (q64, k64, v64)]
                    p = ea.to_device(pdev, dev, dtype)
                    for name in methods:
                        row = {"method": name, "budget": METHODS[name], "n": n, "d": a.d, "heads": a.heads,
                               "temperature": t, "format": fmt, **info}
                        try:
                            out = run(name, *x, p)
                            o = out.double()
                            fin = torch.isfinite(o)
                            row.update(status="ok", nonfinite=int((~fin).sum()), zero_rows=int((o == 0).all(-1).sum()),
                                       entries=o.numel(), rows=o.numel() // o.shape[-1],
                                       max_abs=float(o[fin].abs().max()) if bool(fin.any()) else "")
                            if fmt == "fp64":
                                ref[name] = o
                            if name in ref:
                                row["err_rounding"] = rel(o, ref[name])
                            row["err_total"] = rel(o, exact64)
                            if n == a.npz_n and t in npz_temps and fmt in ("bf16", "fp16") and name in SAVED:
                                saved[f"{name}__{fmt}__t{t:g}"] = bits(out)
                            del out, o, fin
                        except Exception as e:  # noqa: BLE001 — every failure is a row
                            row["status"] = status_of(e)
                            if OOM and isinstance(e, OOM) and cuda:
                                torch.cuda.empty_cache()
                        if fmt in formats:
                            w.writerow(row)
                            f.flush()
                        print(f"[{time.monotonic() - t_start:6.1f} s] n={n:6d} t={t:<4g} {fmt} {name:10s} "
                              + (f"rounding {row.get('err_rounding', float('nan')):.3g}  total "
                                 f"{row.get('err_total', float('nan')):.3g}  non-finite {row['nonfinite']}  "
                                 f"zero rows {row['zero_rows']}" if row["status"] == "ok" else row["status"]),
                              file=sys.stderr, flush=True)
                del q64, k64, v64, pdev, ref, exact64
                if cuda:
                    torch.cuda.empty_cache()
    if saved:
        np.savez_compressed(npz, meta=np.array(json.dumps(meta)), **saved)
        print(npz)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
