"""`attnlab report` on its inputs: a hand-written export's meta.json is refused saying what is wrong and what a valid
export is; one causal rule for --model-dir and the user's .npy files (a capture that says causal or bidirectional —
an export's meta.json, a file's FILE.npy.json — must agree with --causal; bare files are treated as bidirectional and
the report says so); and the report names the sequence it used of a capture of several — on stdout, in summary.md,
index.html and report.csv.config."""
import json
import os

import numpy as np

from harness import Checks, path, run

c = Checks()
rng = np.random.default_rng(3)
BARE = "attention treated as bidirectional (non-causal): pass --causal if the model is causal"


def export(name, meta, seqs=3, layers=1, heads=2, n=16, d=4):
    root = path(name)
    os.makedirs(os.path.join(root, "captured"), exist_ok=True)
    for s in range(seqs):
        for l in range(layers):
            for w in "qkv":
                np.save(os.path.join(root, "captured", f"seq{s}_layer{l}_{w}.npy"),
                        rng.standard_normal((heads, n, d)).astype(np.float32))
    with open(os.path.join(root, "meta.json"), "w") as f:
        f.write(meta if isinstance(meta, str) else json.dumps(meta))
    return root


def report(out, *args):
    return run("report", *args, "--out", path(out), "--families", "local", "--repeats", 1, timeout=300)


def one_line_error(r, what):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    c.check(r.returncode > 0 and len(lines) == 1, f"{what}: one line, exit > 0: {r.returncode} {r.stderr!r}")
    return lines[0] if lines else ""


def files_of(out):
    d = path(out)
    return [open(os.path.join(d, f), encoding="utf-8").read() for f in ("summary.md", "index.html",
                                                                          "report.csv.config")]


# 1. A hand-written meta.json: "key" present but not lowercase hex, or absent; "bidirectional" not a boolean.
mygpt = export("mygpt", {"key": "mygpt", "bidirectional": True}, seqs=1)
msg = one_line_error(report("r_mygpt", "--model-dir", mygpt), "key mygpt")
for w in [f'{mygpt}/meta.json: "key" is "mygpt", not a string of lowercase hex digits ([0-9a-f]+',
          f'a valid export is {mygpt}/meta.json, a JSON object with "key": "<lowercase hex>" and "bidirectional": '
          f'true|false', f"{mygpt}/captured/seq{{s}}_layer{{l}}_{{q,k,v}}.npy",
          f"attnlab.torch.capture(model).save({mygpt}) writes one for your model",
          f"tools/trained_attention.py --out {mygpt} the project's"]:
    c.check(w in msg, f"key mygpt: message lacks {w!r}: {msg!r}")
c.check('has no "key"' not in msg and "make it with" not in msg, f"key mygpt: no misleading advice: {msg!r}")
nokey = export("nokey", {"bidirectional": True}, seqs=1)
msg = one_line_error(report("r_nokey", "--model-dir", nokey), "no key")
c.check('meta.json has no "key" (a string of lowercase hex digits' in msg and "a valid export is" in msg, msg)
yes = export("yes", '{"key": "00ff", "bidirectional": "yes"}', seqs=1)
msg = one_line_error(report("r_yes", "--model-dir", yes), "bidirectional yes")
c.check('"bidirectional" is "yes", not true or false (a JSON boolean: false for a causal model)' in msg, msg)
c.check(not os.path.exists(path("r_mygpt/report.csv")), "nothing written for a refused export")

# 2. Any lowercase hex key is accepted; the report names the sequence it used and the mask meta.json states.
three = export("three", {"key": "0", "bidirectional": True})
r = report("r_three", "--model-dir", three, "--seq", 1)
c.check(r.returncode == 0, f"--model-dir with key '0': {r.stderr[-400:]}")
if r.returncode == 0:
    seq_note = "sequence 1 of 3 (use --seq S for another)"
    mask_note = f"attention bidirectional (non-causal), as {three}/meta.json says"
    c.check(f"report: {seq_note}\n" in r.stdout and f"report: {mask_note}\n" in r.stdout, f"stdout: {r.stdout!r}")
    c.check(r.stdout.splitlines()[-1].startswith("wrote "), f"the last line is still 'wrote ...': {r.stdout!r}")
    for text, name in zip(files_of("r_three"), ("summary.md", "index.html", "report.csv.config")):
        c.check(seq_note in text and mask_note in text, f"{name} names the sequence and the mask")
# The same export with --causal contradicts its meta.json.
msg = one_line_error(report("r_three_causal", "--model-dir", three, "--causal"), "bidirectional export, --causal")
c.check(f"is a bidirectional model's (as {three}/meta.json says); drop --causal" in msg, msg)

# 3. Bare .npy files: bidirectional as today, and said so; with --causal, causal.
q, k, v = (rng.standard_normal((2, 16, 4)).astype(np.float32) for _ in range(3))
bare = {}
for w, a in zip("qkv", (q, k, v)):
    os.makedirs(path("bare"), exist_ok=True)
    bare[w] = os.path.join(path("bare"), f"{w}.npy")
    np.save(bare[w], a)
args = ["--q", bare["q"], "--k", bare["k"], "--v", bare["v"]]
r = report("r_bare", *args)
c.check(r.returncode == 0 and f"report: {BARE}\n" in r.stdout, f"bare files: {r.stdout!r} {r.stderr[-300:]}")
if r.returncode == 0:
    for text, name in zip(files_of("r_bare"), ("summary.md", "index.html", "report.csv.config")):
        c.check(BARE in text, f"bare files: {name} states the bidirectional treatment")
    c.check("sequence" not in r.stdout, f"bare files: no sequence claimed: {r.stdout!r}")
r = report("r_bare_causal", *args, "--causal")
c.check(r.returncode == 0 and "report: attention treated as causal (--causal)\n" in r.stdout, r.stdout)

# 4. A sidecar travels with the files: q.npy.json {"causal": true} needs --causal; {"causal": false} refuses it.
with open(bare["q"] + ".json", "w") as f:
    json.dump({"causal": True}, f)
msg = one_line_error(report("r_side", *args), "causal sidecar without --causal")
c.check(f"is a causal model's (as {bare['q']}.json says); add --causal" in msg, msg)
c.check(not os.path.exists(path("r_side/report.csv")), "nothing written for a refused sidecar")
r = report("r_side_causal", *args, "--causal")
c.check(r.returncode == 0 and f"report: attention causal, as {bare['q']}.json says\n" in r.stdout,
        f"causal sidecar with --causal: {r.stdout!r} {r.stderr[-300:]}")
with open(bare["q"] + ".json", "w") as f:
    json.dump({"causal": False}, f)
msg = one_line_error(report("r_side_bidi", *args, "--causal"), "bidirectional sidecar with --causal")
c.check("is a bidirectional model's" in msg and "drop --causal" in msg, msg)
with open(bare["k"] + ".json", "w") as f:
    json.dump({"causal": True}, f)
msg = one_line_error(report("r_side_both", *args), "sidecars that disagree")
c.check("says the model is bidirectional" in msg and "k.npy.json that it is causal" in msg, msg)

# 5. One sequence's files of a causal capture: the export's meta.json speaks for them; the sequence is named.
causal = export("causal", {"key": "abc", "bidirectional": False})
part = os.path.join(causal, "captured")
fargs = [a for w in "qkv" for a in (f"--{w}", os.path.join(part, f"seq2_layer0_{w}.npy"))]
msg = one_line_error(report("r_cap", *fargs), "a causal capture's files without --causal")
c.check(f"(as {causal}/meta.json says); add --causal" in msg, msg)
r = report("r_cap_causal", *fargs, "--causal")
c.check(r.returncode == 0 and
        f"report: sequence 2 of 3 (use --model-dir {part} --layers 0 --seq S for another)\n" in r.stdout and
        f"report: attention causal, as {causal}/meta.json says\n" in r.stdout, f"{r.stdout!r} {r.stderr[-300:]}")
# ... and --model-dir on the same export: the same rule.
msg = one_line_error(report("r_cap_dir", "--model-dir", causal), "a causal export without --causal")
c.check(f"(as {causal}/meta.json says); add --causal" in msg, msg)
r = report("r_cap_dir_causal", "--model-dir", part, "--causal")
c.check(r.returncode == 0 and "report: sequence 0 of 3 (use --seq S for another)\n" in r.stdout, r.stdout)
c.finish()
