#!/usr/bin/env python3
"""tools/bench_threads.py (issue "Costs on the machine the user runs", item 4) at a small length: the scaling runs at
1 and 2 threads become tidy rows (every method at both counts, the device named) and a table whose speed-up,
efficiency and Amdahl columns follow from its times; Amdahl's extrapolation at its limits; more threads than cores,
a single count and bad counts refused with a message and a non-zero exit.

    ATTNLAB_BIN=build/bin/attnlab /usr/bin/python3 tests/scripts/test_bench_threads.py
"""
import csv
import os
import subprocess
import sys
import tempfile

from checks import ROOT, Checks, import_tools

import_tools()
import bench_threads  # noqa: E402

c = Checks()
tool = os.path.join(ROOT, "tools", "bench_threads.py")
# Amdahl's law at its limits: a perfect doubling extrapolates to 16×, no gain stays at 1×.
c.check(abs(bench_threads.amdahl(2.0, 2) - 16) < 1e-9, "a perfect 2-thread speed-up extrapolates to 16×")
c.check(abs(bench_threads.amdahl(1.0, 2) - 1) < 1e-9, "no 2-thread gain extrapolates to 1×")
c.check(bench_threads.amdahl(1.5, 1) is None, "nothing to extrapolate from one thread")
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
if cores < 2:
    print("skipped the runs: one core")
    c.finish()
with tempfile.TemporaryDirectory() as tmp:
    out, md = os.path.join(tmp, "threads.csv"), os.path.join(tmp, "threads.md")
    methods = ["exact", "linear", "probsparse"]
    r = subprocess.run([sys.executable, tool, "--n", "512", "--threads", "1,2", "--repeats", "1", "--methods",
                        *methods, "--out", out, "--md", md], capture_output=True, text=True, timeout=600)
    c.check(r.returncode == 0, f"tools/bench_threads.py runs: {r.stderr[-400:]}")
    rows = list(csv.DictReader(open(out))) if r.returncode == 0 else []
    c.check(len(rows) == 2 * len(methods), f"one row per method and thread count ({len(rows)})")
    c.check(all(x["device"] for x in rows), "every row names the device")
    c.check({x["threads"] for x in rows} == {"1", "2"}, "both thread counts")
    text = open(md).read() if r.returncode == 0 else ""
    c.check("measured on" in text and "extrapolation" in text, "the table says where it was measured and what "
            "Amdahl's column is")
    t = {(x["method"], x["threads"]): float(x["time_s"]) for x in rows}
    for m in methods:
        line = [ln for ln in text.splitlines() if ln.startswith(f"| {m}")]
        c.check(len(line) == 1, f"{m}: one table row")
        if len(line) == 1 and (m, "1") in t and (m, "2") in t:
            cells = [x.strip() for x in line[0].strip("|").split("|")]
            s = t[(m, "1")] / t[(m, "2")]
            c.check(cells[4] == f"{s:.2f}×", f"{m}: speed-up {cells[4]} is the times' ratio {s:.2f}")
            c.check(cells[5] == f"{s / 2:.0%}", f"{m}: efficiency {cells[5]} is the speed-up over 2 threads")
    for args, want in ((["--threads", f"1,{cores + 1}"], "cores"), (["--threads", "2"], "two"),
                       (["--threads", "1,x"], "integers")):
        r = subprocess.run([sys.executable, tool, *args, "--out", out, "--md", md], capture_output=True, text=True,
                           timeout=60)
        c.check(r.returncode != 0 and want in r.stderr, f"{args} refused ({r.returncode}: {r.stderr.strip()[-200:]})")
c.finish()
