#!/usr/bin/env python3
"""Which stabiliser fixes which half-precision failure (issue "Reduced precision": "which stabiliser fixes which
failure, measured"). attnlab's two policies move two things at once — eager is the reference code's form with every
tensor stored in the format, careful keeps the accumulators in float32 *and* uses attnlab's own stabilisation — so
this study takes them apart, one stabiliser at a time, on the kernel methods whose half-precision failures issue 39
names (the fp16 all-zero rows of linear attention; the NaN of Performer), as a 2 × 2 per method:

  Performer (FAVOR+, 256 positive orthogonal features, tools/eager_attention.py's transcription of the reference
  code), features:       reference — exp(ωᵀx − ‖x‖²/2 − max ωᵀx) (each query's row maximum of the projections, the
                                     keys' overall one: what the reference code subtracts), every step stored;
                         log-scale — exp(ωᵀx − ‖x‖²/2 − max(ωᵀx − ‖x‖²/2)): the whole exponent's maximum, so that
                                     every row's largest feature is 1 (the factor e^{−‖x‖²/2}, which underflows for
                                     long x, is carried by the subtracted maximum; it cancels in the ratio as before),
                                     every step stored;
                         fused     — log-scale, the exponent formed in float32 and only φ stored (a fused feature
                                     kernel, as attnlab's careful policy forms them);
                         and ω:    stored in the format (a model's buffer under .half()) or kept in float32;
  linear attention (elu + 1), sums: sum — Σφ(k)vᵀ and Σφ(k) as the reference code forms them;
                                     mean — both divided by n (the ratio is unchanged; the normaliser no longer grows
                                     with n);
  and for both, accumulators: format — the key–value state, key sum, numerators and normalisers stored in the format
                                     (a plain transcription under .half());
                              float32 — those four stored in float32 (the inputs, features and output still in
                                     the format).

Every tensor a transcription stores is rounded to the format (torch's own round-to-nearest-even conversion; a
"float32" one to float32), the arithmetic in float64 between roundings (float32 sums make no difference at these
sizes). Gaussian Q, K, V (d = 64, numpy's default_rng(seed), Q·t for the logit temperature t), the random features
from eager_attention.numpy_params. Per cell: non-finite output entries, all-zero output rows, and the rounding error
‖O − O₆₄‖_F/‖O₆₄‖_F against the same variant in float64 (the stabilisers are exact in exact arithmetic: the float64
outputs of a method's four variants agree to 1e-12, checked). Writes a tidy CSV (results/stabilisers.csv.gz by default)
with a .config; ~10 s on 2 cores. Not part of the main job: `tools/stabilisers.py` regenerates it.

    tools/stabilisers.py [--out results/stabilisers.csv.gz] [--n 256,1024,4096] [--temps 0.5,1,2,4] [--seed 0]
"""
import argparse
import csv
import gzip
import io
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import eager_attention as ea  # noqa: E402

FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16}
COLUMNS = ["method", "stabiliser", "accumulators", "omega", "format", "n", "d", "temperature", "nonfinite",
           "zero_rows", "err_rounding", "seed"]


def stored(x, fmt):
    """x stored in the format (round to nearest even; overflow to ±inf), back in float64; fp64: as it is."""
    return x if fmt == "fp64" else x.to(FORMATS[fmt]).to(torch.float64)


def in_float32(x, fmt):
    """x stored in float32 (what the "float32" variants keep; fp64: as it is)."""
    return x if fmt == "fp64" else x.float().double()


def performer(q, k, v, omega, scale, fmt, stabiliser, accumulators, omega_stored=True):
    r = lambda x: stored(x, fmt)  # noqa: E731
    f32 = lambda x: in_float32(x, fmt)  # noqa: E731
    acc = r if accumulators == "format" else f32
    step = f32 if stabiliser == "fused" else r   # fused: the exponent's steps in float32
    w = r(omega) if omega_stored else f32(omega)

    def features(x, keys):
        xs = step(x * scale ** 0.5)
        proj = step(xs @ w.T)
        half = step(step((xs * xs).sum(-1, keepdim=True)) / 2)
        e = step(proj - half)
        if stabiliser == "reference":  # the reference code: the projections' maximum
            mx = proj.max() if keys else proj.max(-1, keepdim=True).values
        else:  # log-scale: the whole exponent's maximum
            mx = e.max() if keys else e.max(-1, keepdim=True).values
        return r(torch.exp(step(e - mx)))

    fq, fk = features(q, False), features(k, True)
    kv, ks = acc(fk.T @ v), acc(fk.sum(0))
    num, den = acc(fq @ kv), acc(fq @ ks)
    return r(num / den[:, None])


def linear(q, k, v, fmt, stabiliser, accumulators):
    r = lambda x: stored(x, fmt)  # noqa: E731
    acc = r if accumulators == "format" else (lambda x: in_float32(x, fmt))
    fq, fk = r(torch.nn.functional.elu(q) + 1), r(torch.nn.functional.elu(k) + 1)
    n = k.shape[0]
    if stabiliser == "sum":
        kv, ks = acc(fk.T @ v), acc(fk.sum(0))
    else:  # mean: each sum divided by n as it is formed
        kv, ks = acc((fk / n).T @ v), acc((fk / n).sum(0))
    num, den = acc(fq @ kv), acc(fq @ ks)
    return r(num / den[:, None])


VARIANTS = {"performer": ("reference", "log-scale", "fused"), "linear": ("sum", "mean")}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "results", "stabilisers.csv.gz"))
    p.add_argument("--n", default="256,1024,4096")
    p.add_argument("--temps", default="0.5,1,2,4")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    rows = []
    for n in [int(x) for x in a.n.split(",")]:
        rng = np.random.default_rng(a.seed)
        q0, k0, v0 = (rng.standard_normal((n, a.d)) for _ in range(3))
        prm = ea.numpy_params(n, a.d, np.random.default_rng(a.seed + 1))
        omega, scale = torch.from_numpy(np.asarray(prm["omega"], dtype=np.float64)), prm["scale"]
        for t in [float(x) for x in a.temps.split(",")]:
            q, k, v = (torch.from_numpy(x) for x in (q0 * t, k0, v0))
            for method, stabs in VARIANTS.items():
                omegas = ("stored", "float32") if method == "performer" else ("",)
                refs = {}
                for stab in stabs:
                    for acc in ("format", "float32"):
                        for om in omegas:
                            def run(q_, k_, v_, fmt):
                                if method == "performer":
                                    return performer(q_, k_, v_, omega, scale, fmt, stab, acc, om == "stored")
                                return linear(q_, k_, v_, fmt, stab, acc)
                            if stab not in refs:
                                refs[stab] = run(q, k, v, "fp64")
                            ref = refs[stab]
                            if stab != stabs[0]:   # the stabilisers change nothing in exact arithmetic
                                dd = float((ref - refs[stabs[0]]).norm() / refs[stabs[0]].norm())
                                if not dd < 1e-9:
                                    raise SystemExit(f"stabilisers: {method} {stab} differs from {stabs[0]} in "
                                                     f"float64 by {dd:.2e} (n = {n}, t = {t})")
                            for fmt in FORMATS:
                                o = run(stored(q, fmt), stored(k, fmt), stored(v, fmt), fmt)
                                bad = int((~torch.isfinite(o)).sum())
                                zero = int((o == 0).all(-1).sum())
                                err = float((o - ref).norm() / ref.norm()) if bad == 0 else float("nan")
                                rows.append(dict(method=method, stabiliser=stab, accumulators=acc, omega=om,
                                                 format=fmt, n=n, d=a.d, temperature=t, nonfinite=bad,
                                                 zero_rows=zero, err_rounding="" if bad else f"{err:.6g}",
                                                 seed=a.seed))
        print(f"stabilisers: n = {n} done", file=sys.stderr)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, COLUMNS)
    w.writeheader()
    w.writerows(rows)
    data = text.getvalue().encode()
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:   # gzip without a name or time stamp: the same bytes on every run
        f.write(gzip.compress(data, compresslevel=9, mtime=0) if a.out.endswith(".gz") else data)
    os.replace(tmp, a.out)
    with open(a.out + ".config", "w") as f:
        json.dump({"n": a.n, "temps": a.temps, "d": a.d, "seed": a.seed, "torch": torch.__version__,
                   "features": "256 positive orthogonal (eager_attention.numpy_params)",
                   "rounding": "torch's conversion to bfloat16 / float16 after every stored tensor, float64 between"},
                  f, indent=1, sort_keys=True)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
