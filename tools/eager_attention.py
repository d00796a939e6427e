"""PyTorch eager transcriptions of attnlab's methods at its defaults — the code a researcher writes in a notebook —
shared by tools/bench_peers.py (one head on the CPU, beside attnlab's kernels), tools/bench_gpu.py (a batch of heads
on whatever device torch offers, in bfloat16, float16 and float32) and tools/gpu_precision.py (their rounding in
those formats, issue 39).

Every function takes q, k, v of shape (..., n, d) — the leading dimensions are heads (and batch) — and the dict p of
parameters drawn once outside the timed call (`params`, or `numpy_params` for inputs that must be rebuilt anywhere),
on any device and in any floating dtype. A 2-D (n × d) input runs the very operations bench_peers.py always ran,
with the same bits; the random parameters are shared by the heads (one draw per layer, as Performer's and
Linformer's reference code hold them). Whatever the format, the code computes in it: no upcast, no stabiliser the
method's reference code does not have (that is what bench_gpu.py and gpu_precision.py measure).

Causal forms where the method has one: exact attention masked (or SDPA's is_causal), linear attention and Performer
by prefix sums over blocks (Katharopoulos et al. 2020 §3.3; Choromanski et al. 2021's unidirectional FAVOR+), the
local window looking back only.
"""
import math

import torch
import torch.nn.functional as F


def _t(x):
    """xᵀ of the last two dimensions (x.T on 2-D, what bench_peers wrote)."""
    return x.transpose(-2, -1)


def _mv(a, x):
    """a · x for one vector x per leading index: torch's matrix–vector product on 2-D (bench_peers' `a @ x`, the same
    bits), a batched matrix product otherwise."""
    return a @ x if x.dim() == 1 else (a @ x[..., None])[..., 0]


def _keep(x):
    """x with two trailing unit dimensions to divide a batch of matrices by one number each; a 0-d x (2-D input) as
    it is, as bench_peers divided."""
    return x[..., None, None] if x.dim() else x


def _rows(x, idx):
    """x[..., idx, :] with one row index list per leading index (idx: (..., r)); x[idx] on 2-D."""
    return torch.gather(x, -2, idx[..., None].expand(*idx.shape, x.shape[-1]))


# ------------------------------------------------------------------------------------------- exact attention
def exact(q, k, v, p):
    """softmax(s·QKᵀ)V materialised (Vaswani et al. 2017, eq. 1): the n × n logits and probabilities stored."""
    return torch.softmax(q @ _t(k) * p["scale"], dim=-1) @ v


def exact_causal(q, k, v, p):
    """exact, key j > query i masked to −∞ before the softmax."""
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax((q @ _t(k) * p["scale"]).masked_fill(mask, float("-inf")), dim=-1) @ v


HAS_SDPA = hasattr(F, "scaled_dot_product_attention")   # torch >= 2.0


def exact_sdpa(q, k, v, p, causal=False):
    """PyTorch's fused exact attention, `torch.nn.functional.scaled_dot_product_attention` (FlashAttention,
    memory-efficient or cuDNN kernels on CUDA, a flash CPU kernel in torch >= 2.1; its math fallback otherwise). The
    fused kernels take 4-D (batch, heads, n, d) only: the heads go in as one sequence of them."""
    if not HAS_SDPA:
        raise NotImplementedError(f"torch {torch.__version__} has no scaled_dot_product_attention (torch >= 2.0)")
    lead = q.shape[:-2]
    q4, k4, v4 = (x.reshape(-1, *x.shape[-3:]) if x.dim() >= 3 else x[None, None] for x in (q, k, v))
    kw = {} if abs(p["scale"] - q.shape[-1] ** -0.5) < 1e-15 else {"scale": p["scale"]}   # scale=: torch >= 2.1
    out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, **kw)
    return out.reshape(*lead, *out.shape[-2:])


# ------------------------------------------------------------------------------------------- kernel methods
def causal_prefix(fq, fk, v, chunk=64):
    """Causal linear attention from features: out_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i with S_i = Σ_{j≤i} φ(k_j)v_jᵀ and
    z_i = Σ_{j≤i} φ(k_j) (Katharopoulos et al. 2020, eqs. 8–10), by blocks of `chunk` positions: the masked products
    inside a block and the prefix sums of the blocks' states before it (the chunked form attnlab and
    flash-linear-attention use; the per-position cumulative sum would hold n × m × d numbers)."""
    *lead, n, m = fq.shape
    dv = v.shape[-1]
    c = min(chunk, n)
    if n % c:
        raise ValueError(f"causal prefix sums: n = {n} is not a multiple of the block {c}")
    fqc, fkc, vc = fq.reshape(*lead, n // c, c, m), fk.reshape(*lead, n // c, c, m), v.reshape(*lead, n // c, c, dv)
    kv = _t(fkc) @ vc                                            # each block's Σ φ(k_j) v_jᵀ: (..., blocks, m, dv)
    state = torch.cat([torch.zeros_like(kv[..., :1, :, :]), kv[..., :-1, :, :].cumsum(-3)], -3)   # before the block
    ks = fkc.sum(-2)                                             # (..., blocks, m)
    zs = torch.cat([torch.zeros_like(ks[..., :1, :]), ks[..., :-1, :].cumsum(-2)], -2)
    intra = (fqc @ _t(fkc)).tril()                               # j ≤ i within the block
    num = intra @ vc + fqc @ state
    den = intra.sum(-1) + _mv(fqc, zs)
    return (num / den[..., None]).reshape(*lead, n, dv)


def linear(q, k, v, p, causal=False, chunk=64):
    """Linear attention, φ(x) = elu(x) + 1: φ(Q)(φ(K)ᵀV) / φ(Q)Σφ(k) (Katharopoulos et al. 2020, eq. 6 and §3.2)."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    if causal:
        return causal_prefix(fq, fk, v, chunk)
    return (fq @ (_t(fk) @ v)) / _mv(fq, fk.sum(-2))[..., None]


def performer(q, k, v, p, causal=False, chunk=64):
    """Performer's FAVOR+ (Choromanski et al. 2021, Lemma 1, eq. 7): positive features φ(x) = exp(ωx − ‖x‖²/2) on
    x·s^½ with ω = p["omega"] (M × d, orthogonal blocks with χ(d) row norms), stabilised as the reference code does —
    each query's row maximum and the keys' overall maximum (per head) subtracted inside the exponential; both cancel
    in the ratio (the keys' one also under the causal mask: one constant for every key)."""
    w = p["omega"]
    r = p["scale"] ** 0.5

    def feats(x):
        x = x * r
        proj = x @ _t(w)
        return torch.exp(proj - (x * x).sum(-1, keepdim=True) / 2 - proj.max(-1, keepdim=True).values)

    fq = feats(q)
    proj_k = (k * r) @ _t(w)
    fk = torch.exp(proj_k - (k * r).pow(2).sum(-1, keepdim=True) / 2 - proj_k.amax((-2, -1), keepdim=True))
    if causal:
        return causal_prefix(fq, fk, v, chunk)
    return (fq @ (_t(fk) @ v)) / _mv(fq, fk.sum(-2))[..., None]


# ------------------------------------------------------------------------------------------- low-rank methods
def nystrom(q, k, v, p, m=64, iters=6):
    """Nyströmformer (Xiong et al. 2021, eq. 14): softmax(QK̃ᵀ)·Z·softmax(Q̃Kᵀ)V with m segment-mean landmarks and Z
    the order-3 iterative pseudo-inverse of softmax(Q̃K̃ᵀ) from its reference code (Razavi et al. 2014), `iters`
    steps from Z₀ = Aᵀ / (‖A‖₁‖A‖∞), per head."""
    *lead, n, d = q.shape
    ql, kl = q.reshape(*lead, m, n // m, d).mean(-2), k.reshape(*lead, m, n // m, d).mean(-2)
    s = p["scale"]
    f = torch.softmax(q @ _t(kl) * s, -1)
    a = torch.softmax(ql @ _t(kl) * s, -1)
    b = torch.softmax(ql @ _t(k) * s, -1)
    # Aᵀ first, then its norms: the order bench_peers' autograd graph (and so its gradients' bits) has
    z = _t(a) / _keep(a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1))
    eye = torch.eye(m, device=q.device).to(q.dtype)   # (torch 1.13's CPU eye has no bfloat16)
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return f @ (z @ (b @ v))


def linformer(q, k, v, p):
    """Linformer (Wang et al. 2020, eq. 7): softmax(s·Q(EK)ᵀ)(FV) with E, F = p["E"], p["F"] (k × n, N(0, 1/k))."""
    e, f = p["E"], p["F"]
    return torch.softmax(q @ _t(e @ k) * p["scale"], -1) @ (f @ v)


# ------------------------------------------------------------------------------------------- sparse methods
def local(q, k, v, p, w=64, causal=False):
    """Sliding window |i − j| ≤ w (causal: 0 ≤ i − j ≤ w): blocks of w queries against their block and both
    neighbours (causal: the one before), the usual eager form (lucidrains' local-attention), the band masked. n must
    be a multiple of w."""
    *lead, n, d = q.shape
    nb = n // w
    qb = q.reshape(*lead, nb, w, d)
    pad = lambda x: torch.cat([x.new_zeros(*lead, w, d), x, x.new_zeros(*lead, w, d)], -2)  # noqa: E731
    kp, vp = pad(k), pad(v)
    span = 2 * w if causal else 3 * w
    idx = torch.arange(nb, device=q.device)[:, None] * w + torch.arange(span, device=q.device)[None, :]
    kb, vb = kp[..., idx, :], vp[..., idx, :]   # (..., nb, span, d)
    logits = torch.einsum("...bid,...bjd->...bij", qb, kb) * p["scale"]
    qi = torch.arange(w, device=q.device)[:, None] + w
    kj = torch.arange(span, device=q.device)[None, :]
    keypos = idx[:, None, :] - w   # the key each column holds (−w.. for padding)
    if causal:
        mask = ((qi - kj > w) | (kj > qi))[None] | (keypos < 0)
    else:
        mask = ((qi - kj).abs() > w)[None] | (keypos < 0) | (keypos >= n)
    logits = logits.masked_fill(mask, float("-inf"))
    return torch.einsum("...bij,...bjd->...bid", torch.softmax(logits, -1), vb).reshape(*lead, n, d)


def reformer(q, k, v, p, buckets=8, rounds=2, chunk=64):
    """Reformer's LSH attention (Kitaev et al. 2020, §2): angular LSH h(x) = argmax[xR; −xR] with R = p["rot"][r]
    (d × buckets/2; keys = queries would need shared projections, so q and k are hashed alike), sort by bucket,
    chunks of `chunk` attend to themselves and the previous chunk, the rounds combined by their log-sum-exp."""
    *lead, n, d = q.shape
    outs, lses = [], []
    pos = torch.arange(n, device=q.device)
    for r in range(rounds):
        rot = p["rot"][r]
        hq = torch.cat([q @ rot, -(q @ rot)], -1).argmax(-1)
        hk = torch.cat([k @ rot, -(k @ rot)], -1).argmax(-1)
        sq = torch.argsort(hq * n + pos)
        sk = torch.argsort(hk * n + pos)
        nc = n // chunk
        qc = _rows(q, sq).reshape(*lead, nc, chunk, d)
        kc, vc = _rows(k, sk).reshape(*lead, nc, chunk, d), _rows(v, sk).reshape(*lead, nc, chunk, d)
        kc2 = torch.cat([kc, kc.roll(1, -3)], -2)
        vc2 = torch.cat([vc, vc.roll(1, -3)], -2)
        logits = torch.einsum("...cid,...cjd->...cij", qc, kc2) * p["scale"]
        lse = torch.logsumexp(logits, -1, keepdim=True)
        o = torch.einsum("...cij,...cjd->...cid", torch.exp(logits - lse), vc2).reshape(*lead, n, d)
        inv = torch.empty_like(sq).scatter_(-1, sq, pos.expand_as(sq))
        outs.append(_rows(o, inv))
        lses.append(torch.gather(lse.reshape(*lead, n), -1, inv))
    wts = torch.softmax(torch.stack(lses), 0)   # rounds × ... × n
    return sum(wts[r][..., None] * outs[r] for r in range(rounds))


@torch.no_grad()
def codebook(k, p, codes=64, iters=20):
    """Transformer-VQ's codebook: k-means on the keys (Lloyd, as one would write it) from the keys p["init"][:codes],
    per head; fitted, not differentiated (a trained model holds it). Returns (C, the keys' assignments)."""
    k = k.detach()
    c = k[..., p["init"][:codes], :].clone()
    for _ in range(iters):
        a = torch.cdist(k, c).argmin(-1)
        onehot = F.one_hot(a, codes).to(k.dtype)
        cnt = onehot.sum(-2)
        c = torch.where(cnt[..., None] > 0, (_t(onehot) @ k) / cnt.clamp(min=1)[..., None], c)
    return c, torch.cdist(k, c).argmin(-1)


def vq(q, k, v, p, codes=64):
    """Transformer-VQ (Lingle 2023): the codebook, then exp(s·QCᵀ)(ΔᵀV) / exp(s·QCᵀ)Δᵀ1 with Δ the keys' one-hot
    assignments — linear in n; the keys reach the output only through the fixed codebook (no dK)."""
    c, a = codebook(k, p, codes)
    onehot = F.one_hot(a, codes).to(k.dtype)
    logits = q @ _t(c) * p["scale"]
    e = torch.exp(logits - logits.max(-1, keepdim=True).values)
    return (e @ (_t(onehot) @ v)) / _mv(e, onehot.sum(-2))[..., None]


def vq_straight_through(q, k, v, p, codes=64):
    """Transformer-VQ as it trains: the keys quantized with the straight-through estimator K̂ = K + sg(C[a] − K),
    attention over them (quadratic)."""
    c, a = codebook(k, p, codes)
    k_hat = k + (_rows(c, a) - k).detach()
    return torch.softmax(q @ _t(k_hat) * p["scale"], -1) @ v


def probsparse(q, k, v, p, factor=5):
    """Informer's ProbSparse (Zhou et al. 2021: the max-mean measurement M̄, as its _prob_QK computes it) from
    u = c·⌈ln n⌉ sampled keys per query (p["sample_per_query"], n × ≥ u), exact rows for the top u queries, mean(V)
    for the rest."""
    n = q.shape[-2]
    u = min(n, int(factor * math.ceil(math.log(n))))
    idx = p["sample_per_query"][:, :u]
    qk = torch.einsum("...id,...iud->...iu", q, k[..., idx, :])
    m = qk.max(-1).values - qk.sum(-1) / n
    top = m.topk(u).indices
    out = v.mean(-2, keepdim=True).expand_as(v)
    rows = torch.softmax(_rows(q, top) @ _t(k) * p["scale"], -1) @ v
    return out.scatter(-2, top[..., None].expand_as(rows), rows)


# name: (function, budget as attnlab's spec names it, has a causal form)
METHODS = {"exact": exact, "linear": linear, "performer": performer, "nystrom": nystrom, "linformer": linformer,
           "local": local, "reformer": reformer, "vq": vq, "probsparse": probsparse}
BUDGETS = {"exact": "", "linear": "feature=elu", "performer": "features=256", "nystrom": "landmarks=64,iters=6",
           "linformer": "k=256", "local": "window=64", "reformer": "buckets=8,rounds=2,chunk=64",
           "vq": "codes=64,iters=20", "probsparse": "factor=5"}
CAUSAL = {"exact", "linear", "performer", "local"}


def call(name, q, k, v, p, causal=False):
    """The method `name` of METHODS, causal where asked (ValueError where it has no causal form); exact attention
    eagerly materialised (bench_gpu.py and gpu_precision.py call exact_sdpa for the fused one)."""
    if not causal:
        return METHODS[name](q, k, v, p)
    if name not in CAUSAL:
        raise ValueError(f"{name} has no causal form")
    return exact_causal(q, k, v, p) if name == "exact" else METHODS[name](q, k, v, p, causal=True)


# ------------------------------------------------------------------------------------------- parameters
def orthogonal_features(d, m, gauss):
    """M × d orthogonal random features with χ(d) row norms (FAVOR+'s ORF): ⌈m/d⌉ blocks, each the transposed Q of
    a d × d Gaussian's QR, rows scaled by the norms of Gaussian d-vectors. `gauss(shape)` draws N(0, 1) in float64."""
    blocks = []
    for _ in range(math.ceil(m / d)):
        g, _ = torch.linalg.qr(gauss((d, d)))
        blocks.append(g.T)
    return torch.cat(blocks)[:m] * gauss((m, d)).norm(dim=1, keepdim=True)


def params(n, d, dtype, gen, device=None):
    """The random parameters, drawn once (not timed) from the CPU generator gen — bench_peers.py's draws, in its
    order — in dtype on device."""
    gauss = lambda shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    omega = orthogonal_features(d, 256, gauss)
    p = {"scale": 1 / math.sqrt(d), "omega": omega.to(dtype),
         "E": (torch.randn(256, n, generator=gen) / 16).to(dtype),
         "F": (torch.randn(256, n, generator=gen) / 16).to(dtype),
         "rot": [torch.randn(d, 4, generator=gen).to(dtype) for _ in range(2)],
         "init": torch.randperm(n, generator=gen)[:64],
         "sample_per_query": torch.randint(n, (n, 64), generator=gen)}
    return p if device is None else to_device(p, device)


def numpy_params(n, d, rng, features=256, k=256):
    """The same parameters drawn with numpy's Generator rng in float64 (Performer's ω as `orthogonal_features`,
    Linformer's E, F with N(0, 1/k) entries, LSH rotations, k-means seeds, ProbSparse's samples), as torch CPU
    float64 tensors: inputs that any machine rebuilds from the seed alone."""
    gauss = lambda shape: torch.from_numpy(rng.standard_normal(shape))  # noqa: E731
    return {"scale": 1 / math.sqrt(d), "omega": orthogonal_features(d, features, gauss),
            "E": torch.from_numpy(rng.standard_normal((k, n)) / math.sqrt(k)),
            "F": torch.from_numpy(rng.standard_normal((k, n)) / math.sqrt(k)),
            "rot": [torch.from_numpy(rng.standard_normal((d, 4))) for _ in range(2)],
            "init": torch.from_numpy(rng.permutation(n)[:64]),
            "sample_per_query": torch.from_numpy(rng.integers(0, n, (n, 64)))}


def to_device(p, device, dtype=None):
    """p with its tensors on device; the floating ones also cast to dtype when given (indices keep theirs)."""
    def move(x):
        if isinstance(x, list):
            return [move(y) for y in x]
        if not torch.is_tensor(x):
            return x
        return x.to(device=device, dtype=dtype if (dtype is not None and x.is_floating_point()) else x.dtype)
    return {key: move(x) for key, x in p.items()}
