#!/usr/bin/env python3
"""Real attention for attnlab: train a small byte-level transformer on the Python standard library's sources and
export, per layer and head, the Q, K, V of held-out sequences (and the model's own attention, for checking) as .npy,
for the trained model and for the same model at initialisation.

Why rotary positions: a few minutes of CPU training is too short for learned absolute positions to produce local or
content heads (see --positions); with rotary ones (RoFormer) q.k depends on the offset and such heads form early.
Why a bidirectional masked LM by default: Linformer's spectra (its Fig. 1) and Nyströmformer's results come from
masked-LM attention (RoBERTa); a causal model's attention has a long spectral tail from the mask alone, which says
nothing about the non-causal methods. `--objective causal` trains a GPT-style model instead.

The corpus is a committed snapshot (models/stdlib_corpus.tar.xz, PSF licence): the 171 top-level *.py files of
Python 3.11's standard library as Debian 12 shipped them (libpython3.11-stdlib 3.11.2-6+deb12u6; sub-directories are
left out because other packages add to them). The system's own stdlib changes with every Debian point release, so
it is read only when asked (--corpus system); the snapshot makes the corpus, and so the committed weights and the
exported attention, the same on every machine. Whole files are held out (every 10th in sorted order), so exported
sequences are text the model never saw.

Deterministic: fixed seed, fixed thread count, deterministic algorithms, batches drawn from a seeded generator.
Training is bitwise reproducible on one machine only (other CPUs take other kernels in float32); the committed
weights are what it gave, keyed on what determines them (training version, settings, corpus hash, torch
major.minor). The export runs the model in float64 and rounds Q, K, V to float32 once, so it is the same bits on
every CPU (checked against models/trained_attention.export.json). Cached: the output directory records a request
key (training key, script, sequences); a run with the same request does nothing.

Layout written under OUT (default data/attention):
  meta.json                       configuration, corpus hash, training curve, held-out loss, sequence sources,
                                  sha256 of every exported array; "key" names the data (a hash of the arrays)
  model_trained.pt                the trained weights ({train_key, state_dict, curve, ...}; --weights reuses one)
  {trained,initialized}/seq{s}_layer{l}_{q,k,v}.npy   float32 (heads, n, d_head); Q, K before the 1/sqrt(d_head)
                                                        scale, so attnlab's default scale reproduces the model
  {trained,initialized}/seq0_layer{l}_attn.npy        float32 (heads, n, n), the model's softmax, for checking
  {trained,initialized}/seq{s}_layer{l}_do.npy        float32 (heads, n, d_head), ∂loss/∂O of each head's output
                                                        (window_loss: the upstream gradient of the `gradients` run)

  tools/trained_attention.py [--out DIR] [--weights PT] [--corpus snapshot|system|DIR|TAR] [--steps N] [--tiny]
                             [--objective mlm|causal] [--force] [--snapshot-corpus TAR] ...
"""
import argparse
import copy
import hashlib
import io
import json
import math
import os
import sys
import sysconfig
import tarfile
import time

# OpenBLAS's own threads (on top of torch's) only add contention at these sizes; --threads sets torch's.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def pin_kernels():
    """One kernel family on every x86-64 CPU with AVX2 and FMA (all of this project's machines, AMD or Intel): torch
    and OpenBLAS otherwise pick AVX-512, AVX2 or generic code by CPU, and each rounds differently (measured: the
    initialised model's weights and every exported array differ between torch's default and AVX2 paths, and one
    float64-then-float32 value in 3 million between AVX2 and AVX-512). Must run before torch is imported.
    ATTNLAB_KERNELS=native leaves the choice to the libraries."""
    if os.environ.get("ATTNLAB_KERNELS") == "native":
        return "native"
    try:
        flags = next((line.split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    except OSError:
        flags = []
    if "avx2" in flags and "fma" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
        return "avx2"
    return "native (no AVX2: results may differ from the committed checksum)"


KERNELS = pin_kernels()
try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # a clear message, not a traceback: the set-up script installs these
    sys.exit(f"trained_attention: {e.name} is missing for {sys.executable}; run tools/setup.sh --python-stack "
             "(Debian packages python3-numpy, python3-torch) or set ATTNLAB_PYTHON")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoints import safe_load  # noqa: E402  (every checkpoint, --weights included: nothing in it is run)

SCHEMA = 2
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SNAPSHOT = os.path.join(ROOT, "models", "stdlib_corpus.tar.xz")


def _load_sdpa():
    """attnlab's standard attention call (python/attnlab/sdpa.py), loaded by path: pure PyTorch, so this script runs
    before attnlab's compiled module is built (the main job exports beside the build)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("attnlab_sdpa", os.path.join(ROOT, "python", "attnlab", "sdpa.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sdpa = _load_sdpa()
# The committed weights and the checksums of their export (trained and initialised Q, K, V at the default settings),
# per objective: a fresh machine's export must equal them bit for bit.
COMMITTED = {"mlm": ("trained_attention.pt", "trained_attention.export.json"),
             "causal": ("trained_attention_causal.pt", "trained_attention_causal.export.json")}


def committed(objective, what):
    """The committed weights (what="weights") or export checksums (what="checksums") of an objective."""
    return os.path.join(ROOT, "models", COMMITTED[objective][0 if what == "weights" else 1])
# Bump when anything that changes the trained weights changes (model, data pipeline, optimiser): committed
# checkpoints (--weights) carry a key over this, the training settings, the corpus and the torch version.
TRAINING_VERSION = 1
MASK = 256   # byte-level vocabulary: 0..255 are bytes, 256 is [MASK]
VOCAB = 257


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data/attention", help="output directory (default: %(default)s)")
    p.add_argument("--corpus", default="snapshot",
                   help="snapshot (default: models/stdlib_corpus.tar.xz, the same on every machine) | system (this "
                        "interpreter's stdlib, which changes with the Debian point release) | a directory of .py "
                        "files | a .tar.xz of them")
    p.add_argument("--snapshot-corpus", metavar="TAR", default=None,
                   help="write the --corpus files as a deterministic .tar.xz (how the snapshot was made) and exit")
    p.add_argument("--objective", choices=["mlm", "causal"], default="mlm")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=2,
                   help="sequences per forward pass (gradients accumulate): tensors over 32 MiB are mmap'ed afresh "
                        "by glibc every step, and the page faults cost more than the arithmetic (measured: a batch "
                        "of 8 x 512 runs 2.3x slower per token than 4 passes of 2)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--positions", choices=["learned", "sinusoidal", "rotary"], default="rotary",
                   help="rotary (default) | learned absolute (BERT) | sinusoidal (Vaswani). Measured at 200 steps: "
                        "with absolute positions every head is still near-uniform or attends to one place "
                        "(cumulative singular value at 128 >= 0.99 in all 16 heads); rotary heads are already "
                        "diverse (0.46-1.0), like the trained models of Linformer's Fig. 1")
    p.add_argument("--sequences", type=int, default=4, help="held-out sequences to export")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads, fixed for determinism (measured on 2 cores: 2 threads run 3.7x slower than 1 "
                        "at these sizes, Debian's torch 1.13 OpenMP)")
    p.add_argument("--tiny", action="store_true",
                   help="defaults of 2 layers, 2 heads, d_model 32, context 64, 30 steps (tests)")
    p.add_argument("--force", action="store_true", help="retrain even if the weights' training key matches")
    p.add_argument("--record-checksums", action="store_true",
                   help="write this export's checksums as the committed ones (models/trained_attention*.export.json, "
                        "per objective): how the committed files were made, after training the committed weights")
    p.add_argument("--weights", default=None,
                   help="a checkpoint to reuse or write: when it holds this configuration's training key, training "
                        "is skipped (training is deterministic, so it holds what training gives); otherwise the "
                        "model is trained and saved there")
    if "--tiny" in argv:   # defaults only: options given beside --tiny still win
        p.set_defaults(layers=2, heads=2, d_model=32, context=64, batch=8, steps=30, sequences=2)
    a = p.parse_args(argv)
    for name in ("layers", "heads", "d_model", "context", "batch", "micro_batch", "steps", "sequences", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.d_model % a.heads:
        p.error(f"--d-model {a.d_model} is not a multiple of --heads {a.heads}")
    if a.batch % a.micro_batch:
        p.error(f"--batch {a.batch} is not a multiple of --micro-batch {a.micro_batch}")
    if not (0 < a.lr < 1):
        p.error("--lr must be in (0, 1)")
    return a


# ---------------------------------------------------------------------------------------------------- corpus
def read_corpus(source):
    """[(file name, bytes)] in sorted order from the snapshot, the system stdlib, a directory or a tar archive."""
    if source == "snapshot":
        source = SNAPSHOT
    elif source == "system":
        source = sysconfig.get_paths()["stdlib"]
    if os.path.isdir(source):
        names = sorted(f for f in os.listdir(source) if f.endswith(".py") and os.path.isfile(os.path.join(source, f)))
        files = [(f, open(os.path.join(source, f), "rb").read()) for f in names]
    elif os.path.isfile(source):
        try:
            with tarfile.open(source) as tar:
                files = sorted((os.path.basename(m.name), tar.extractfile(m).read()) for m in tar.getmembers()
                               if m.isfile() and m.name.endswith(".py"))
        except (tarfile.TarError, OSError, EOFError) as e:
            sys.exit(f"trained_attention: corpus {source} is not a readable tar archive: {e}")
    else:
        sys.exit(f"trained_attention: corpus {source} does not exist")
    if len(files) < 10:
        sys.exit(f"trained_attention: only {len(files)} .py files in {source}; need at least 10")
    return source, files


def write_snapshot(files, path):
    """A deterministic .tar.xz: sorted names, zero times and owners, so the same files give the same bytes."""
    tmp = path + ".partial"
    with tarfile.open(tmp, "w:xz", format=tarfile.PAX_FORMAT, preset=9) as tar:
        for name, data in files:
            info = tarfile.TarInfo("stdlib/" + name)
            (info.size, info.mtime, info.mode, info.uid, info.gid, info.uname,
             info.gname) = len(data), 0, 0o644, 0, 0, "", ""
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)


def split_corpus(files):
    """Training bytes, held-out bytes (every 10th file), the held-out index and the corpus hash (over names and
    contents: the same hash whether the files come from a directory or the snapshot)."""
    train, held, held_index = [], [], []
    digest = hashlib.sha256()
    pos = 0
    for i, (f, data) in enumerate(files):
        digest.update(f.encode() + b"\0" + data)
        if i % 10 == 9:
            held_index.append((f, pos, len(data)))
            held.append(data)
            pos += len(data)
        else:
            train.append(data)
    train_bytes = np.frombuffer(b"".join(train), dtype=np.uint8).copy()   # writable: torch.from_numpy shares it
    held_bytes = np.frombuffer(b"".join(held), dtype=np.uint8).copy()
    return train_bytes, held_bytes, held_index, digest.hexdigest()


# ----------------------------------------------------------------------------------------------------- model
def rotate(x):
    """Rotary position embedding (Su et al., RoFormer eq. 34) on (b, h, n, d_head): pairs (x_2i, x_2i+1) turned by
    position * 10000^(-2i/d_head)."""
    n, dh = x.shape[-2], x.shape[-1]
    if x.dtype == torch.float64:   # the export: every step in float64 (see export())
        angle = (torch.arange(n, dtype=x.dtype)[:, None]
                 * (10000 ** (-torch.arange(0, dh, 2, dtype=x.dtype) / dh))[None, :])
    else:                          # training, exactly as the committed weights were trained
        angle = torch.arange(n)[:, None] * (10000 ** (-torch.arange(0, dh, 2) / dh))[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


class Block(nn.Module):
    """Pre-LayerNorm transformer block. Its attention is PyTorch 2's standard call (attnlab.sdpa.attention:
    torch.nn.functional.scaled_dot_product_attention where torch has it, else attnlab's exact one with the same
    arithmetic as this block always had), so that attnlab.torch.swap and capture see it as they see a user's."""

    def __init__(self, d, h, causal, rotary):
        super().__init__()
        self.h, self.dh, self.causal, self.rotary = h, d // h, causal, rotary
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def heads(self, x):
        """Q, K, V of every head, (b, h, n, d_head); Q, K rotated, before the 1/sqrt(d_head) scale."""
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)
        if self.rotary:   # RoFormer's rotary positions: q·k depends on the offset; exported Q, K are the rotated ones
            q, k = rotate(q), rotate(k)
        return q, k, v

    def attention(self, q, k, v):
        """Softmax attention of every head (b, h, n, d_head), through the standard call."""
        return sdpa.attention(q, k, v, is_causal=self.causal)

    def matrix(self, q, k):
        """The attention matrix P (b, h, n, n) of the same arithmetic (scale Q, product, mask, softmax), for checks."""
        n = q.shape[-2]
        logits = (q * (1 / math.sqrt(self.dh))) @ k.transpose(-1, -2)   # scaling q: n*d_head work, not n*n
        if self.causal:
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return logits.softmax(-1)

    def finish(self, x, o):
        """The rest of the block from the heads' outputs o (b, h, n, d_head): out-projection, residual, MLP."""
        b, h, n, dh = o.shape
        x = x + self.proj(o.transpose(1, 2).reshape(b, n, h * dh))
        return x + self.mlp(self.ln2(x))

    def forward(self, x, capture=None):
        q, k, v = self.heads(x)
        o = self.attention(q, k, v)
        if capture is not None:   # o whole: the export differentiates the loss by it
            capture.append((q[0], k[0], v[0], self.matrix(q[:1], k[:1])[0], o))
        return self.finish(x, o)


class ByteTransformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, a.d_model)
        self.pos = nn.Embedding(a.context, a.d_model)   # learned absolute positions (BERT/RoBERTa style)
        self.sinusoidal, self.rotary = a.positions == "sinusoidal", a.positions == "rotary"
        self.blocks = nn.ModuleList(Block(a.d_model, a.heads, a.objective == "causal", a.positions == "rotary")
                                    for _ in range(a.layers))
        self.ln = nn.LayerNorm(a.d_model)
        self.head = nn.Linear(a.d_model, 256)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        if self.sinusoidal:   # Vaswani et al.'s fixed encoding, token embeddings at the same scale
            pos = torch.arange(a.context)[:, None] / (10000 ** (torch.arange(0, a.d_model, 2) / a.d_model))[None, :]
            table = torch.zeros(a.context, a.d_model)
            table[:, 0::2], table[:, 1::2] = torch.sin(pos), torch.cos(pos)
            self.pos.weight.data.copy_(table)
            self.pos.weight.requires_grad_(False)
            nn.init.normal_(self.tok.weight, std=1.0)

    def forward(self, tokens, capture=None):
        x = self.tok(tokens)
        if not self.rotary:
            x = x + self.pos(torch.arange(tokens.shape[1]))
        for blk in self.blocks:
            x = blk(x, capture)
        return self.head(self.ln(x))


def make_batch(data, a, gen, size=None):
    """Random windows; for the masked LM, BERT's 15% masking (80% [MASK], 10% random byte, 10% kept)."""
    size = size or a.batch
    starts = torch.randint(0, len(data) - a.context - 1, (size,), generator=gen)
    idx = starts[:, None] + torch.arange(a.context + 1)[None, :]
    window = torch.from_numpy(data)[idx.reshape(-1)].reshape(size, a.context + 1).long()
    if a.objective == "causal":
        return window[:, :-1], window[:, 1:], None
    x = window[:, :-1].clone()
    target = window[:, :-1]
    chosen = torch.rand(x.shape, generator=gen) < 0.15
    r = torch.rand(x.shape, generator=gen)
    x[chosen & (r < 0.8)] = MASK
    rand_pos = chosen & (r >= 0.8) & (r < 0.9)
    x[rand_pos] = torch.randint(0, 256, (int(rand_pos.sum()),), generator=gen)
    return x, target, chosen


def loss_of(model, batch):
    x, target, chosen = batch
    logits = model(x)
    if chosen is None:
        return F.cross_entropy(logits.reshape(-1, 256), target.reshape(-1))
    return F.cross_entropy(logits[chosen], target[chosen])


# -------------------------------------------------------------------------------------------------- helpers
def progress(msg, done=False):
    if sys.stderr.isatty():
        sys.stderr.write("\r" + msg + ("\n" if done else ""))
    elif done:
        sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def save_npy(path, array):
    tmp = path + ".partial.npy"
    np.save(tmp, np.ascontiguousarray(array, dtype=np.float32))
    os.replace(tmp, path)   # a finished file or none: an interrupted export never leaves a torn .npy


def sha(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def training_key(a, corpus_hash):
    """(key, components): the weights are determined by the training code's version, the settings, the corpus and
    torch's major.minor (its kernels and initialisers; patch releases do not change them), and by nothing else."""
    config = {k: v for k, v in vars(a).items()
              if k not in ("out", "force", "tiny", "corpus", "weights", "snapshot_corpus", "sequences",
                           "record_checksums")}
    components = {"training_version": TRAINING_VERSION, "config": config, "corpus_sha256": corpus_hash,
                  "torch": ".".join(torch.__version__.split(".")[:2])}
    return sha(components), components


def key_mismatch(want, have):
    """Which components of two training keys differ, in words."""
    if not isinstance(have, dict):
        return "the checkpoint records no key components (written by an older script)"
    out = []
    for name in sorted(set(want) | set(have)):
        w, h = want.get(name), have.get(name)
        if name == "config" and isinstance(w, dict) and isinstance(h, dict):
            out += [f"setting {k}: checkpoint {h.get(k)!r}, asked {w.get(k)!r}"
                    for k in sorted(set(w) | set(h)) if w.get(k) != h.get(k)]
        elif w != h:
            out.append(f"{name}: checkpoint {h!r}, here {w!r}")
    return "; ".join(out) or "none (the key itself differs)"


def cached_export(directory, request):
    """The export's meta.json when it was written for this request (the settings that determine it), else None."""
    try:
        with open(os.path.join(directory, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if meta.get("request") == request else None


def start_export(directory):
    """A (re)export begins: the directory is stale until its new meta.json is written, last."""
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(os.path.join(directory, "meta.json")):
        os.remove(os.path.join(directory, "meta.json"))


def finish_export(directory, meta):
    """The export's meta.json, written last and atomically: its presence says the export is whole."""
    path = os.path.join(directory, "meta.json")
    with open(path + ".partial", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(path + ".partial", path)


def held_out_windows(held, held_index, a):
    """Evenly spaced windows of the held-out files (deterministic, no randomness needed)."""
    if len(held) < a.context * a.sequences:
        sys.exit(f"trained_attention: held-out text ({len(held)} bytes) is shorter than {a.sequences} x {a.context}")
    stride = (len(held) - a.context) // max(1, a.sequences - 1) if a.sequences > 1 else 0
    out = []
    for s in range(a.sequences):
        start = s * stride
        name = next((f for f, p, l in held_index if p <= start < p + l), "?")
        out.append((start, name, held[start:start + a.context]))
    return out


def window_loss(logits, tokens, causal):
    """The loss whose gradient the export records: the causal model's next-byte cross-entropy over the window; the
    masked LM's cross-entropy of every byte of the unmasked window (BERT's 10% "kept" case at every position: the
    exported Q, K, V are those of the unmasked window, so the gradient must be taken on the same forward)."""
    if causal:
        return F.cross_entropy(logits[0, :-1], tokens[0, 1:])
    return F.cross_entropy(logits[0], tokens[0])


def export(model, windows, directory):
    """Q, K, V (and the model's softmax for sequence 0) of each window, and dO = ∂loss/∂O of each head's attention
    output for window_loss() (what the model sends back into its attention when it trains on that window), computed
    in float64 and rounded to float32 once: float32 kernels differ between CPUs (AVX2, AVX-512: other summation
    orders, other bits), a float64 result rounded to float32 does not (a flip needs a float64 difference to straddle
    a float32 rounding boundary). Returns {file name: sha256 of its bytes}."""
    os.makedirs(directory, exist_ok=True)
    model64 = copy.deepcopy(model).double().eval()
    causal = model64.blocks[0].causal
    sums = {}
    for s, (_, _, window) in enumerate(windows):
        capture = []
        tokens = torch.from_numpy(window.astype(np.int64))[None, :]
        with torch.enable_grad():
            logits = model64(tokens, capture)
            outs = [c[4] for c in capture]   # autograd.grad by these alone: no parameter gradient is formed
            grads = torch.autograd.grad(window_loss(logits, tokens, causal), outs)
        for layer, ((q, k, v, p, _), g) in enumerate(zip(capture, grads)):
            items = [("q", q), ("k", k), ("v", v)] + ([("attn", p)] if s == 0 else []) + [("do", g[0])]
            for name, t in items:
                f = f"seq{s}_layer{layer}_{name}.npy"
                array = np.ascontiguousarray(t.detach().numpy(), dtype=np.float32)
                save_npy(os.path.join(directory, f), array)
                sums[f] = hashlib.sha256(array.tobytes()).hexdigest()
    return sums


def data_checksum(sums):
    """One hash over the Q, K, V arrays of both models (file names and array bytes): the data's identity."""
    digest = hashlib.sha256()
    for name in sorted(sums):
        if not name.endswith(("_attn.npy", "_do.npy")):   # the key is the attention's inputs (Q, K, V) alone
            digest.update(f"{name}:{sums[name]}\n".encode())
    return digest.hexdigest()


@torch.no_grad()
def held_out_loss(model, held, a, batches=16):
    gen = torch.Generator().manual_seed(a.seed + 1)
    model.eval()
    return float(np.mean([loss_of(model, make_batch(held, a, gen, a.micro_batch)).item() for _ in range(batches)]))


def train_model(model, train_bytes, a):
    """AdamW with linear warm-up and cosine decay, gradient clipping; returns the loss curve."""
    gen = torch.Generator().manual_seed(a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, s / a.steps)))))
    curve, t0, smooth = [], time.time(), None
    for step in range(a.steps):
        model.train()
        opt.zero_grad(set_to_none=True)
        parts = a.batch // a.micro_batch
        loss = 0.0
        for _ in range(parts):
            part = loss_of(model, make_batch(train_bytes, a, gen, a.micro_batch)) / parts
            part.backward()
            loss = loss + part.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        tenth = (step + 1) % max(1, a.steps // 10) == 0
        if step % 10 == 0 or step == a.steps - 1 or tenth:
            curve.append([step, round(loss.item(), 5)])
            el = time.time() - t0
            # a line every 10% in a log, a live line on a terminal
            progress(f"trained_attention: step {step + 1}/{a.steps} loss {smooth:.3f} "
                     f"elapsed {el:.0f} s, ~{el / (step + 1) * (a.steps - step - 1):.0f} s left",
                     done=step == a.steps - 1 or (tenth and not sys.stderr.isatty()))
    return curve, time.time() - t0


def main(argv):
    a = parse_args(argv)
    corpus_source, files = read_corpus(a.corpus)
    if a.snapshot_corpus:
        write_snapshot(files, a.snapshot_corpus)
        print(f"trained_attention: wrote {len(files)} files of {corpus_source} to {a.snapshot_corpus}")
        return 0
    train, held, held_index, corpus_hash = split_corpus(files)
    train_key, components = training_key(a, corpus_hash)
    script = hashlib.sha256(open(__file__, "rb").read()).hexdigest()
    request = sha({"schema": SCHEMA, "train": train_key, "script": script, "sequences": a.sequences,
                   "weights": os.path.abspath(a.weights) if a.weights else None})
    if not a.force and cached_export(a.out, request):
        print(f"trained_attention: {a.out} is up to date (request {request}); --force retrains")
        return 0
    start_export(a.out)

    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    model = ByteTransformer(a)
    windows = held_out_windows(held, held_index, a)
    sums = {f"initialized/{f}": h for f, h in export(model, windows, os.path.join(a.out, "initialized")).items()}
    init_loss = held_out_loss(model, held, a)

    source = None
    if a.weights and os.path.exists(a.weights) and not a.force:
        try:
            checkpoint = safe_load(a.weights)
        except Exception as e:   # a torn or foreign file: say so and train, never a traceback
            checkpoint = None
            print(f"trained_attention: {a.weights} is not a readable checkpoint ({e}); training")
        if isinstance(checkpoint, dict) and checkpoint.get("train_key") == train_key:
            model.load_state_dict(checkpoint["state_dict"])
            curve, train_time, source = checkpoint["curve"], checkpoint["train_seconds"], a.weights
            print(f"trained_attention: weights from {a.weights} (training key {train_key}); --force retrains")
        elif isinstance(checkpoint, dict):
            print(f"trained_attention: {a.weights} was trained with other inputs, so it is not used; training. "
                  f"Differs: {key_mismatch(components, checkpoint.get('key_components'))}")
    if source is None:
        curve, train_time = train_model(model, train, a)
        source = "trained here"
        checkpoint = {"train_key": train_key, "key_components": components, "state_dict": model.state_dict(),
                      "curve": curve, "train_seconds": round(train_time, 1), "config": components["config"]}
        for path in [os.path.join(a.out, "model_trained.pt")] + ([a.weights] if a.weights else []):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            torch.save(checkpoint, path + ".partial")
            os.replace(path + ".partial", path)
    sums.update({f"trained/{f}": h for f, h in export(model, windows, os.path.join(a.out, "trained")).items()})
    final_loss = held_out_loss(model, held, a)
    checksum = data_checksum(sums)

    # The committed weights' export must be the committed bits, on any CPU: compare when this is that export.
    verified = None
    export_checksums = committed(a.objective, "checksums")
    if a.record_checksums:
        record = {"comment": f"sha256 of the export of models/{COMMITTED[a.objective][0]} at the default settings "
                             f"(tools/trained_attention.py --objective {a.objective} --weights "
                             f"models/{COMMITTED[a.objective][0]}): every array, and one checksum over the Q, K, V "
                             "arrays. A fresh machine's export must equal these bit for bit; the script compares and "
                             "says so. Written by --record-checksums.",
                  "train_key": train_key, "sequences": a.sequences, "kernels": KERNELS, "checksum": checksum,
                  "files": dict(sorted(sums.items()))}
        with open(export_checksums + ".partial", "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(export_checksums + ".partial", export_checksums)
        print(f"trained_attention: recorded the export's checksums in {export_checksums}")
    if os.path.exists(export_checksums):
        want = json.load(open(export_checksums))
        if want.get("train_key") == train_key and want.get("sequences") == a.sequences:
            verified = want.get("checksum") == checksum
            if not verified:
                bad = sorted(f for f, h in want.get("files", {}).items() if sums.get(f) != h)
                print(f"trained_attention: WARNING: the export differs from the committed checksum "
                      f"({export_checksums}) in {len(bad)} arrays, e.g. {bad[:3]}: results from this data will not "
                      f"equal the committed ones", file=sys.stderr)

    meta = {
        "schema": SCHEMA, "key": checksum[:16], "request": request, "train_key": train_key,
        "key_components": components, "weights": source, "config": components["config"], "objective": a.objective,
        "bidirectional": a.objective == "mlm", "scale": 1 / math.sqrt(a.d_model // a.heads),
        "corpus": {"source": corpus_source, "files": len(files), "sha256": corpus_hash,
                   "train_bytes": int(len(train)), "held_out_bytes": int(len(held))},
        "held_out_loss_nats": {"initialized": init_loss, "trained": final_loss},
        "train_seconds": round(train_time, 1), "torch": torch.__version__, "curve": curve,
        "sequences": [{"index": s, "held_out_offset": int(o), "file": f} for s, (o, f, _) in enumerate(windows)],
        "checksum": checksum, "checksum_verified": verified, "kernels": KERNELS, "files": sums,
        "layout": "{model}/seq{s}_layer{l}_{q,k,v,do}.npy float32 (heads, n, d_head); "
                  "seq0_layer{l}_attn.npy (heads, n, n)",
    }
    finish_export(a.out, meta)
    check = {None: "", True: ", equal to the committed checksum", False: ", NOT equal to the committed checksum"}
    print(f"trained_attention: {a.layers} layers x {a.heads} heads, n={a.context}, {a.steps} steps "
          f"({source}, training {train_time:.0f} s); held-out loss {init_loss:.3f} -> {final_loss:.3f} nats/byte; "
          f"wrote {a.out} in {time.time() - t_start:.1f} s (data {checksum[:16]}{check[verified]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
