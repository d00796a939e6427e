#!/usr/bin/env python3
"""The PyTorch peers of tools/bench_peers.py compute what attnlab computes (so the side-by-side benchmark compares
like with like): on a small float64 problem, the deterministic transcriptions — exact, linear (elu), local window 64
and Nyströmformer (64 segment-mean landmarks, 6 order-3 iterations) — equal `attnlab apply` with the same method."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import Checks, path, run  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
try:
    import torch
except ImportError:
    sys.exit(f"{sys.executable} has no torch: tools/setup.sh --python-stack installs Debian's python3-torch")
import bench_peers  # noqa: E402

c = Checks()
n, d = 256, 64
rng = np.random.default_rng(3)
q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
for name, a in (("q", q), ("k", k), ("v", v)):
    np.save(path(f"{name}.npy"), a)
p = {"scale": 1 / np.sqrt(d)}
tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
for peer, spec, tol in (("exact", "exact", 1e-12), ("linear", "linear", 1e-12), ("local", "local:window=64", 1e-12),
                        ("nystrom", "nystrom:landmarks=64,iters=6", 1e-8)):
    r = run("apply", "--method", spec, "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy"),
            "--out", path(f"{peer}.npy"))
    ours = np.load(path(f"{peer}.npy")) if r.returncode == 0 else None
    theirs = bench_peers.METHODS[peer](tq, tk, tv, p).numpy()
    err = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) if ours is not None else float("inf")
    c.check(err < tol, f"PyTorch peer '{peer}' = attnlab {spec}: relative difference {err:.2g} (≤ {tol:g}) {r.stderr}")
    print(f"{peer}: {err:.2g}")
c.finish()
