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

Debian's python3-torch (CPU), never a dependency of attnlab. Each transcription is the straightforward eager code of
the method's equations (what one writes in a notebook), with random parameters (Performer's ω, Linformer's E, F)
drawn once outside the timed call, as attnlab caches them. Time: the best of several calls after a warm-up.
OpenBLAS picks generic kernels on some virtual CPUs: set OPENBLAS_CORETYPE to the real core (Haswell on AVX2,
SkylakeX on AVX-512) before running; the value in force is recorded in every row.
"""
import argparse
import csv
import math
import os
import sys
import time

try:
    import torch
except ImportError:
    sys.exit(f"bench_peers: torch is missing for {sys.executable}; apt-get install python3-torch, "
             "or set ATTNLAB_PYTHON")


# ------------------------------------------------------------------------------------------- transcriptions
def exact(q, k, v, p):
    return torch.softmax(q @ k.T * p["scale"], dim=-1) @ v


def linear(q, k, v, p):
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    return (fq @ (fk.T @ v)) / (fq @ fk.sum(0))[:, None]


def performer(q, k, v, p):
    w = p["omega"]   # M × d, orthogonal rows with χ norms (FAVOR+)
    r = p["scale"] ** 0.5

    def feats(x):
        x = x * r
        proj = x @ w.T
        return torch.exp(proj - (x * x).sum(-1, keepdim=True) / 2 - proj.max(-1, keepdim=True).values)

    fq = feats(q)
    proj_k = (k * r) @ w.T
    fk = torch.exp(proj_k - (k * r).pow(2).sum(-1, keepdim=True) / 2 - proj_k.max())
    return (fq @ (fk.T @ v)) / (fq @ fk.sum(0))[:, None]


def nystrom(q, k, v, p, m=64, iters=6):
    n = q.shape[0]
    ql, kl = q.reshape(m, n // m, -1).mean(1), k.reshape(m, n // m, -1).mean(1)
    s = p["scale"]
    f = torch.softmax(q @ kl.T * s, -1)
    a = torch.softmax(ql @ kl.T * s, -1)
    b = torch.softmax(ql @ k.T * s, -1)
    # Nyströmformer's iterative pseudo-inverse (its reference code)
    z = a.T / (a.abs().sum(0).max() * a.abs().sum(1).max())
    eye = torch.eye(m, dtype=q.dtype)
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return f @ (z @ (b @ v))


def linformer(q, k, v, p):
    e, f = p["E"], p["F"]   # k × n
    return torch.softmax(q @ (e @ k).T * p["scale"], -1) @ (f @ v)


def local(q, k, v, p, w=64):
    """Sliding window |i − j| ≤ w: blocks of w queries against their block and both neighbours (the usual eager
    form, as lucidrains' local-attention), the band masked."""
    n, d = q.shape
    nb = n // w
    qb = q.reshape(nb, w, d)
    pad = lambda x: torch.cat([x.new_zeros(w, x.shape[1]), x, x.new_zeros(w, x.shape[1])])  # noqa: E731
    kp, vp = pad(k), pad(v)
    idx = torch.arange(nb)[:, None] * w + torch.arange(3 * w)[None, :]
    kb, vb = kp[idx], vp[idx]   # nb × 3w × d
    logits = torch.einsum("bid,bjd->bij", qb, kb) * p["scale"]
    qi = torch.arange(w)[:, None] + w
    kj = torch.arange(3 * w)[None, :]
    keypos = idx[:, None, :] - w   # the key each column holds (−w.. for padding)
    mask = ((qi - kj).abs() > w)[None] | (keypos < 0) | (keypos >= n)
    logits = logits.masked_fill(mask, float("-inf"))
    return torch.einsum("bij,bjd->bid", torch.softmax(logits, -1), vb).reshape(n, d)


def reformer(q, k, v, p, buckets=8, rounds=2, chunk=64):
    """Angular LSH with shared QK (the Reformer paper's form: keys = queries here would need shared projections;
    we hash q and k alike), sort by bucket, chunks attend to themselves and the previous chunk, rounds combined by
    their log-sum-exp."""
    n, d = q.shape
    outs, lses = [], []
    for r in range(rounds):
        rot = p["rot"][r]   # d × buckets/2
        hq = torch.cat([q @ rot, -(q @ rot)], -1).argmax(-1)
        hk = torch.cat([k @ rot, -(k @ rot)], -1).argmax(-1)
        sq = torch.argsort(hq * n + torch.arange(n))
        sk = torch.argsort(hk * n + torch.arange(n))
        nc = n // chunk
        qc = q[sq].reshape(nc, chunk, d)
        kc, vc = k[sk].reshape(nc, chunk, d), v[sk].reshape(nc, chunk, d)
        kc2 = torch.cat([kc, kc.roll(1, 0)], 1)
        vc2 = torch.cat([vc, vc.roll(1, 0)], 1)
        logits = torch.einsum("cid,cjd->cij", qc, kc2) * p["scale"]
        lse = torch.logsumexp(logits, -1, keepdim=True)
        o = torch.einsum("cij,cjd->cid", torch.exp(logits - lse), vc2).reshape(n, d)
        inv = torch.empty_like(sq)
        inv[sq] = torch.arange(n)
        outs.append(o[inv])
        lses.append(lse.reshape(n)[inv])
    lse = torch.stack(lses)   # rounds × n
    wts = torch.softmax(lse, 0)
    return sum(wts[r][:, None] * outs[r] for r in range(rounds))


@torch.no_grad()
def codebook(k, p, codes=64, iters=20):
    """Transformer-VQ's codebook: k-means on the keys (Lloyd, as one would write it), fitted, not differentiated (a
    trained model holds it; see --backward). Returns (C, the keys' assignments)."""
    k = k.detach()
    c = k[p["init"]].clone()
    for _ in range(iters):
        a = torch.cdist(k, c).argmin(-1)
        onehot = torch.nn.functional.one_hot(a, codes).to(k.dtype)
        cnt = onehot.sum(0)
        c = torch.where(cnt[:, None] > 0, (onehot.T @ k) / cnt.clamp(min=1)[:, None], c)
    return c, torch.cdist(k, c).argmin(-1)


def vq(q, k, v, p, codes=64):
    """Transformer-VQ: the codebook, then exp(QCᵀ)(ΔᵀV)."""
    c, a = codebook(k, p, codes)
    onehot = torch.nn.functional.one_hot(a, codes).to(k.dtype)
    logits = q @ c.T * p["scale"]
    e = torch.exp(logits - logits.max(-1, keepdim=True).values)
    return (e @ (onehot.T @ v)) / (e @ onehot.sum(0))[:, None]


def probsparse(q, k, v, p, factor=5):
    """Informer's ProbSparse (its _prob_QK): M̄ from c·ln n sampled keys, exact rows for the top c·ln n queries,
    mean(V) for the rest."""
    n = q.shape[0]
    u = min(n, int(factor * math.ceil(math.log(n))))
    idx = p["sample_per_query"][:, :u]   # Informer samples U keys per query (index_sample of shape L_Q × U)
    qk = torch.einsum("id,iud->iu", q, k[idx])
    m = qk.max(-1).values - qk.sum(-1) / n
    top = m.topk(u).indices
    out = v.mean(0, keepdim=True).expand(n, -1).clone()
    out[top] = torch.softmax(q[top] @ k.T * p["scale"], -1) @ v
    return out


def vq_straight_through(q, k, v, p, codes=64):
    """Transformer-VQ as it trains: the keys quantized with the straight-through estimator, attention over them."""
    c, a = codebook(k, p, codes)
    k_hat = k + (c[a] - k).detach()
    return torch.softmax(q @ k_hat.T * p["scale"], -1) @ v


METHODS = {"exact": exact, "linear": linear, "performer": performer, "nystrom": nystrom, "linformer": linformer,
           "local": local, "reformer": reformer, "vq": vq, "probsparse": probsparse}


def params(n, d, dtype, gen):
    """The random parameters, drawn once (not timed)."""
    m = 256
    blocks = []
    for _ in range(math.ceil(m / d)):
        g, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
        blocks.append(g.T)
    omega = torch.cat(blocks)[:m] * torch.randn(m, d, generator=gen, dtype=torch.float64).norm(dim=1, keepdim=True)
    return {"scale": 1 / math.sqrt(d), "omega": omega.to(dtype),
            "E": (torch.randn(256, n, generator=gen) / 16).to(dtype),
            "F": (torch.randn(256, n, generator=gen) / 16).to(dtype),
            "rot": [torch.randn(d, 4, generator=gen).to(dtype) for _ in range(2)],
            "init": torch.randperm(n, generator=gen)[:64],
            "sample_per_query": torch.randint(n, (n, 64), generator=gen)}


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
