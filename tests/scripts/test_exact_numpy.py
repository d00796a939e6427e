"""`attnlab apply --method exact` against numpy's softmax(scale·QKᵀ [+ mask])·V: float32 to 1e-5 relative,
float64 to 1e-12, causal and not, cross-attention, (n, d) and (h, n, d), every .npy version and order."""
import numpy as np

from harness import Checks, path, run

c = Checks()


def reference(q, k, v, scale, causal):
    """Exact attention in float64 from the very arrays attnlab read."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = scale * q @ k.T
    if causal:
        nq, nk = s.shape
        # bottom-right alignment: query i sees keys j <= i + (nk - nq)
        mask = np.arange(nk)[None, :] > np.arange(nq)[:, None] + (nk - nq)
        s = np.where(mask, -np.inf, s)
    s = s - s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    return p, p @ v


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def save(name, a, version=None, fortran=False):
    if fortran:
        a = np.asfortranarray(a)
    with open(path(name), "wb") as f:
        np.lib.format.write_array(f, a, version=version)
    return path(name)


rng = np.random.default_rng(0)
cases = [  # (heads or None, n_q, n_k, d, d_v)
    (None, 200, 200, 32, 16),
    (None, 120, 333, 24, 8),   # cross-attention
    (3, 150, 150, 16, 16),     # a batch of heads
    (2, 64, 97, 16, 5),        # heads and cross
]
for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12)):
    for heads, nq, nk, d, dv in cases:
        for causal in (False, True):
            for method in ("exact", "exact:impl=materialized"):
                lead = () if heads is None else (heads,)
                q = rng.standard_normal(lead + (nq, d)).astype(dtype)
                k = rng.standard_normal(lead + (nk, d)).astype(dtype)
                v = rng.standard_normal(lead + (nk, dv)).astype(dtype)
                fq, fk, fv = save("q.npy", q), save("k.npy", k, version=(2, 0)), save("v.npy", v, fortran=True)
                args = ["apply", "--method", method, "--q", fq, "--k", fk, "--v", fv, "--out", path("o.npy"),
                        "--matrix", path("p.npy")]
                if causal:
                    args.append("--causal")
                r = run(*args)
                what = f"{np.dtype(dtype).name} {method} heads={heads} nq={nq} nk={nk} causal={causal}"
                c.check(r.returncode == 0, f"{what}: exit {r.returncode} {r.stderr.strip()}")
                if r.returncode:
                    continue
                o, p = np.load(path("o.npy")), np.load(path("p.npy"))
                c.check(o.dtype == dtype and o.shape == lead + (nq, dv),
                        f"{what}: output dtype/shape {o.dtype} {o.shape}")
                c.check(p.shape == lead + (nq, nk), f"{what}: matrix shape {p.shape}")
                qs, ks, vs = (a.reshape((-1,) + a.shape[-2:]) for a in (q, k, v))
                os_, ps = o.reshape((-1, nq, dv)), p.reshape((-1, nq, nk))
                for h in range(qs.shape[0]):
                    p_ref, o_ref = reference(qs[h], ks[h], vs[h], 1 / np.sqrt(d), causal)
                    e_o, e_p = rel(os_[h], o_ref), rel(ps[h], p_ref)
                    c.check(e_o < tol, f"{what} head {h}: output rel err {e_o:.2e} >= {tol}")
                    c.check(e_p < tol, f"{what} head {h}: matrix rel err {e_p:.2e} >= {tol}")

# An explicit scale, logits ×100 (no NaN/Inf), a 3.0-format file, and a float64 file computed in float32.
q = rng.standard_normal((96, 16)); k = rng.standard_normal((96, 16)); v = rng.standard_normal((96, 8))
save("q3.npy", q, version=(3, 0)); save("k3.npy", k); save("v3.npy", v)
for scale, dtype_flag, tol in ((25.0, "f64", 1e-12), (0.1, "f32", 1e-5)):
    r = run("apply", "--q", path("q3.npy"), "--k", path("k3.npy"), "--v", path("v3.npy"), "--out", path("o3.npy"),
            "--scale", scale, "--dtype", dtype_flag, "--causal")
    c.check(r.returncode == 0, f"scale {scale}: exit {r.returncode} {r.stderr.strip()}")
    if r.returncode == 0:
        o = np.load(path("o3.npy"))
        ref = reference(q.astype(o.dtype), k.astype(o.dtype), v.astype(o.dtype), scale, True)[1]
        c.check(np.isfinite(o).all(), f"scale {scale}: non-finite output")
        c.check(rel(o, ref) < tol, f"scale {scale} {dtype_flag}: rel err {rel(o, ref):.2e}")
        c.check(o.dtype == (np.float64 if dtype_flag == "f64" else np.float32), f"--dtype {dtype_flag} gave {o.dtype}")

c.finish()
