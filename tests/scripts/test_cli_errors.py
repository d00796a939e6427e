"""Bad input to the attnlab command: every case exits non-zero with one line on stderr naming the problem,
never a crash (signal), a hang, a NaN output, or a half-written output file."""
import csv
import os
import sys

import numpy as np

from harness import Checks, path, run

c = Checks()
rng = np.random.default_rng(1)


def save(name, a):
    np.save(path(name), a)
    return path(name)


def write(name, data):
    with open(path(name), "wb") as f:
        f.write(data)
    return path(name)


good_q = save("q.npy", rng.standard_normal((64, 16)).astype(np.float32))
good_k = save("k.npy", rng.standard_normal((80, 16)).astype(np.float32))
good_v = save("v.npy", rng.standard_normal((80, 8)).astype(np.float32))
valid = open(good_k, "rb").read()

bad = {
    "malformed": write("text.npy", b"this is not an npy file at all, just text\n"),
    "truncated": write("trunc.npy", valid[: len(valid) // 2]),
    "header_only": write("hdr.npy", valid[:128]),
    "int32": save("i4.npy", rng.integers(0, 9, (80, 16)).astype(np.int32)),
    "complex": save("c8.npy", rng.standard_normal((80, 16)).astype(np.complex64)),
    "bigendian": save("be.npy", rng.standard_normal((80, 16)).astype(">f4")),
    "onedim": save("1d.npy", rng.standard_normal(80).astype(np.float32)),
    "fourdim": save("4d.npy", rng.standard_normal((1, 2, 80, 16)).astype(np.float32)),
}
lie = bytearray(valid)
i = lie.index(b"(80, 16)")
lie[i:i + 8] = b"(90, 16)"
bad["lying_header"] = write("lie.npy", bytes(lie))

nan_k = rng.standard_normal((80, 16)).astype(np.float32); nan_k[3, 5] = np.nan
inf_v = rng.standard_normal((80, 8)).astype(np.float32); inf_v[70, 1] = np.inf
nan_q = rng.standard_normal((2, 64, 16)); nan_q[1, 2, 3] = np.nan

cases = [
    # (what, args, words the message must contain)
    ("malformed file", ["--q", bad["malformed"], "--k", good_k, "--v", good_v], ["bad magic", "text.npy"]),
    ("truncated file", ["--q", good_q, "--k", bad["truncated"], "--v", good_v], ["truncated", "trunc.npy"]),
    ("header without data", ["--q", good_q, "--k", bad["header_only"], "--v", good_v], ["hdr.npy"]),
    ("lying header", ["--q", good_q, "--k", bad["lying_header"], "--v", good_v], ["lie.npy", "bytes"]),
    ("int32 dtype", ["--q", good_q, "--k", bad["int32"], "--v", good_v], ["'<i4' is not supported"]),
    ("complex dtype", ["--q", good_q, "--k", good_k, "--v", bad["complex"]], ["'<c8' is not supported"]),
    ("big-endian", ["--q", good_q, "--k", bad["bigendian"], "--v", good_v], ["big-endian"]),
    ("1-D array", ["--q", bad["onedim"], "--k", good_k, "--v", good_v], ["1 dimensions"]),
    ("4-D array", ["--q", good_q, "--k", bad["fourdim"], "--v", good_v], ["4 dimensions"]),
    ("n_k of K != n_k of V", ["--q", good_q, "--k", good_k, "--v", save("v90.npy", rng.standard_normal((90, 8)))],
     ["n_k = 80", "90"]),
    ("d of Q != d of K", ["--q", save("q8.npy", rng.standard_normal((64, 8))), "--k", good_k, "--v", good_v],
     ["d = 8", "d = 16"]),
    ("NaN in K", ["--q", good_q, "--k", save("nank.npy", nan_k), "--v", good_v], ["NaN", "row 3, column 5"]),
    ("Inf in V", ["--q", good_q, "--k", good_k, "--v", save("infv.npy", inf_v)], ["Inf", "row 70"]),
    ("NaN in a head", ["--q", save("nanq.npy", nan_q), "--k", save("k3.npy", rng.standard_normal((2, 80, 16))),
                       "--v", save("v3.npy", rng.standard_normal((2, 80, 8)))], ["NaN", "head 1"]),
    ("2-D mixed with 3-D", ["--q", good_q, "--k", save("k3b.npy", rng.standard_normal((1, 80, 16))), "--v", good_v],
     ["(n, d)", "(h, n, d)"]),
    ("head counts", ["--q", save("q2h.npy", rng.standard_normal((2, 64, 16))),
                     "--k", save("k3h.npy", rng.standard_normal((3, 80, 16))),
                     "--v", save("v3h.npy", rng.standard_normal((3, 80, 8)))], ["head counts"]),
    ("missing file", ["--q", path("nope.npy"), "--k", good_k, "--v", good_v], ["nope.npy", "cannot open"]),
    ("unknown method", ["--method", "attentionformer", "--q", good_q, "--k", good_k, "--v", good_v],
     ["no method 'attentionformer'", "registered methods: exact, linear"]),
    ("misspelt method", ["--method", "Nystrom", "--q", good_q, "--k", good_k, "--v", good_v],
     ["no method 'Nystrom'; did you mean nystrom?"]),
    ("longer method name", ["--method", "nystromformer:landmarks=8", "--q", good_q, "--k", good_k, "--v", good_v],
     ["no method 'nystromformer'; did you mean nystrom?"]),
    ("unknown key", ["--method", "exact:landmarks=4", "--q", good_q, "--k", good_k, "--v", good_v],
     ["no parameter 'landmarks'", "valid: impl, tile"]),
    ("misspelt key", ["--method", "nystrom:landmark=4", "--q", good_q, "--k", good_k, "--v", good_v],
     ["no parameter 'landmark'; did you mean landmarks?"]),
    ("bad value", ["--method", "exact:tile=-3", "--q", good_q, "--k", good_k, "--v", good_v], ["integer in"]),
    ("bad spec syntax", ["--method", "exact:tile", "--q", good_q, "--k", good_k, "--v", good_v], ["key=value"]),
    ("causal with n_q > n_k", ["--causal", "--q", good_k, "--k", good_q,
                                "--v", save("v64.npy", rng.standard_normal((64, 8)).astype(np.float32))],
     ["causal", "n_k >= n_q"]),
    ("NaN scale", ["--scale", "nan", "--q", good_q, "--k", good_k, "--v", good_v], ["scale"]),
    ("negative scale", ["--scale", "-1", "--q", good_q, "--k", good_k, "--v", good_v], ["scale"]),
    ("bad dtype flag", ["--dtype", "f16", "--q", good_q, "--k", good_k, "--v", good_v], ["dtype"]),
    ("nystrom refuses causal", ["--method", "nystrom:landmarks=8", "--causal", "--q", good_q, "--k", good_k,
                                "--v", good_v], ["nystrom", "causal"]),
    ("linformer refuses causal", ["--method", "linformer:k=8", "--causal", "--q", good_q, "--k", good_k,
                                  "--v", good_v], ["linformer", "causal"]),
    ("efficient refuses causal", ["--method", "efficient", "--causal", "--q", good_q, "--k", good_k, "--v", good_v],
     ["efficient", "causal"]),
    ("landmarks beyond n", ["--method", "nystrom:landmarks=100", "--q", good_q, "--k", good_k, "--v", good_v],
     ["landmarks = 100"]),
    ("Linformer's k beyond n", ["--method", "linformer:k=1000", "--q", good_q, "--k", good_k, "--v", good_v],
     ["linformer: k = 1000 exceeds the sequence (n_k = 80)"]),
    ("mixed dtypes", ["--q", good_q, "--k", save("k64.npy", rng.standard_normal((80, 16))), "--v", good_v],
     ["float32", "k64.npy is float64", "differ in dtype", "--dtype f32|f64"]),
    ("matrix over --max-memory", ["--max-memory", "16K", "--matrix", path("p.npy"),
                                   "--q", good_q, "--k", good_k, "--v", good_v], ["needs", "--max-memory"]),
    ("bad --max-memory", ["--max-memory", "lots", "--q", good_q, "--k", good_k, "--v", good_v], ["memory size"]),
    ("unwritable output", ["--q", good_q, "--k", good_k, "--v", good_v, "--out", "/nonexistent/dir/o.npy"],
     ["cannot write"]),
]

for what, args, words in cases:
    out = path("out.npy")
    if os.path.exists(out):
        os.remove(out)
    full = ["apply", *args] if "--out" in args else ["apply", *args, "--out", out]
    r = run(*full, timeout=120)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    c.check(r.returncode > 0, f"{what}: exit status {r.returncode} (want > 0; < 0 is a signal)")
    c.check(len(lines) == 1, f"{what}: stderr has {len(lines)} lines: {r.stderr!r}")
    msg = lines[0] if lines else ""
    for w in words:
        c.check(w in msg, f"{what}: message lacks {w!r}: {msg!r}")
    c.check(not os.path.exists(out), f"{what}: left an output file behind")
    c.check(not os.path.exists(out + ".partial"), f"{what}: left a partial file behind")

# compare: the same refusals.
r = run("compare", "--method", "exact", "--q", good_q, "--k", good_k, "--v", path("v90.npy"))
c.check(r.returncode > 0 and "n_k = 80" in r.stderr, f"compare with mismatched V: {r.returncode} {r.stderr!r}")
r = run("compare", "--method", "nope", "--n", 64)
c.check(r.returncode > 0 and "no method 'nope'" in r.stderr, f"compare with unknown method: {r.stderr!r}")
r = run("compare", "--method", "Nystrom", "--n", 64)
c.check(r.returncode > 0 and "no method 'Nystrom'; did you mean nystrom?" in r.stderr, f"compare Nystrom: {r.stderr!r}")
r = run("compare", "--method", "linformer:k=1000", "--n", 256, "--d", 8)
c.check(r.returncode > 0 and "k = 1000 exceeds the sequence (n_k = 256)" in r.stderr and not r.stdout,
        f"compare refuses Linformer's k > n before any work (no table printed): {r.stderr!r} {r.stdout!r}")

# Mixed dtypes: refused naming each file's dtype, unless a compute dtype is chosen — then every file is cast to it
# (the Python module's rule too).
k64 = path("k64.npy")
r = run("compare", "--method", "exact", "--q", good_q, "--k", k64, "--v", good_v)
c.check(r.returncode > 0 and "q.npy is float32" in r.stderr and "k64.npy is float64" in r.stderr,
        f"compare refuses mixed dtypes: {r.stderr!r}")
for dt in ("f32", "f64"):
    out = path(f"mixed_{dt}.npy")
    r = run("apply", "--q", good_q, "--k", k64, "--v", good_v, "--dtype", dt, "--out", out)
    want = np.float32 if dt == "f32" else np.float64
    c.check(r.returncode == 0 and np.load(out).dtype == want, f"apply --dtype {dt} casts mixed files: {r.stderr!r}")
    r = run("compare", "--method", "exact", "--q", good_q, "--k", k64, "--v", good_v, "--dtype", dt)
    c.check(r.returncode == 0 and "exact" in r.stdout, f"compare --dtype {dt} casts mixed files: {r.stderr!r}")

# Memory, checked before any work from the sizes alone: P of exact:impl=materialized at n = 2^20 (8 TiB, more than
# any machine has), the inputs of a problem too large to generate (under a limit, to hold on any machine), and the
# message says what and how much.
r = run("compare", "--method", "exact:impl=materialized", "--n", 1 << 20, "--d", 8)
c.check(r.returncode > 0 and "exact:impl=materialized" in r.stderr and "n_q = 1048576, n_k = 1048576" in r.stderr
        and "needs 8.0 TiB" in r.stderr and "available" in r.stderr and not r.stdout,
        f"materialized exact refused before any work: {r.returncode} {r.stderr!r}")
r = run("--max-memory", "4G", "compare", "--method", "exact", "--n", 1 << 20, "--d", 4096)
c.check(r.returncode > 0 and "Q 1048576×4096, K 1048576×4096, V 1048576×4096 float64" in r.stderr and
        "needs 96.0 GiB" in r.stderr and "--max-memory" in r.stderr, f"inputs refused before generating: {r.stderr!r}")
meminfo = dict(l.split(":", 1) for l in open("/proc/meminfo"))
if int(meminfo["MemAvailable"].split()[0]) * 1024 < 90 << 30:   # the user's command, where it cannot fit
    r = run("compare", "--n", 1 << 20, "--d", 4096, "--method", "exact")
    c.check(r.returncode > 0 and "1048576×4096" in r.stderr and "needs 96.0 GiB" in r.stderr and
            "out of memory" not in r.stderr, f"--n 1048576 --d 4096 refused with sizes: {r.stderr!r}")
r = run("compare", "--method", "svd:rank=8,solver=dense", "--n", 1 << 20, "--d", 8)
c.check(r.returncode > 0 and "svd:rank=8" in r.stderr and "needs" in r.stderr, f"dense svd refused: {r.stderr!r}")
# An allocation that fails anyway (here under an address-space limit the estimates do not know of) ends in one
# line naming what was being computed, in sizes and bytes.
import resource
import subprocess
from harness import BIN
limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
# Under AddressSanitizer (tools/test.sh --sanitize) the limit leaves no room for its shadow memory: the process
# cannot start, which says nothing of attnlab's message. The case runs in the normal suite.
sanitized = "libasan" in subprocess.run(["ldd", BIN], capture_output=True, text=True).stdout
if sanitized:
    print("skipped under AddressSanitizer: 'out of memory names the sizes' (an address-space limit)")
else:
    r = subprocess.run([BIN, "compare", "--method", "exact", "--n", "16384", "--d", "4096"], capture_output=True,
                       text=True, timeout=300, preexec_fn=limit)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    c.check(r.returncode > 0 and len(lines) == 1 and
            "Q 16384×4096, K 16384×4096, V 16384×4096 float64 (1.5 GiB)" in r.stderr and
            ("out of memory while running compare" in r.stderr or "needs" in r.stderr),
            f"out of memory names the sizes: {r.returncode} {r.stderr!r}")
r = run("compare", "--n", 64)
c.check(r.returncode > 0 and "--method" in r.stderr, f"compare without methods: {r.stderr!r}")

# The streaming path forms nothing quadratic: n = 4096 (a 64 MiB float32 matrix) runs under --max-memory 16M,
# and agrees with the materialized path where that is allowed.
n = 4096
q = save("bq.npy", rng.standard_normal((n, 32)).astype(np.float32))
k = save("bk.npy", rng.standard_normal((n, 32)).astype(np.float32))
v = save("bv.npy", rng.standard_normal((n, 16)).astype(np.float32))
r = run("--max-memory", "16M", "apply", "--q", q, "--k", k, "--v", v, "--out", path("bo.npy"), "--causal")
c.check(r.returncode == 0, f"streaming under --max-memory 16M: {r.returncode} {r.stderr!r}")
r2 = run("apply", "--method", "exact:impl=materialized", "--max-memory", "16M", "--q", q, "--k", k, "--v", v,
         "--out", path("bo2.npy"), "--causal")
c.check(r2.returncode > 0 and "needs 64.0 MiB" in r2.stderr, f"materialized under 16M refused: {r2.stderr!r}")

# `attnlab methods` lists every method with its parameters; `--names` one per line; `methods NAME...` those named.
r = run("methods")
c.check(r.returncode == 0 and "exact" in r.stdout and "tile=256" in r.stdout, f"methods: {r.stdout!r}")
# Seeds as integers; references a user can find (the papers, never the project's seed documents).
c.check("integer in [0, 9223372036854775807]" in r.stdout and "e+18" not in r.stdout, "seed ranges print as integers")
c.check("seed 00" not in r.stdout and "Xiong et al. 2021" in r.stdout, "methods cites the papers")
r = run("methods", "--names")
c.check(r.returncode == 0 and "exact" in r.stdout.split(), f"methods --names: {r.stdout!r}")
r = run("methods", "nystrom", "linformer")
heads = [l.split()[0] for l in r.stdout.splitlines() if l and not l.startswith(" ")]
c.check(r.returncode == 0 and heads == ["nystrom", "linformer"] and "landmarks=64" in r.stdout and "k=64" in r.stdout,
        f"methods nystrom linformer: {r.stdout!r}")
r = run("methods", "nystrom", "Performer")
c.check(r.returncode > 0 and "no method 'Performer'; did you mean performer?" in r.stderr and not r.stdout,
        f"methods with a misspelt name: {r.stderr!r}")
r = run("--help")
c.check(r.stdout.splitlines()[1:2] == ["Usage: attnlab [OPTIONS] SUBCOMMAND"] or "Usage: attnlab " in r.stdout,
        f"usage names the program: {r.stdout[:200]!r}")
r = run("compare", "--help")
c.check("Usage: attnlab compare" in r.stdout and "--repeats" in r.stdout and "--warmup" in r.stdout,
        f"compare --help: {r.stdout[:300]!r}")

# compare writes a tidy CSV with the documented columns and finite values.
r = run("compare", "--all", "--n", 128, "--d", 16, "--seed", 3, "--csv", path("c.csv"))
c.check(r.returncode == 0, f"compare --all: {r.returncode} {r.stderr!r}")
if r.returncode == 0:
    rows = list(csv.DictReader(open(path("c.csv"))))
    c.check(rows and list(rows[0])[:2] == ["schema_version", "code_version"] and
            list(rows[0])[-2:] == ["metric", "value"],
            "compare CSV columns")
    # No NaN anywhere; +inf only for KL(P‖P̃), which is infinite where a sparse P̃ misses mass that P has.
    c.check(all(np.isfinite(float(x["value"])) or (x["metric"] == "P_mean_kl" and float(x["value"]) == np.inf)
                for x in rows), "compare CSV values finite (but KL)")
    c.check(any(x["method"] == "local" and x["metric"] == "P_mean_kl" and x["value"] == "inf" for x in rows),
            "local attention's KL(P‖P̃) is +inf")
    c.check({"out_rel_fro", "P_rel_fro", "P_rel_spectral", "P_mean_kl", "P_mean_tv"} <= {x["metric"] for x in rows},
            "compare CSV metrics")
    names = run("methods", "--names").stdout.split()
    c.check(len(names) >= 9 and set(names) == {x["method"] for x in rows},
            f"compare --all ran every registered method: {sorted(set(names) ^ {x['method'] for x in rows})}")
    # Non-causal methods are skipped (with a note) under --causal; the causal ones run.
    r = run("compare", "--all", "--causal", "--n", 96, "--d", 16, "--csv", path("cc.csv"))
    causal_rows = list(csv.DictReader(open(path("cc.csv")))) if r.returncode == 0 else []
    # The registry says which methods refuse a mask (`attnlab methods`: "causal: refused: why").
    listing, current, non_causal = run("methods").stdout.splitlines(), None, set()
    for line in listing:
        if line and not line.startswith(" "):
            current = line.split()[0]
        elif line.strip().startswith("causal: refused"):
            non_causal.add(current)
    c.check({"nystrom", "linformer"} <= non_causal and "exact" not in non_causal,
            f"methods lists the non-causal ones: {sorted(non_causal)}")
    c.check(r.returncode == 0 and all(f"skipping {m}:" in r.stderr for m in non_causal) and
            {x["method"] for x in causal_rows} == set(names) - non_causal,
            f"compare --all --causal: {r.returncode} {r.stderr!r}")

# compare on (h, n, d) files: a head column; the spec as a user writes it (the canonical one stays in the CSV); the
# cost harness's times: --repeats timed calls after --warmup ones, the fastest (time_s), the median, exact's, and the
# speed-up exact/method.
hq, hk, hv = (save(f"h{x}.npy", rng.standard_normal((3, 96, 16)).astype(np.float32)) for x in "qkv")
r = run("compare", "--q", hq, "--k", hk, "--v", hv, "--method", "nystrom:landmarks=16", "--method", "local",
        "--repeats", 3, "--warmup", 2, "--csv", path("heads.csv"))
table = [l.split() for l in r.stdout.splitlines() if l.strip() and not l.startswith(("wrote", "time_ms, speedup:"))]
device = [l for l in r.stdout.splitlines() if l.startswith("time_ms, speedup:")]
c.check(len(device) == 1 and "this machine's CPU (" in device[0] and "threads=" in device[0],
        f"compare states the device its times and speed-ups hold for, under its table: {device}")
c.check(r.returncode == 0 and table[0][:2] == ["head", "method"] and "speedup" in table[0] and
        [(row[0], row[1]) for row in table[1:]] == [(h, m) for h in "012" for m in ("nystrom:landmarks=16", "local")],
        f"compare on 3 heads: a head column and short specs: {r.stdout!r} {r.stderr!r}")
if r.returncode == 0:
    import csv
    rows = list(csv.DictReader(open(path("heads.csv"))))
    c.check({x["spec"] for x in rows if x["method"] == "nystrom"} ==
            {"nystrom:landmarks=16,pinv=iterative,iters=6,select=segments,seed=0"}, "the CSV keeps the canonical spec")
    for h in "012":
        m = {x["metric"]: float(x["value"]) for x in rows if x["head"] == h and x["method"] == "local"}
        c.check({"time_s", "time_median_s", "exact_time_s", "speedup"} <= set(m) and
                0 < m["time_s"] <= m["time_median_s"] and abs(m["speedup"] - m["exact_time_s"] / m["time_s"]) <=
                1e-12 * m["speedup"], f"head {h}: times and speed-up = exact/method: {m}")
r = run("compare", "--q", good_q, "--k", good_k, "--v", good_v, "--method", "local:window=8")
c.check(r.returncode == 0 and r.stdout.split()[0] == "method", f"one head: no head column: {r.stdout!r}")
r = run("compare", "--n", 64, "--method", "exact", "--repeats", 0)
c.check(r.returncode > 0 and "--repeats" in r.stderr, f"--repeats 0 refused: {r.stderr!r}")

# One schema for every results file: compare's CSV has the experiments' columns, and plot.py reads it.
if os.path.exists(path("cc.csv")):
    header = open(path("cc.csv")).readline().strip().split(",")
    c.check(header == ["schema_version", "code_version", "experiment", "point", "source", "method", "spec", "n", "d",
                       "seed", "sequence", "layer", "head", "dtype", "variant", "step", "metric", "value"],
            f"compare CSV schema: {header}")
    try:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
        import plot
        df = plot.load(os.path.dirname(path("cc.csv")), "cc")
        c.check(set(df["dtype"]) == {"float64"} and set(df["variant"]) == {"causal"} and set(df["head"]) == {0} and
                df["step"].isna().all() and df["layer"].isna().all() and (df.n == 96).all(),
                "plot.load reads compare's CSV (dtype float64, variant causal, head 0, no step)")
    except ImportError as e:  # pandas or matplotlib missing: the test stack installs them
        c.check(False, f"plot.py could not be imported: {e}")

# Emulated reduced precision (`apply --precision bf16|fp16 --policy eager|careful`): linear attention in float16,
# eager, at n = 1024, d = 64 returns rows of zeros (the normaliser overflows: x/inf = 0): written, said on stderr,
# and an error with --fail-on-nonfinite; careful keeps the normalisers in float32 and is finite.
pq = save("pq.npy", rng.standard_normal((1024, 64)))
pk = save("pk.npy", rng.standard_normal((1024, 64)))
pv = save("pv.npy", rng.standard_normal((1024, 64)))
r = run("apply", "--method", "linear", "--q", pq, "--k", pk, "--v", pv, "--out", path("po.npy"), "--precision", "fp16")
po = np.load(path("po.npy")) if os.path.exists(path("po.npy")) else None
c.check(r.returncode == 0 and "all zero" in r.stderr and "normalisers" in r.stderr and po is not None and
        po.dtype == np.float32 and (np.abs(po).max(-1) == 0).mean() > 0.9,
        f"apply --precision fp16 (eager): zero rows written and said: {r.returncode} {r.stderr!r}")
r = run("apply", "--method", "linear", "--q", pq, "--k", pk, "--v", pv, "--out", path("po2.npy"), "--precision", "fp16",
        "--fail-on-nonfinite")
c.check(r.returncode != 0 and "--fail-on-nonfinite" in r.stderr and os.path.exists(path("po2.npy")),
        f"--fail-on-nonfinite: non-zero exit, the output still written: {r.returncode} {r.stderr!r}")
r = run("apply", "--method", "linear", "--q", pq, "--k", pk, "--v", pv, "--out", path("po3.npy"), "--precision", "fp16",
        "--policy", "careful", "--fail-on-nonfinite")
po3 = np.load(path("po3.npy")) if os.path.exists(path("po3.npy")) else None
c.check(r.returncode == 0 and po3 is not None and np.isfinite(po3).all() and (np.abs(po3).max(-1) > 0).all() and
        np.array_equal(po3.astype(np.float16).astype(np.float32), po3),
        f"apply --precision fp16 --policy careful: finite, values of the format: {r.returncode} {r.stderr!r}")
# A V of zeros gives rows of zeros by right: not counted, said, and no failure under --fail-on-nonfinite; a V that
# float16 flushes to zero (1e-10) is the silent failure, counted.
zv = save("zv.npy", np.zeros((64, 16), np.float32))
tv = save("tv.npy", np.full((64, 16), 1e-10, np.float32))
zq = save("zq.npy", rng.standard_normal((64, 16)).astype(np.float32))
zk = save("zk.npy", rng.standard_normal((64, 16)).astype(np.float32))
fp16_fail = ("--precision", "fp16", "--fail-on-nonfinite")
r = run("apply", "--q", zq, "--k", zk, "--v", zv, "--out", path("zo.npy"), *fp16_fail)
c.check(r.returncode == 0 and "0 of 64 output rows all zero (not counting the 1 head(s) whose V is all zero)"
        in r.stderr, f"apply --precision fp16, V all zero: not a failure, said: {r.returncode} {r.stderr!r}")
r = run("apply", "--q", zq, "--k", zk, "--v", tv, "--out", path("zo2.npy"), *fp16_fail)
c.check(r.returncode != 0 and "64 all-zero rows" in r.stderr,
        f"apply --precision fp16, V flushed to zero: the failure: {r.returncode} {r.stderr!r}")
for args, want in ((["--method", "performer:features=16,kernel=trig", "--precision", "bf16"], "positive"),
                   (["--precision", "bf16", "--dtype", "f64"], "contradicts"),
                   (["--precision", "fp8"], "--precision")):
    r = run("apply", "--q", good_q, "--k", good_k, "--v", good_v, "--out", path("px.npy"), *args)
    c.check(r.returncode != 0 and want in r.stderr and not os.path.exists(path("px.npy")),
            f"apply {' '.join(args)}: refused before any work ({want!r}): {r.returncode} {r.stderr!r}")

# `compare --precision`: the same failure as a row (zero rows counted, no error value), the CSV's dtype the format and
# its variant the policy, no times; --fail-on-nonfinite fails the command after the rows are written.
r = run("compare", "--q", pq, "--k", pk, "--v", pv, "--method", "linear", "--method", "exact", "--precision", "fp16",
        "--csv", path("pc.csv"))
rows = list(csv.DictReader(open(path("pc.csv")))) if os.path.exists(path("pc.csv")) else []
lin = {x["metric"]: float(x["value"]) for x in rows if x["method"] == "linear"}
ex = {x["metric"]: float(x["value"]) for x in rows if x["method"] == "exact"}
c.check(r.returncode == 0 and "1 of 2 rows" in r.stderr and "(linear)" in r.stderr and rows and
        {x["dtype"] for x in rows} == {"fp16"} and {x["variant"] for x in rows} == {"eager"} and
        lin.get("output_zero_rows", 0) > 900 and lin.get("overflow[normalisers φ(q)ᵀΣφ(k)]", 0) > 900 and
        ex.get("output_zero_rows") == 0 and 0 < ex.get("round_rel_fro", 0) < 1e-2 and
        not any(x["metric"].startswith("time") for x in rows),
        f"compare --precision fp16: the failure a row with its counts: {r.returncode} {r.stderr!r} {lin} {ex}")
r = run("compare", "--q", pq, "--k", pk, "--v", pv, "--method", "linear", "--precision", "fp16", "--fail-on-nonfinite")
c.check(r.returncode != 0 and "--fail-on-nonfinite" in r.stderr and "linear" in r.stdout,
        f"compare --fail-on-nonfinite: rows printed, non-zero exit: {r.returncode} {r.stderr!r}")
r = run("compare", "--q", pq, "--k", pk, "--v", pv, "--method", "linear", "--precision", "fp16", "--policy", "careful",
        "--fail-on-nonfinite")
c.check(r.returncode == 0 and "0 of 1 rows" in r.stderr, f"compare careful: no failure: {r.returncode} {r.stderr!r}")
for methods in (["performer:kernel=trig"], ["exact", "performer:kernel=trig"]):   # refused by a parameter's value
    r = run("compare", "--n", 64, *[x for m in methods for x in ("--method", m)], "--precision", "bf16")
    c.check(r.returncode != 0 and "kernel=positive" in r.stderr and "method" not in r.stdout,
            f"compare {methods}: a storage the method lacks refused before any work: {r.returncode} {r.stderr!r}")

# float16 files ('<f2') are read and computed in emulated float16 storage unless --precision says otherwise.
h16 = [save(f"h{x}.npy", a.astype(np.float16)) for x, a in (("q", rng.standard_normal((128, 16))),
                                                             ("k", rng.standard_normal((128, 16))),
                                                             ("v", rng.standard_normal((128, 16))))]
r = run("compare", "--method", "exact", "--q", h16[0], "--k", h16[1], "--v", h16[2])
c.check(r.returncode == 0 and "round_relF" in r.stdout and "fp16 storage" in r.stderr,
        f"compare on float16 files: emulated fp16 as apply: {r.returncode} {r.stdout!r} {r.stderr!r}")
r = run("compare", "--method", "exact", "--q", h16[0], "--k", h16[1], "--v", h16[2], "--precision", "fp32")
c.check(r.returncode == 0 and "P_relF" in r.stdout, f"compare --precision fp32 on float16 files: native: {r.stdout!r}")
r = run("apply", "--method", "exact", "--q", h16[0], "--k", h16[1], "--v", h16[2], "--out", path("ho.npy"))
ho = np.load(path("ho.npy")) if os.path.exists(path("ho.npy")) else None
want = (lambda q, k, v: (lambda p: (p / p.sum(1, keepdims=True)) @ v)(np.exp(q @ k.T / 4 - (q @ k.T / 4).max(1,
        keepdims=True))))(*(np.load(f).astype(np.float64) for f in h16))
c.check(r.returncode == 0 and "fp16 storage" in r.stderr and ho is not None and
        np.array_equal(ho.astype(np.float16).astype(np.float32), ho) and
        np.abs(ho - want).max() < 4 * 2.0 ** -11 * np.abs(want).max(),
        f"apply on float16 files: emulated fp16, values of the format, near float64: {r.returncode} {r.stderr!r}")

# Options that act under bf16/fp16 only are refused where nothing is rounded (never silently without effect), and
# --matrix under an emulated storage (the emulation rounds the output, not P̃): before any output is written.
for args, want in ((["--precision", "fp32", "--policy", "careful"], "--policy careful"),
                   (["--policy", "careful"], "--policy careful"),
                   (["--fail-on-nonfinite"], "--fail-on-nonfinite"),
                   (["--precision", "bf16", "--matrix", path("pm.npy")], "--matrix")):
    for cmd in (["apply", "--out", path("py.npy")], ["compare"]):
        if cmd[0] == "compare" and "--matrix" in args:
            continue
        r = run(*cmd, "--method", "exact", "--q", good_q, "--k", good_k, "--v", good_v, *args)
        c.check(r.returncode != 0 and want in r.stderr and "Traceback" not in r.stderr and
                not os.path.exists(path("py.npy")) and not os.path.exists(path("pm.npy")),
                f"{cmd[0]} {' '.join(args)}: refused ({want!r}): {r.returncode} {r.stderr!r}")
r = run("apply", "--method", "exact", "--q", h16[0], "--k", h16[1], "--v", h16[2], "--out", path("py.npy"),
        "--matrix", path("pm.npy"))
c.check(r.returncode != 0 and "--matrix" in r.stderr and "--precision fp32" in r.stderr,
        f"apply --matrix on float16 files (emulated fp16): refused, naming --precision fp32: {r.stderr!r}")

# A float64 file computed in float32 with a value beyond float32's range: named, not reported later as an Inf the
# file does not hold (nor as nothing overflowing under bf16).
big = rng.standard_normal((64, 16)); big[3, 2] = 1e39
big_q = save("bigq.npy", big)
for args in (["--dtype", "f32"], ["--precision", "bf16"]):
    r = run("apply", "--method", "exact", "--q", big_q, "--k", save("k64.npy", rng.standard_normal((64, 16))),
            "--v", save("v64.npy", rng.standard_normal((64, 16))), "--out", path("pb.npy"), *args)
    c.check(r.returncode != 0 and "bigq.npy" in r.stderr and "row 3, column 2" in r.stderr and
            "float32's range" in r.stderr and "--dtype f64" in r.stderr and not os.path.exists(path("pb.npy")),
            f"apply {' '.join(args)} on a float64 value beyond float32: named: {r.stderr!r}")

# Inputs that overflow the format (a query entry beyond fp16's 65504) make features, logits and landmark kernels
# non-finite: under bf16/fp16 that is the finding (written, counted, said), not an error, for every method, causal
# where it can be, as on the GPU; natively the same inputs are finite.
hq = rng.standard_normal((256, 16)).astype(np.float32); hq[3, 2] = 1e5
hq_path, hk_path, hv_path = (save(f"h{x}256.npy", a) for x, a in
                             (("q", hq), ("k", rng.standard_normal((256, 16)).astype(np.float32)),
                              ("v", rng.standard_normal((256, 16)).astype(np.float32))))
names = run("methods", "--names").stdout.split()
c.check(len(names) >= 15, f"methods --names: {names}")
for method, policy, causal in ((m, p, x) for m in names for p in ("eager", "careful") for x in ([], ["--causal"])):
    args = ["apply", "--method", method, "--q", hq_path, "--k", hk_path, "--v", hv_path, "--out", path("ph.npy"),
            "--precision", "fp16", "--policy", policy, *causal]
    r = run(*args, timeout=60)
    if r.returncode != 0 and ("causal" in r.stderr or "emulat" in r.stderr or "policy careful" in r.stderr):
        continue   # a mask or a policy the method does not offer: refused before any work (tested elsewhere)
    ph = np.load(path("ph.npy")) if r.returncode == 0 else None
    c.check(r.returncode == 0 and "inputs Q, K" in r.stderr and ph is not None and ph.shape == (256, 16),
            f"apply {method} fp16 {policy} {causal}: an overflowed input reported, not an error: {r.returncode} "
            f"{r.stderr!r}")
    if method in ("exact", "linear", "performer", "nystrom"):
        c.check(ph is not None and not np.isfinite(ph[3]).all() and "non-finite output entries" in r.stderr,
                f"apply {method} fp16 {policy} {causal}: the overflowed query's row is non-finite, and said")
    if os.path.exists(path("ph.npy")):
        os.remove(path("ph.npy"))

# `run precision`: options that would run nothing, fail mid-run or write rows under a wrong label are refused before
# any point.
for args, want in ((["--formats", "fp64"], "--formats"), (["--formats", "bf16,bf16"], "twice"),
                   (["--methods", "linear;linear"], "twice"), (["--seeds", "0"], "--seeds"),
                   (["--temperatures", "nan"], "--temperatures"), (["--temperatures", "-1"], "--temperatures"),
                   (["--n", "0"], "--n")):
    r = run("run", "precision", "--sources", "gaussian", "--n", "64", "--methods", "linear", "--formats", "bf16",
            "--temperatures", "1", *args, "--out", path("prec.csv"))
    c.check(r.returncode != 0 and want in r.stderr and not os.path.exists(path("prec.csv")),
            f"run precision {' '.join(args)}: refused ({want!r}): {r.returncode} {r.stderr!r}")
# A finished run's file resumed with other settings (here the methods, which no point id names) is refused, naming
# the difference; resumed with its own, nothing is recomputed.
base = ["run", "precision", "--sources", "gaussian", "--formats", "bf16", "--temperatures", "1",
        "--out", path("prec.csv")]
r = run(*base, "--n", "64", "--methods", "linear")
c.check(r.returncode == 0 and "1 points computed" in r.stderr, f"run precision: {r.stderr!r}")
r = run(*base, "--n", "64", "--methods", "linear;exact")
c.check(r.returncode != 0 and "methods: linear → linear;exact" in r.stderr and "--config" in r.stderr and
        "--out" in r.stderr, f"resume with other settings: refused, naming them: {r.stderr!r}")
r = run(*base, "--n", "64", "--methods", "linear")
c.check(r.returncode == 0 and "1 already done" in r.stderr, f"resume with the same settings: {r.stderr!r}")
# More of a coordinate the point ids name (here the lengths) only adds points: resumed, the finished one kept. A
# setting the old sidecar lacks (an older version's) is not a difference.
r = run(*base, "--n", "64,96", "--methods", "linear")
c.check(r.returncode == 0 and "1 points computed, 1 already done" in r.stderr, f"a grown grid resumes: {r.stderr!r}")
with open(path("prec.csv") + ".config") as f:
    sidecar = [x for x in f if not x.startswith("long-sources")]
with open(path("prec.csv") + ".config", "w") as f:
    f.writelines(sidecar)
r = run(*base, "--n", "64,96", "--methods", "linear")
c.check(r.returncode == 0 and "2 already done" in r.stderr, f"an older sidecar without a key resumes: {r.stderr!r}")
r = run(*base, "--n", "96", "--methods", "linear")
c.check(r.returncode != 0 and "n: 64,96 → 96" in r.stderr, f"fewer lengths are another grid: refused: {r.stderr!r}")
# A count the point ids name (--seeds) grows the grid when it rises; a sidecar whose count is not a number (edited
# by hand) is a difference named in the refusal, not a parse exception.
seeds = ["run", "error_vs_budget", "--n", "64", "--d", "8", "--sources", "gaussian", "--families", "local",
         "--spectral-limit", "0", "--repeats", "0", "--out", path("seeds.csv")]
r = run(*seeds, "--seeds", "1")
c.check(r.returncode == 0 and "points computed" in r.stderr, f"error_vs_budget --seeds 1: {r.stderr!r}")
r = run(*seeds, "--seeds", "2")
c.check(r.returncode == 0 and "1 already done" in r.stderr, f"more seeds resume: {r.stderr!r}")
with open(path("seeds.csv") + ".config") as f:
    sidecar = ["seeds = two\n" if x.startswith("seeds = ") else x for x in f]
with open(path("seeds.csv") + ".config", "w") as f:
    f.writelines(sidecar)
r = run(*seeds, "--seeds", "2")
c.check(r.returncode != 0 and "seeds: two → 2" in r.stderr and "stoll" not in r.stderr,
        f"a non-numeric count in the sidecar: refused, naming it: {r.stderr!r}")

# Sliding bands that hold no key (queries more than the keys plus the window, no mask): refused before any work by
# local and Scatterbrain, which corrupted memory there (double free, a hang, or NaN rows under bf16); at the edge,
# n_q = n_k + W, every band holds a key and the output is finite.
wide_q = save("q200.npy", rng.standard_normal((200, 16)).astype(np.float32))
edge_q = save("q144.npy", rng.standard_normal((144, 16)).astype(np.float32))
band_k = save("k128.npy", rng.standard_normal((128, 16)).astype(np.float32))
band_v = save("v128.npy", rng.standard_normal((128, 8)).astype(np.float32))
for method in ("local:window=16", "scatterbrain:window=16"):
    for extra in ([], ["--precision", "bf16"]):
        for cmd in (["apply", "--out", path("band.npy")], ["compare"]):
            r = run(*cmd, "--method", method, "--q", wide_q, "--k", band_k, "--v", band_v, *extra)
            c.check(r.returncode in (1, 2) and "leave 56 query bands without a key" in r.stderr,
                    f"{method} {cmd[0]} {extra}: empty bands refused: {r.returncode} {r.stderr[-300:]!r}")
    r = run("apply", "--method", method, "--q", edge_q, "--k", band_k, "--v", band_v, "--out", path("edge.npy"))
    c.check(r.returncode == 0 and np.isfinite(np.load(path("edge.npy"))).all(),
            f"{method}: n_q = n_k + W runs: {r.returncode} {r.stderr[-300:]!r}")
# Files whose stored dtypes differ, float16 beside float32 included (Q's alone would pick the emulation), are refused
# naming the dtypes as stored.
q_f2 = save("q_f2.npy", rng.standard_normal((64, 16)).astype(np.float16))
for args, want in ((["--q", good_q, "--k", save("k_f2.npy", np.load(good_k).astype(np.float16))], "is float16"),
                   (["--q", q_f2, "--k", good_k], "Q " + q_f2 + " is float16, K " + good_k + " is float32")):
    r = run("apply", "--method", "exact", *args, "--v", good_v, "--out", path("mixed.npy"))
    c.check(r.returncode != 0 and want in r.stderr and "differ in dtype" in r.stderr,
            f"mixed float16/float32 files refused: {r.stderr!r}")
# report on float16 files: the recommendation for fp16 storage, as apply and compare compute them, and said.
f2 = [save(f"{x}_half.npy", rng.standard_normal((96, 16)).astype(np.float16)) for x in "qkv"]
r = run("report", "--q", f2[0], "--k", f2[1], "--v", f2[2], "--out", path("rep_half"), "--families", "local",
        "--repeats", "1")
c.check(r.returncode == 0 and "float16 files: the recommendation is for fp16 storage" in r.stdout and
        "fp16" in open(os.path.join(path("rep_half"), "summary.md")).read(), f"report on float16 files: {r.stderr!r}")
r = run("report", "--q", f2[0], "--k", f2[1], "--v", f2[2], "--out", path("rep_half_c"), "--families", "local",
        "--repeats", "1", "--policy", "careful")
c.check(r.returncode == 0 and "fp16 storage (careful policy" in r.stdout and
        "careful" in open(os.path.join(path("rep_half_c"), "summary.md")).read(),
        f"report on float16 files takes a policy, as apply does: {r.returncode} {r.stderr!r}")
r = run("report", "--q", good_q, "--k", good_k, "--v", good_v, "--out", path("rep_pol"), "--policy", "careful")
c.check(r.returncode != 0 and "--policy needs --precision bf16 or fp16" in r.stderr,
        f"report --policy on float32 files without --precision: refused: {r.stderr!r}")
# A NaN is said with the first intermediate it was stored in (where 0/0 or inf − inf arose).
nan_in = save("q_big.npy", (rng.standard_normal((256, 16)) * 3e4).astype(np.float32))
r = run("apply", "--method", "exact:impl=materialized", "--q", nan_in, "--k", nan_in, "--v",
        save("v256.npy", rng.standard_normal((256, 8)).astype(np.float32)), "--precision", "fp16",
        "--out", path("nan.npy"))
c.check(r.returncode == 0 and "NaN first stored in: " in r.stderr, f"the first NaN is named: {r.stderr!r}")
# Experiment options that would exhaust memory or fail mid-run: refused before any point.
prec = ["run", "precision", "--sources", "gaussian", "--formats", "bf16", "--temperatures", "1", "--n", "64"]
for args, want in ((["--methods", "linear", "--seeds", "20000"], "--seeds: 20000 is more than 10000"),
                   (["--methods", "linear", "--d", "100000"], "--d: 100000 is more than 4096"),
                   (["--methods", "linear", "--long-sources", "foo"], "--long-sources 'foo'"),
                   (["--methods", "exact;linformer:k=256"], "k = 256 exceeds the sequence"),
                   (["--methods", "linear", "--shard", "0/-1"], "--shard '0/-1'")):
    r = run(*prec, *args, "--out", path("early.csv"))
    c.check(r.returncode != 0 and want in r.stderr and not os.path.exists(path("early.csv")),
            f"run precision {' '.join(args)}: refused before any point: {r.returncode} {r.stderr!r}")

# README's methods table is the registry's (attnlab methods --markdown): a new method, parameter or default shows.
table = run("methods", "--markdown").stdout
readme = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md"),
              encoding="utf-8").read()
c.check(table.count("\n") >= 17 and table in readme,
        "README.md's methods table differs from `attnlab methods --markdown`: paste its output into "
        "docs/README.template.md and run tools/findings.py")

c.finish()
