"""`attnlab report`: costs at a stated length, the Eckart–Young floor per head, and a recommendation that follows
its rule — among the candidates under the target, those within the timing noise of the fastest count as equally
fast; of those the lowest error wins (then the simpler family, then the smaller budget); it must beat exact attention
by more than the noise. The rule is checked against the report's own CSV, so any head's verdict can fail it."""
import io
import os

import numpy as np
import pandas as pd

from harness import Checks, path, run

c = Checks()
rng = np.random.default_rng(7)
h, n, d = 3, 128, 16
# Heads of different character: clustered keys (low rank), a sharp near-diagonal head, a broad Gaussian one.
centres = rng.standard_normal((4, d)) * 3
q = np.stack([centres[rng.integers(0, 4, n)] + 0.1 * rng.standard_normal((n, d)),
              4 * np.eye(n, d) + 0.01 * rng.standard_normal((n, d)),
              rng.standard_normal((n, d))]).astype(np.float32)
k = np.stack([q[0] + 0.1 * rng.standard_normal((n, d)), q[1], rng.standard_normal((n, d))]).astype(np.float32)
v = rng.standard_normal((h, n, d)).astype(np.float32)
for name, a in (("q", q), ("k", k), ("v", v)):
    np.save(path(f"r{name}.npy"), a)

# The tie-break's simplicity ranks as the registry declares them (each method's Study, `attnlab methods --families`).
families = pd.read_csv(io.StringIO(run("methods", "--families").stdout))
RANK = {f.label: (int(f.simplicity) if f.simplicity != "last" else 1 << 20) for f in families.itertuples()}
deployable = families[families.deployable]
c.check(len(set(RANK[x] for x in deployable.label)) == len(deployable) and min(RANK, key=RANK.get) == "local"
        and all(RANK[x] == 1 << 20 for x in families[~families.deployable].label),
        "simplicity ranks: distinct for the deployable families (a total tie-break), a fixed window the simplest, the "
        "analysis baselines last")
out = path("report")
cost_n, noise, target = 512, 0.25, 0.3
r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", out,
        "--cost-n", cost_n, "--noise", noise, "--target", target, "--repeats", 3, timeout=600)
c.check(r.returncode == 0, f"report runs: {r.stderr[-400:]}")
if r.returncode == 0:
    df = pd.read_csv(os.path.join(out, "report.csv"))
    summary = open(os.path.join(out, "summary.md")).read()
    c.check(f"at n = {cost_n}" in summary, "summary.md states the length the costs were measured at")
    c.check("on this machine's CPU (" in summary and "threads=" in summary and "speed-up on this CPU" in summary,
            "summary.md names the device the costs were timed on (this CPU, its threads and kernels)")
    c.check((df[df.metric == "cost_n"].value == cost_n).all() and (df.metric == "cost_n").sum() == h,
            "report.csv records cost_n per head")
    floor = df[df.metric == "eckart_young_floor"]
    c.check(sorted(floor.budget.dropna().astype(int).unique()) == [8, 16, 32, 64, 128],
            "the Eckart–Young floor at every rank ≤ n")
    for (layer, head), g in df.groupby(["layer", "head"]):
        fl = g[g.metric == "eckart_young_floor"].set_index("budget").value
        c.check(bool(np.all(np.diff(fl.sort_index().values) <= 1e-12)), f"head {head}: floor falls with the rank")
        out_err = g[(g.metric == "out_rel_fro") & g.family.notna()].set_index(["family", "budget"]).value
        svd_ok = all(out_err.get(("svd", b), np.inf) >= 0 for b in fl.index)  # svd is not a candidate
        c.check(svd_ok and "svd" not in set(g[g.metric == "recommended"].family), f"head {head}: svd never recommended")
        exact_t = g[(g.metric == "time_s") & (g.spec == "exact")].value.iloc[0]
        exact_med = g[(g.metric == "time_median_s") & (g.spec == "exact")].value.iloc[0]
        pts = g[g.family.notna() & (g.family != "svd")].pivot_table(index=["family", "budget"], columns="metric",
                                                                   values="value")
        pts = pts[pts.time_s.notna()]
        pts["noise"] = np.maximum(noise, (pts.time_median_s - pts.time_s) / pts.time_s)
        under = pts[pts.out_rel_fro <= target].sort_values("time_s")
        rec = pts[pts.recommended == 1]
        c.check(len(rec) <= 1, f"head {head}: at most one recommendation")
        if under.empty:
            c.check(rec.empty, f"head {head}: nothing under the target, nothing recommended")
            continue
        fastest = under.iloc[0]
        near = under[under.time_s <= fastest.time_s * (1 + np.maximum(fastest.noise, under.noise))]
        order = sorted(near.index, key=lambda fb: (near.loc[fb, "out_rel_fro"], RANK[fb[0]], fb[1]))
        pick = near.loc[order[0]]
        exact_noise = max(noise, (exact_med - exact_t) / exact_t)
        beats = pick.time_s * (1 + max(pick.noise, exact_noise)) < exact_t
        if beats:
            c.check(len(rec) == 1 and rec.index[0] == order[0],
                    f"head {head}: recommends {order[0]} (within the noise of the fastest, lowest error), got "
                    f"{list(rec.index)}")
        else:
            c.check(rec.empty, f"head {head}: keeps exact when the pick {order[0]} does not beat it beyond the noise")
        # The speed-up convention: exact's time over the method's.
        sp = g[g.metric == "speedup_vs_exact"].set_index(["family", "budget"]).value
        t = pts.time_s
        c.check(np.allclose(sp.loc[t.index].values, exact_t / t.values, rtol=1e-9),
                f"head {head}: speedup_vs_exact = exact time / method time")
    html = open(os.path.join(out, "index.html")).read()
    c.check("Eckart–Young floor" in html and f"n = {cost_n}" in html, "index.html shows the floor and the cost length")
    c.check("\\sum" not in html and "Σ_{" not in html, "no raw TeX in the figures")

# --precision: the recommendation for the format the user runs. One Gaussian head, n = 1024, d = 64, logits at
# temperature 2 (Q·2), where eager Performer (the reference code's stabilisation) returns NaN in float16: e^{−‖x‖²/2}
# inside each query's features underflows and 0/0 is NaN (issue "Reduced precision", the H200's second observation).
# In fp16 eager Performer is then no candidate whatever its float64 error; every other error is the method's run in
# the format against exact float64 (its float64 error kept beside it), and the summary says which format.
g = np.random.default_rng(11)
for name, scale in (("q", 2.0), ("k", 1.0), ("v", 1.0)):
    np.save(path(f"p{name}.npy"), (scale * g.standard_normal((1024, 64))).astype(np.float32))
reports = {}
for label, extra in (("native", []), ("fp16", ["--precision", "fp16", "--policy", "eager"])):
    r = run("report", "--q", path("pq.npy"), "--k", path("pk.npy"), "--v", path("pv.npy"), "--out", path(f"p_{label}"),
            "--families", "performer", "local", "--target", 100, "--repeats", 1, *extra, timeout=600)
    c.check(r.returncode == 0, f"report {label} runs: {r.stderr[-400:]}")
    if r.returncode == 0:
        reports[label] = pd.read_csv(os.path.join(path(f"p_{label}"), "report.csv"))
if len(reports) == 2:
    nat, f16 = reports["native"], reports["fp16"]
    perf = lambda df, m: df[(df.family == "performer") & (df.metric == m)].value  # noqa: E731
    c.check(np.isfinite(perf(nat, "out_rel_fro")).all() and not (nat.metric == "failed_in_format").any(),
            "float64 report: Performer's errors are finite, nothing failed")
    failed = f16[(f16.family == "performer") & (f16.metric == "failed_in_format")].budget
    c.check(len(failed) > 0, "fp16 eager report: Performer fails in the format")
    bad = f16[(f16.family == "performer") & f16.budget.isin(failed)]
    c.check(np.isinf(bad[bad.metric == "out_rel_fro"].value).all()
            and not ((bad.metric == "recommended") & (bad.value == 1)).any(),
            "fp16 eager report: a failed Performer budget has error +inf and is not recommended")
    loc = f16[(f16.family == "local")]
    e16 = loc[loc.metric == "out_rel_fro"].set_index("budget").value
    e64 = loc[loc.metric == "out_rel_fro_fp64"].set_index("budget").value
    c.check(len(e16) > 0 and (e16 != e64).all() and np.allclose(e16, e64, rtol=0.2, atol=5e-3),
            "fp16 report: local's errors are the format's (not float64's), close to float64's")
    c.check(np.allclose(e64.values, nat[(nat.family == "local") & (nat.metric == "out_rel_fro")]
                        .set_index("budget").value.loc[e64.index].values, rtol=1e-12),
            "fp16 report keeps the float64 errors beside them, equal to the native report's")
    summary = open(os.path.join(path("p_fp16"), "summary.md")).read()
    c.check("emulated fp16 storage, eager policy" in summary and f"{len(failed)} × performer" in summary
            and "not fp16 arithmetic" in summary, "the summary names the format, the failure and the costs' format")
r = run("report", "--q", path("pq.npy"), "--k", path("pk.npy"), "--v", path("pv.npy"), "--out", path("bad"),
        "--policy", "careful")
c.check(r.returncode != 0 and "--precision" in r.stderr, f"--policy without --precision refused: {r.stderr.strip()}")

r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", path("bad"),
        "--cost-n", 0)
c.check(r.returncode != 0 and "cost" in r.stderr.lower(), f"--cost-n 0 refused: {r.stderr.strip()}")
# Costs timed on more threads than this machine's cores would time the scheduler: refused before any work.
r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", path("bad"),
        "--threads", str((os.cpu_count() or 1) + 1))
c.check(r.returncode != 0 and "cores" in r.stderr and "--costs" in r.stderr,
        f"--threads above the cores refused: {r.stderr.strip()[-200:]}")

# A report built from costs measured elsewhere (--costs FILE: issue "Costs on the machine the user runs"): it times
# nothing, names the file's device wherever it quotes a cost, and recommends from the file's numbers. Two synthetic
# tables on an invented device: one where the local window costs 0.1 ms against exact's 10 ms and every other family
# 50 ms (local must be recommended wherever it meets the target), one where local costs 20 ms (nothing beats exact).
fam = families.set_index("label")


def costs_file(name, local_ms, other_ms=50.0, exact_ms=10.0):
    rows = []
    for n_ in (256, 1024):
        rows.append(dict(method="exact", budget="", n=n_, ms=exact_ms))
        for label in ("local", "nystrom", "linformer_pool"):
            base = fam.loc[label, "spec"]
            method, _, params = base.partition(":")
            for b in str(fam.loc[label, "budgets"]).split():
                budget = ",".join(x for x in (params, f"{fam.loc[label, 'param']}={b}") if x)
                rows.append(dict(method=method, budget=budget, n=n_, ms=local_ms if label == "local" else other_ms))
    t = pd.DataFrame(rows).assign(d=d, dtype="fp32", **{"pass": "fwd"}, causal=False, status="ok",
                                  device_name="Test Device 9000")
    t.to_csv(path(name), index=False)
    return path(name)


for name, local_ms in (("fast_local", 0.1), ("slow_local", 20.0)):
    out = path(f"costs_{name}")
    r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", out,
            "--costs", costs_file(f"{name}.csv", local_ms), "--cost-n", 512, "--target", 0.9,
            "--families", "local,nystrom,linformer_pool", timeout=600)
    c.check(r.returncode == 0, f"report --costs ({name}) runs: {r.stderr[-400:]}")
    if r.returncode:
        continue
    df = pd.read_csv(os.path.join(out, "report.csv"))
    summary = open(os.path.join(out, "summary.md")).read()
    c.check("measured on Test Device 9000, fp32, d = 16, forward" in summary
            and "speed-up on Test Device 9000, fp32" in summary and "nothing timed on this machine" in summary,
            f"{name}: summary.md names the costs file's device where it quotes costs")
    c.check("Test Device 9000" in open(os.path.join(out, "index.html")).read()
            and "Test Device 9000" in open(os.path.join(out, "report.csv.config")).read(),
            f"{name}: index.html and the config name the device")
    ex = df[(df.metric == "time_s") & (df.spec == "exact")].value
    c.check(np.allclose(ex, 10e-3), f"{name}: exact's cost is the table's (10 ms at 256 and 1024 → 10 ms at 512)")
    loc_t = df[(df.family == "local") & (df.metric == "time_s")].value
    c.check(len(loc_t) > 0 and np.allclose(loc_t, local_ms * 1e-3), f"{name}: local's costs are the table's")
    for head, g in df.groupby("head"):
        under = g[(g.family == "local") & (g.metric == "out_rel_fro") & (g.value <= 0.9)]
        rec = g[(g.metric == "recommended") & (g.value == 1)]
        if name == "fast_local" and len(under):
            c.check(len(rec) == 1 and rec.family.iloc[0] == "local",
                    f"fast_local head {head}: recommends the table's fast local window, got {list(rec.family)}")
        if name == "slow_local":
            c.check(rec.empty, f"slow_local head {head}: nothing beats the table's exact attention: keep exact")
# A peer's rows (bench_gpu.py's exact_eager) are left out and named; a file joining two devices' runs is refused.
t = pd.read_csv(costs_file("peer.csv", 0.1))
extra = t[t.method == "exact"].assign(method="exact_eager")
pd.concat([t, extra]).to_csv(path("peer.csv"), index=False)
r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", path("peer"),
        "--costs", path("peer.csv"), "--cost-n", 512, "--families", "local", timeout=600)
c.check(r.returncode == 0 and "rows of exact_eager left out" in open(os.path.join(path("peer"), "summary.md")).read(),
        f"--costs: a method attnlab does not know is left out and named: {r.stderr[-300:]}")
two = pd.concat([t, t.assign(device_name="Other Device")])
two.to_csv(path("two.csv"), index=False)
r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", path("bad"),
        "--costs", path("two.csv"), "--cost-n", 512)
c.check(r.returncode != 0 and "several devices" in r.stderr, f"--costs: two devices' rows refused: {r.stderr[-200:]}")
r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", path("bad"),
        "--costs", costs_file("short.csv", 0.1), "--cost-n", 8192)
c.check(r.returncode != 0 and "not measured at n = 8192" in r.stderr,
        f"--costs without exact at the cost length refused before any work: {r.stderr.strip()[-200:]}")
# A faster exact attention on this CPU (--exact-peer FILE: issue "Costs on the machine the user runs", item 5): the
# report times here, then states every speed-up over the faster of attnlab's exact and the peer's, named, from the
# ratio tools/bench_exact_peer.py measured. Synthetic tables on this CPU: a peer 100× faster than attnlab's exact
# (nothing beats it: keep exact everywhere, speed-ups over it) and one at half its speed (attnlab's exact stands).
cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
           "unknown CPU")
# This command's kernels, as its runs record them (the table's attnlab rows must be this build's).
run("run", "scaling", "--n", 64, "--repeats", 1, "--methods", "exact", "--out", path("kern.csv"))
kernels = next(ln.split(":", 1)[1].strip() for ln in open(path("kern.csv") + ".config")
               if ln.startswith("# costs measured with:"))
kernels = kernels.split(" ", 1)[1]  # less the thread count


def peer_file(name, ratio, device=cpu, threads=1, dim=d, build_kernels=None):
    rows = []
    for n_ in (256, 1024):
        rows.append(dict(impl="attnlab", build="default", dtype="fp32", n=n_, d=dim, threads=threads,
                         time_s=1e-3 * ratio, device=device,
                         detail=f"attnlab default: {build_kernels or kernels}"))
        rows.append(dict(impl="attnlab", build="other", dtype="fp32", n=n_, d=dim, threads=threads, time_s=1e-9,
                         device=device, detail="attnlab other: products=a BLAS isa=none"))
        rows.append(dict(impl="PyTorch SDPA", build="", dtype="fp32", n=n_, d=dim, threads=threads, time_s=1e-3,
                         device=device, detail="torch 9.9, SDPA backend FLASH_ATTENTION"))
        rows.append(dict(impl="PyTorch SDPA", build="", dtype="bf16", n=n_, d=dim, threads=threads, time_s=1e-6,
                         device=device, detail="torch 9.9, SDPA backend FLASH_ATTENTION"))
    pd.DataFrame(rows).to_csv(path(name), index=False)
    return path(name)


for name, ratio in (("fast_peer", 100.0), ("slow_peer", 0.5), ("noise_peer", 1.05)):
    out = path(f"peer_{name}")
    r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", out,
            "--exact-peer", peer_file(f"{name}.csv", ratio), "--cost-n", 512, "--threads", 1, "--target", 0.9,
            "--repeats", 2, "--families", "local,nystrom", timeout=600)
    c.check(r.returncode == 0, f"report --exact-peer ({name}) runs: {r.stderr[-400:]}")
    if r.returncode:
        continue
    df = pd.read_csv(os.path.join(out, "report.csv"))
    summary = open(os.path.join(out, "summary.md")).read()
    ex = df[df.spec == "exact"].pivot_table(index="head", columns="metric", values="value")
    c.check(np.allclose(ex.exact_peer_ratio, ratio), f"{name}: the peer's ratio at n = 512 (between 256 and 1024)")
    want = ex.time_s / ratio if ratio > 1.1 else ex.time_s  # within the timing noise (10%): equal
    c.check(np.allclose(ex.baseline_time_s, want), f"{name}: the baseline is the faster exact attention")
    pts = df[df.family.notna() & (df.metric.isin(["time_s", "speedup_vs_exact"]))].pivot_table(
        index=["head", "family", "budget"], columns="metric", values="value")
    base = ex.baseline_time_s.reindex(pts.index.get_level_values("head")).values
    c.check(len(pts) > 0 and np.allclose(pts.speedup_vs_exact, base / pts.time_s),
            f"{name}: every speed-up is over that baseline")
    if ratio > 1.1:
        c.check("speed-up over PyTorch SDPA on this CPU, 1 threads" in summary and "torch 9.9" in summary
                and "faster than attnlab's exact here" in summary,
                f"{name}: the summary names the peer where it quotes speed-ups")
        fast = pts[pts.speedup_vs_exact > 1.3]  # a method beating even the 100× faster exact: none expected here
        rec = df[(df.metric == "recommended") & (df.value == 1)]
        c.check(rec.empty or not fast.empty, f"{name}: nothing recommended that does not beat the peer")
    elif ratio < 1:
        c.check("attnlab's exact (PyTorch SDPA takes 2.00× its time here)" in summary,
                f"{name}: the summary says attnlab's exact is the faster one")
    else:
        c.check("within the timing noise, equal" in summary and "over PyTorch SDPA" not in summary,
                f"{name}: a ratio within the noise leaves attnlab's exact the baseline, and says so")
for args, want in ((["--exact-peer", peer_file("other.csv", 2.0, device="Other CPU")], "this CPU is"),
                   (["--exact-peer", peer_file("t4.csv", 2.0, threads=4)], "no rows at 1 threads"),
                   (["--exact-peer", peer_file("n.csv", 2.0), "--cost-n", 8192], "no ratio at n = 8192"),
                   (["--exact-peer", peer_file("c.csv", 2.0), "--costs", costs_file("c2.csv", 0.1)], "own exact"),
                   (["--exact-peer", peer_file("dim.csv", 2.0, dim=64)], "no rows at the heads' dimension d = 16"),
                   (["--exact-peer", peer_file("k.csv", 2.0, build_kernels="products=x isa=y")],
                    "this command's kernels"),
                   (["--exact-peer", peer_file("causal.csv", 2.0), "--causal"], "non-causal")):
    r = run("report", "--q", path("rq.npy"), "--k", path("rk.npy"), "--v", path("rv.npy"), "--out", path("bad"),
            "--threads", 1, *(args if "--cost-n" in args else args + ["--cost-n", 512]))
    c.check(r.returncode != 0 and want in r.stderr, f"--exact-peer refused ({want}): {r.stderr.strip()[-200:]}")
c.finish()
