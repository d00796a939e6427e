"""Experiments (`attnlab run NAME`): tiny grids write tidy CSVs with the documented columns and invariants; a sweep
killed midway and re-run completes without recomputing finished points; shards partition the grid; a dumped
configuration replays the same grid."""
import csv
import gzip
import io
import os
import signal
import subprocess
import sys
import time
import zlib

import numpy as np

from harness import BIN, Checks, path, run

c = Checks()
COLUMNS = ["schema_version", "code_version", "experiment", "point", "source", "method", "spec", "n", "d", "seed",
           "sequence", "layer", "head", "dtype", "variant", "step", "metric", "value"]


def read_text(f):
    """A plain or gzip file's text; a gzip stream cut short (a writer still running or killed) is read up to its
    last flush, as attnlab's resume reads it."""
    data = open(f, "rb").read()
    if not f.endswith(".gz"):
        return data.decode()
    out = b""
    while data:
        d = zlib.decompressobj(wbits=47)   # one gzip member
        out += d.decompress(data)
        data = d.unused_data if d.eof else b""
    return out.decode()


def gzip_members(f):
    data, n = open(f, "rb").read(), 0
    while data:
        d = zlib.decompressobj(wbits=47)
        d.decompress(data)
        n += 1
        data = d.unused_data if d.eof else b""
    return n


def rows_of(f):
    text = read_text(f)
    if text and not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]   # a torn last line
    return list(csv.DictReader(io.StringIO(text)))


def points_done(rows):
    return {r["point"] for r in rows if r["metric"] == "point_done"}


# pinv: residual histories, condition numbers, convergence orders.
r = run("run", "pinv", "--n", 256, "--m", "16,32", "--sources", "gaussian,clustered", "--iters", 30,
        "--out", path("pinv.csv"))
c.check(r.returncode == 0, f"pinv: {r.returncode} {r.stderr!r}")
rows = rows_of(path("pinv.csv"))
c.check(list(rows[0]) == COLUMNS, f"pinv columns {list(rows[0])}")
c.check(len(points_done(rows)) == 4, "pinv: 4 points")
c.check(all(r["schema_version"] == "2" for r in rows), "schema version 2")
c.check(all(r["sequence"] == r["layer"] == r["head"] == r["dtype"] == "" for r in rows),
        "generated sources: no sequence, layer, head or dtype")
res = [r for r in rows if r["metric"] == "residual"]
c.check(res and all(float(r["value"]) >= 0 for r in res), "residuals non-negative")
c.check(all(float(r["value"]) >= 1 for r in rows if r["metric"] == "cond"), "condition numbers ≥ 1")
for variant, lo, hi in (("order3", 2.5, 3.5), ("newton", 1.7, 2.3)):
    orders = [float(r["value"]) for r in rows if r["metric"] == "order" and r["variant"] == variant]
    c.check(orders and all(lo <= o <= hi for o in orders), f"pinv {variant} orders {orders}")
# The residual history starts at k = 0 and ends at k = iters for each variant of each point.
for p in points_done(rows):
    steps = sorted(int(r["step"]) for r in res if r["point"] == p and r["variant"] == "order3")
    c.check(steps == list(range(31)), f"pinv {p}: order-3 steps {steps[:3]}…{steps[-3:]}")

# error_vs_budget: every metric, and the Eckart–Young floor holds inside the CSV.
r = run("run", "error_vs_budget", "--n", 96, "--d", 16, "--sources", "gaussian,clustered",
        "--families", "svd,nystrom,cur,linformer_pool,performer,local", "--out", path("evb.csv"))
c.check(r.returncode == 0, f"error_vs_budget: {r.returncode} {r.stderr!r}")
rows = rows_of(path("evb.csv"))
c.check(len(points_done(rows)) == 12, f"error_vs_budget: {len(points_done(rows))} points")
metrics = {r["metric"] for r in rows}
c.check({"out_rel_fro", "out_mean_cosine", "P_rel_fro", "P_rel_spectral", "time_s"} <= metrics, f"metrics {metrics}")
c.check(all(np.isfinite(float(r["value"])) or r["metric"] == "P_mean_kl" for r in rows), "finite values")
floor = {(r["source"], r["step"]): float(r["value"])
         for r in rows if r["variant"] == "svd" and r["metric"] == "P_rel_fro"}
checked = 0
for r in rows:
    if r["metric"] == "P_rel_fro" and r["variant"] in ("nystrom", "cur", "linformer_pool"):
        f = floor[(r["source"], r["step"])]
        c.check(float(r["value"]) >= f * (1 - 1e-9), f"Eckart–Young: {r['variant']} {r['step']} {r['value']} < {f}")
        checked += 1
c.check(checked >= 20, f"Eckart–Young checked {checked} times")

# Kill a sweep midway, re-run: it completes, and the points finished before are not recomputed (their rows,
# time_s included, stay byte-identical). In the default format, gzip: the killed writer leaves a stream without its
# trailer, readable to its last flush (one per finished point).
out = path("kill.csv.gz")
args = [BIN, "run", "error_vs_budget", "--n", "160", "--d", "16", "--sources", "gaussian,clustered,lowrank",
        "--families", "svd,nystrom,performer,vq,local,reformer", "--out", out]
proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.time() + 120
while time.time() < deadline:
    if os.path.exists(out) and len(points_done(rows_of(out))) >= 2:
        break
    time.sleep(0.05)
proc.send_signal(signal.SIGKILL)
proc.wait()
before = rows_of(out)
done_before = points_done(before)
c.check(2 <= len(done_before) < 18, f"killed midway: {len(done_before)} of 18 points done")
kept = {(r["point"], r["variant"], r["step"], r["metric"]): r["value"] for r in before if r["point"] in done_before}
r = run(*args[1:])
c.check(r.returncode == 0 and f"{len(done_before)} already done" in r.stderr, f"resume: {r.stderr!r}")
after = rows_of(out)
c.check(len(points_done(after)) == 18, f"resumed run completes: {len(points_done(after))}")
again = {(r["point"], r["variant"], r["step"], r["metric"]): r["value"] for r in after if r["point"] in done_before}
c.check(again == kept, "finished points were not recomputed")
keys = [(r["point"], r["variant"], r["step"], r["metric"]) for r in after]
c.check(len(keys) == len(set(keys)), "no duplicate rows after resuming")
c.check(gzip_members(out) == 1 and gzip.open(out).read().decode() == read_text(out),
        "the resumed gzip file is compacted into one complete member (Python's gzip reads it)")
evb_cost = [r for r in after if r["metric"] in ("cost_time_s", "cost_speedup_vs_exact", "cost_peak_memory_bytes")]
c.check(len(evb_cost) == 3 * len([r for r in after if r["metric"] == "out_rel_fro" and r["variant"] != "svd"]) and
        all(float(r["value"]) >= 0 for r in evb_cost),
        "error_vs_budget: cost rows for every method and budget but the SVD floor's")
c.check(not any(r["variant"] == "svd" for r in evb_cost), "error_vs_budget: the SVD floor (a reference) is not timed")
# The same grid computed in one go: every non-timing value equals the killed-and-resumed run's.
r = run(*args[1:-1], path("fresh.csv.gz"))
timing = ("time_s", "cost_time_s", "cost_time_median_s", "cost_speedup_vs_exact", "cost_peak_memory_bytes")
def values(rows):
    return {(x["point"], x["variant"], x["step"], x["metric"]): x["value"] for x in rows if x["metric"] not in timing}
c.check(r.returncode == 0 and values(rows_of(path("fresh.csv.gz"))) == values(after),
        "a fresh run gives the resumed run's values exactly")

# Shards partition the grid.
for i in (0, 1):
    r = run("run", "pinv", "--n", 128, "--m", "8,16,32", "--sources", "gaussian", "--iters", 10, "--shard", f"{i}/2",
            "--out", path(f"shard{i}.csv"))
    c.check(r.returncode == 0, f"shard {i}: {r.stderr!r}")
s0, s1 = points_done(rows_of(path("shard0.csv"))), points_done(rows_of(path("shard1.csv")))
c.check(len(s0) == 2 and len(s1) == 1 and not (s0 & s1), f"shards {s0} {s1}")
root_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
m = subprocess.run([sys.executable, os.path.join(root_dir, "tools", "merge_shards.py"),
                    path("merged.csv"), path("shard0.csv"), path("shard1.csv")], capture_output=True, text=True)
merged = rows_of(path("merged.csv")) if m.returncode == 0 else []
c.check(m.returncode == 0 and points_done(merged) == s0 | s1 and
        len(merged) == len(rows_of(path("shard0.csv"))) + len(rows_of(path("shard1.csv"))), f"merge: {m.stderr!r}")
# The same merge on compressed shards (docs/reproducing.md's Slurm recipe writes part_i.csv.gz).
for i in (0, 1):
    r = run("run", "pinv", "--n", 128, "--m", "8,16,32", "--sources", "gaussian", "--iters", 10, "--shard", f"{i}/2",
            "--out", path(f"shard{i}.csv.gz"))
m = subprocess.run([sys.executable, os.path.join(root_dir, "tools", "merge_shards.py"),
                    path("merged.csv.gz"), path("shard0.csv.gz"), path("shard1.csv.gz")],
                   capture_output=True, text=True)
mz = rows_of(path("merged.csv.gz")) if m.returncode == 0 else []
c.check(m.returncode == 0 and points_done(mz) == s0 | s1 and
        {k: v for k, v in ((x["point"] + x["variant"] + x["step"] + x["metric"], x["value"]) for x in mz)} ==
        {k: v for k, v in ((x["point"] + x["variant"] + x["step"] + x["metric"], x["value"]) for x in merged)},
        f"merge of .csv.gz shards gives the plain merge's rows: {m.stderr!r}")
r = run("run", "pinv", "--shard", "2/2")
c.check(r.returncode > 0 and "--shard" in r.stderr, f"bad shard refused: {r.stderr!r}")

# pinv times nothing, so its points run side by side (one thread each, --threads at once): the file has the bytes of
# the run on one thread (the code version aside: the same binary) with the points in grid order, whichever finished
# first; a resumed side-by-side run completes it the same way.
grid = ("run", "pinv", "--n", "96,128", "--m", "8,16,32", "--sources", "gaussian,clustered", "--iters", 8)
for threads in (1, 2, 3):
    r = run(*grid, "--threads", threads, "--out", path(f"side{threads}.csv.gz"))
    c.check(r.returncode == 0 and "12 points computed" in r.stderr, f"pinv --threads {threads}: {r.stderr!r}")
one = read_text(path("side1.csv.gz"))
c.check(all(read_text(path(f"side{t}.csv.gz")) == one for t in (2, 3)),
        "pinv side by side: the same text as on one thread")
order = list(dict.fromkeys(r["point"] for r in rows_of(path("side1.csv.gz"))))
c.check(order == [f"source={s} n={n} m={m} d=64 seed=0" for s in ("gaussian", "clustered") for n in (96, 128)
                  for m in (8, 16, 32)], f"points in grid order: {order[:3]}…")
r = run(*grid[:3], "96", *grid[4:], "--threads", 2, "--out", path("side_resumed.csv.gz"))  # half the grid
r = run(*grid, "--threads", 2, "--out", path("side_resumed.csv.gz"))
c.check(r.returncode == 0 and "6 already done" in r.stderr and read_text(path("side_resumed.csv.gz")) == one,
        f"a resumed side-by-side run gives the same text: {r.stderr!r}")
# spectrum's dense points run side by side, its timed top-k points alone after them (Point::alone): the same rows as
# on one thread but the top-k's time and memory, the points in grid order.
grid = ("run", "spectrum", "--n", 64, "--d", 16, "--sources", "gaussian,clustered", "--temperatures", "1,2",
        "--large-n", 96, "--top", 4)
for threads in (1, 2):
    r = run(*grid, "--threads", threads, "--out", path(f"spec{threads}.csv"))
    c.check(r.returncode == 0 and "8 points computed" in r.stderr, f"spectrum --threads {threads}: {r.stderr!r}")
untimed = lambda f: [{k: v for k, v in x.items() if k != "code_version"} for x in rows_of(f)  # noqa: E731
                     if x["metric"] not in ("time_s", "peak_memory_bytes")]
c.check(untimed(path("spec1.csv")) == untimed(path("spec2.csv")), "spectrum side by side: the same rows, in order")
order = list(dict.fromkeys(x["point"] for x in rows_of(path("spec2.csv"))))
c.check([p.split()[0] for p in order] == ["dense", "topk"] * 4,
        f"spectrum: dense and top-k points in grid order {order}")

# A file of results schema 1 is not resumed: the error names tools/migrate_results.py. Migrated, it is the file this
# version writes, byte for byte, and resumes with every point done.
out = path("v1.csv.gz")
r = run("run", "pinv", "--n", 128, "--m", "8,16", "--sources", "gaussian", "--iters", 10, "--out", out)
v2_bytes = open(out, "rb").read()
table = list(csv.reader(io.StringIO(read_text(out))))
v1 = [[f for i, f in enumerate(x) if i not in (10, 11, 12, 13)] for x in table]   # without sequence, layer, head, dtype
for x in v1[1:]:
    x[0] = "1"
buf = io.StringIO()
csv.writer(buf, lineterminator="\n").writerows(v1)
with gzip.open(out, "wt") as f:
    f.write(buf.getvalue())
r = run("run", "pinv", "--n", 128, "--m", "8,16", "--sources", "gaussian", "--iters", 10, "--out", out)
c.check(r.returncode > 0 and "results schema 1" in r.stderr and "tools/migrate_results.py" in r.stderr,
        f"a schema-1 file is refused with the migration's name: {r.stderr!r}")
m = subprocess.run([sys.executable, os.path.join(root_dir, "tools", "migrate_results.py"), out], capture_output=True,
                   text=True)
c.check(m.returncode == 0 and open(out, "rb").read() == v2_bytes, f"migrated: the bytes attnlab writes {m.stderr!r}")
r = run("run", "pinv", "--n", 128, "--m", "8,16", "--sources", "gaussian", "--iters", 10, "--out", out)
c.check(r.returncode == 0 and "2 already done" in r.stderr and open(out, "rb").read() == v2_bytes,
        f"the migrated file resumes: {r.stderr!r}")

# --dump-config, then --config replays the same grid.
r = run("run", "pinv", "--n", 128, "--m", "8,16", "--sources", "lowrank", "--iters", 12, "--dump-config")
c.check(r.returncode == 0 and "iters" in r.stdout, f"dump-config: {r.stdout!r}")
with open(path("pinv.toml"), "w") as f:
    f.write(r.stdout)
r = run("run", "pinv", "--config", path("pinv.toml"), "--out", path("replay.csv"))
c.check(r.returncode == 0, f"replay: {r.stderr!r}")
replayed = points_done(rows_of(path("replay.csv")))
c.check(replayed == {"source=lowrank n=128 m=8 d=64 seed=0", "source=lowrank n=128 m=16 d=64 seed=0"},
        f"replayed grid {replayed}")
c.check(os.path.exists(path("replay.csv") + ".config"), "sidecar configuration written")

# Every experiment, both presets: each option is declared once, and that declaration records it — the dumped
# configuration, read back with --config, dumps the same settings (every option survives the round trip), and the
# presets differ where they should (--preset paper dumps other values than quick).
# The experiments as the registry lists them (`attnlab run --help`), so a new one is covered without editing this.
listing = run("run", "--help").stdout.split("Subcommands:")[-1]
experiments = [line.split()[0] for line in listing.splitlines() if line.strip()]
c.check({"spectrum", "error_vs_budget", "pinv", "scaling"} <= set(experiments) and len(experiments) >= 9,
        f"run --help lists the experiments: {experiments}")
for exp in experiments:
    dumps = {}
    for preset in ("quick", "paper"):
        r = run("run", exp, "--preset", preset, "--dump-config")
        c.check(r.returncode == 0, f"{exp} --preset {preset} --dump-config: {r.stderr!r}")
        body = [line for line in r.stdout.splitlines() if not line.startswith("#")]
        cfg = path(f"{exp}_{preset}.cfg")
        with open(cfg, "w") as f:
            f.write(r.stdout)
        r2 = run("run", exp, "--config", cfg, "--dump-config")
        again = [line for line in r2.stdout.splitlines() if not line.startswith("#")]
        c.check(r2.returncode == 0 and again == body, f"{exp} {preset}: --config replays {again} != {body}")
        dumps[preset] = body
    grid = {k: [line for line in v if not line.startswith("preset")] for k, v in dumps.items()}
    c.check(grid["quick"] != grid["paper"], f"{exp}: the presets dump the same settings")

# spectrum: generated sources, the matrix-free top-k path, and the user's own (h, n, d) files against numpy's SVD.
rng = np.random.default_rng(5)
q = rng.standard_normal((2, 48, 16)); k = rng.standard_normal((2, 48, 16)); v = rng.standard_normal((2, 48, 8))
for name, a in (("uq.npy", q), ("uk.npy", k), ("uv.npy", v)):
    np.save(path(name), a)
r = run("run", "spectrum", "--n", 64, "--d", 16, "--sources", "gaussian", "--temperatures", "1,0.5",
        "--large-n", 200, "--top", 6, "--q", path("uq.npy"), "--k", path("uk.npy"), "--out", path("spec.csv"))
c.check(r.returncode == 0, f"spectrum: {r.returncode} {r.stderr!r}")
rows = rows_of(path("spec.csv"))
c.check(len(points_done(rows)) == 6, f"spectrum points {len(points_done(rows))}")


def softmax_rows(s):
    s = s - s.max(axis=1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=1, keepdims=True)


for h in (0, 1):
    ref = np.linalg.svd(softmax_rows(q[h] @ k[h].T / 4.0), compute_uv=False)
    got = np.array([float(x["value"]) for x in sorted(
        (x for x in rows if x["source"] == "files" and x["head"] == str(h) and x["metric"] == "singular_value"),
        key=lambda x: int(x["step"]))])
    c.check(got.shape == ref.shape and np.allclose(got, ref, rtol=1e-10, atol=1e-14),
            f"spectrum of head {h} against numpy: max diff "
            f"{np.abs(got - ref).max() if got.shape == ref.shape else got.shape}")
c.check({(x["head"], x["variant"], x["layer"], x["sequence"]) for x in rows if x["source"] == "files"} ==
        {("0", "", "", ""), ("1", "", "", "")}, "spectrum of the files: the head in the head column, nothing else")
for src, var, head in {(x["source"], x["variant"], x["head"]) for x in rows if x["metric"] == "cumulative"}:
    cum = [float(x["value"]) for x in sorted((x for x in rows if x["metric"] == "cumulative" and x["source"] == src
                                              and x["variant"] == var and x["head"] == head),
                                             key=lambda x: int(x["step"]))]
    c.check(all(b >= a - 1e-12 for a, b in zip(cum, cum[1:])) and abs(cum[-1] - 1) < 1e-12,
            f"cumulative spectrum of {src} {var} {head} rises to 1")
top = [float(x["value"]) for x in rows if x["metric"] == "top_singular_value" and x["source"] == "gaussian"]
c.check(len(top) == 12 and all(t > 0 for t in top), f"matrix-free top-k rows: {len(top)}")
# The user's heads also get the matrix-free top k (block solver), equal to numpy's SVD, with residuals ≤ tolerance.
for h in (0, 1):
    ref = np.linalg.svd(softmax_rows(q[h] @ k[h].T / 4.0), compute_uv=False)[:6]
    sel = [x for x in rows if x["source"] == "files" and x["head"] == str(h)]
    got = np.array([float(x["value"]) for x in sorted((x for x in sel if x["metric"] == "top_singular_value"),
                                                       key=lambda x: int(x["step"]))])
    res = [float(x["value"]) for x in sel if x["metric"] == "residual"]
    c.check(got.shape == ref.shape and np.allclose(got, ref, rtol=1e-9, atol=0) and max(res) <= 1e-9,
            f"matrix-free top 6 of head {h} against numpy: {got} vs {ref}, residuals {res}")

# error_vs_budget on the user's files agrees with numpy's own computation of the same error.
r = run("run", "error_vs_budget", "--sources", "gaussian", "--n", 48, "--d", 16, "--families", "linformer_pool",
        "--q", path("uq.npy"), "--k", path("uk.npy"), "--v", path("uv.npy"), "--out", path("evb_files.csv"))
c.check(r.returncode == 0, f"error_vs_budget on files: {r.returncode} {r.stderr!r}")
rows = rows_of(path("evb_files.csv"))
for h in (0, 1):
    kk = 16
    e = np.zeros((kk, 48))  # mean pooling over 16 segments of 3
    for s_ in range(kk):
        e[s_, s_ * 3:(s_ + 1) * 3] = 1 / 3
    p_exact = softmax_rows(q[h] @ k[h].T / 4.0)
    p_lin = softmax_rows(q[h] @ (e @ k[h]).T / 4.0) @ e
    ref_p = np.linalg.norm(p_exact - p_lin) / np.linalg.norm(p_exact)
    ref_o = np.linalg.norm(p_exact @ v[h] - p_lin @ v[h]) / np.linalg.norm(p_exact @ v[h])
    got = {x["metric"]: float(x["value"]) for x in rows
           if x["source"] == "files" and x["head"] == str(h) and x["step"] == "16" and x["variant"] == "linformer_pool"}
    c.check(abs(got.get("P_rel_fro", -1) - ref_p) < 1e-10 * ref_p and
            abs(got.get("out_rel_fro", -1) - ref_o) < 1e-10 * ref_o,
            f"head {h}: attnlab {got.get('P_rel_fro')}, {got.get('out_rel_fro')} vs numpy {ref_p}, {ref_o}")

# Given --q (and --k, --v), an experiment runs on those files: giving --q makes 'files' the source — the only one
# unless --sources names others — in every experiment that takes the model's heads (docs/figures.md:
# `attnlab run spectrum --q Q.npy --k K.npy`; before, the preset's 'trained' source failed without an exported model).
r = run("run", "spectrum", "--q", path("uq.npy"), "--k", path("uk.npy"), "--top", 4, "--model-data", path("none"),
        "--out", path("spec_files.csv"))
rows = rows_of(path("spec_files.csv")) if r.returncode == 0 else []
c.check(r.returncode == 0 and {x["source"] for x in rows if x["metric"] != "point_done"} == {"files"} and
        len(points_done(rows)) == 2, f"spectrum --q/--k alone runs on the files only: {r.returncode} {r.stderr!r}")
r2 = run("run", "spectrum", "--sources", "files", "--q", path("uq.npy"), "--k", path("uk.npy"), "--top", 4,
         "--dump-config")
r1 = run("run", "spectrum", "--q", path("uq.npy"), "--k", path("uk.npy"), "--top", 4, "--dump-config")
c.check(r1.returncode == 0 and r2.stdout == r1.stdout and "sources = files" in r1.stdout,
        f"--sources files with --q is the same grid as --q alone: {r1.stdout!r} {r2.stderr!r}")
r = run("run", "spectrum", "--sources", "files")
c.check(r.returncode > 0 and "source 'files'" in r.stderr and "--q" in r.stderr, f"files without --q: {r.stderr!r}")
r = run("run", "regimes", "--sources", "gausian", "--n", 64)
c.check(r.returncode > 0 and "unknown source 'gausian'; did you mean gaussian?" in r.stderr and "files" in r.stderr,
        f"unknown source: {r.stderr!r}")
for exp in ("spectrum", "regimes", "pinv", "probsparse", "vq", "error_vs_budget"):
    h = run("run", exp, "--help").stdout
    c.check("--q" in h and "files: the --q/--k/--v files" in h, f"{exp} --help lists source files and --q")
# regimes on the files: one point per head, each head's entropy equal to numpy's (the files' own values used).
r = run("run", "regimes", "--q", path("uq.npy"), "--k", path("uk.npy"), "--v", path("uv.npy"), "--methods",
        "local:window=4", "--model-data", path("none"), "--out", path("reg_files.csv"))
rows = rows_of(path("reg_files.csv")) if r.returncode == 0 else []
c.check(r.returncode == 0 and {x["source"] for x in rows if x["metric"] != "point_done"} == {"files"},
        f"regimes on files: {r.returncode} {r.stderr!r}")
for h in (0, 1):
    p_ = softmax_rows(q[h] @ k[h].T / 4.0)
    ref = float(np.mean(-(p_ * np.log(p_)).sum(axis=1)))
    got = [float(x["value"]) for x in rows if x["metric"] == "entropy" and x["head"] == str(h) and x["variant"] == ""]
    c.check(len(got) == 1 and abs(got[0] - ref) <= 1e-12 * ref, f"regimes head {h}: entropy {got} vs numpy {ref}")
# pinv, probsparse, vq and error_vs_budget on the files alone (no generated source, no model export needed).
for exp, extra in (("pinv", ["--m", "8,16", "--iters", 8]), ("probsparse", ["--factors", 1]),
                   ("vq", ["--codes", 8, "--temperatures", 1]), ("error_vs_budget", ["--families", "local"])):
    r = run("run", exp, "--q", path("uq.npy"), "--k", path("uk.npy"), "--v", path("uv.npy"), *extra,
            "--model-data", path("none"), "--out", path(f"{exp}_files.csv"))
    rows = rows_of(path(f"{exp}_files.csv")) if r.returncode == 0 else []
    srcs = {(x["source"], x["head"], x["layer"], x["sequence"]) for x in rows if x["metric"] != "point_done"}
    c.check(r.returncode == 0 and srcs == {("files", "0", "", ""), ("files", "1", "", "")},
            f"{exp} on files: source files, the head in its column: {r.returncode} {srcs} {r.stderr!r}")
# The files' checks: mixed dtypes refused naming each (the command's and the module's rule); V where it is used.
np.save(path("uq32.npy"), q.astype(np.float32))
r = run("run", "regimes", "--q", path("uq32.npy"), "--k", path("uk.npy"), "--v", path("uv.npy"), "--n", 64)
c.check(r.returncode > 0 and "uq32.npy is float32" in r.stderr and "uk.npy is float64" in r.stderr,
        f"mixed dtypes refused: {r.stderr!r}")
r = run("run", "regimes", "--q", path("uq.npy"), "--k", path("uk.npy"))
c.check(r.returncode > 0 and "--v" in r.stderr, f"regimes needs --v: {r.stderr!r}")

# error_vs_length: the floor lies below every rank-limited method at every n.
r = run("run", "error_vs_length", "--n", "64,96", "--d", 16, "--budget", 8, "--sources", "clustered",
        "--methods", "svd:rank;nystrom:landmarks;linformer:projection=pool,k", "--out", path("evl.csv"))
c.check(r.returncode == 0, f"error_vs_length: {r.returncode} {r.stderr!r}")
rows = rows_of(path("evl.csv"))
for n in ("64", "96"):
    vals = {x["variant"]: float(x["value"]) for x in rows if x["n"] == n and x["metric"] == "P_rel_fro"}
    c.check(len(vals) == 3 and all(v_ >= vals["svd:rank"] * (1 - 1e-9) for v_ in vals.values()), f"n={n}: {vals}")

# performer_mse: tiny grid; Lemma 2's ratio grid is exact (0 at θ = 0, where x = y and MSE_trig vanishes).
r = run("run", "performer_mse", "--length", 64, "--features", "8,16", "--draws", 3, "--pairs", 16,
        "--out", path("pmse.csv"))
c.check(r.returncode == 0, f"performer_mse: {r.returncode} {r.stderr!r}")
rows = rows_of(path("pmse.csv"))
c.check(len(points_done(rows)) == 13, f"performer_mse points {len(points_done(rows))}")
ratio = [x for x in rows if x["metric"] == "mse_ratio_trig_over_positive"]
c.check(len(ratio) == 37 * 20 and all(float(x["value"]) == 0 for x in ratio if x["step"] == "0"), "Fig. 2 grid")
c.check(all(float(x["value"]) > 0 for x in rows
            if x["metric"] in ("kernel_mse", "kernel_mse_lemma2_iid", "output_mse")),
        "MSEs positive")

# vq: soft assignment at small T equals hard (Su 2023's T → 0 limit); every variant at every codebook size.
r = run("run", "vq", "--n", 96, "--d", 16, "--codes", "8,16", "--temperatures", "0.001,10", "--sources", "clustered",
        "--out", path("vq.csv"))
c.check(r.returncode == 0, f"vq: {r.returncode} {r.stderr!r}")
rows = rows_of(path("vq.csv"))
for codes in ("8", "16"):
    vals = {x["variant"]: float(x["value"]) for x in rows if x["step"] == codes and x["metric"] == "P_rel_fro"}
    c.check(set(vals) == {"hard", "soft T=0.001", "soft T=10", "both (mean-field)", "performer"}, f"vq variants {vals}")
    c.check(abs(vals.get("soft T=0.001", -1) - vals.get("hard", 1)) < 1e-6, f"soft T→0 equals hard: {vals}")

# regimes: the entropy rises with the temperature.
r = run("run", "regimes", "--n", 96, "--d", 16, "--temperatures", "0.25,1,4", "--sources", "gaussian",
        "--methods", "svd:rank=8;local:window=4", "--out", path("reg.csv"))
c.check(r.returncode == 0, f"regimes: {r.returncode} {r.stderr!r}")
rows = rows_of(path("reg.csv"))
ent = [float(x["value"]) for x in sorted((x for x in rows if x["metric"] == "entropy"),
                                          key=lambda x: float(x["variant"][2:]))]
c.check(len(ent) == 3 and ent[0] < ent[1] < ent[2] <= np.log(96) + 1e-9, f"entropies {ent}")

# probsparse: Lemma 1 holds for every query; recall lies in [0, 1].
r = run("run", "probsparse", "--n", 128, "--d", 16, "--factors", "1,5", "--sources", "gaussian,clustered",
        "--out", path("ps.csv"))
c.check(r.returncode == 0, f"probsparse: {r.returncode} {r.stderr!r}")
rows = rows_of(path("ps.csv"))
c.check(all(float(x["value"]) == 1.0 for x in rows if x["metric"].startswith("lemma1_")) and
        sum(x["metric"].startswith("lemma1_") for x in rows) == 4, "Lemma 1 holds for every query")
rec = [float(x["value"]) for x in rows if x["metric"] == "top_u_recall"]
c.check(len(rec) == 8 and all(0 <= v_ <= 1 for v_ in rec), f"recall {rec}")

# scaling: times positive, the materialized exact path's memory grows with n (4× per doubling of n).
r = run("run", "scaling", "--n", "256,512", "--methods", "exact:impl=materialized;exact;nystrom:landmarks=32",
        "--repeats", 1, "--out", path("sc.csv"))
c.check(r.returncode == 0, f"scaling: {r.returncode} {r.stderr!r}")
rows = rows_of(path("sc.csv"))
c.check(all(float(x["value"]) > 0 for x in rows if x["metric"] == "time_s") and
        sum(x["metric"] == "time_s" for x in rows) == 6, "scaling times")
mem = {x["n"]: float(x["value"]) for x in rows
       if x["metric"] == "peak_memory_bytes" and x["variant"] == "exact:impl=materialized"}
c.check(mem.get("512", 0) >= 512 * 512 * 4, f"materialized exact at n=512 holds its 1 MiB matrix: {mem}")

# The plots render from the CSVs (tools/plot.py, Debian's matplotlib and pandas); the tiny spectrum has n < 128, so
# there is no heatmap at index 128: 17 figures (with error against time and against memory).
import shutil
import sys
plots = path("plots")
os.makedirs(plots, exist_ok=True)
shutil.copy(path("pinv.csv"), os.path.join(plots, "pinv.csv"))
for name, src in (("error_vs_budget", "evb.csv"), ("spectrum", "spec.csv")):   # compact files read as they are
    with open(path(src), "rb") as fi, gzip.open(os.path.join(plots, name + ".csv.gz"), "wb") as fo:
        fo.write(fi.read())
shutil.copy(path("evl.csv"), os.path.join(plots, "error_vs_length.csv"))
shutil.copy(path("pmse.csv"), os.path.join(plots, "performer_mse.csv"))
shutil.copy(path("vq.csv"), os.path.join(plots, "vq.csv"))
shutil.copy(path("reg.csv"), os.path.join(plots, "regimes.csv"))
shutil.copy(path("ps.csv"), os.path.join(plots, "probsparse.csv"))
shutil.copy(path("sc.csv"), os.path.join(plots, "scaling.csv"))
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
r = subprocess.run([sys.executable, os.path.join(root, "tools", "plot.py"), "--results", plots],
                   capture_output=True, text=True, timeout=300)
c.check(r.returncode == 0, f"plot.py: {r.stderr[-500:]!r}")
pngs = [l for l in r.stdout.split() if l.endswith(".png")]
c.check(len(pngs) == 17 and all(os.path.getsize(p) > 10000 for p in pngs), f"figures {pngs}")

c.finish()
