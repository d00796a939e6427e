#!/usr/bin/env python3
"""tools/bench_exact_peer.py (issue "Costs on the machine the user runs", item 5): the table's ratios and its fastest
exact attention follow from the rows; a Python whose torch has no scaled_dot_product_attention (Debian's 1.13), a
missing --torch-python, a bad --build and more threads than cores are refused with a message and a non-zero exit
before anything is timed; with ATTNLAB_TORCH2_PYTHON set (a current PyTorch, outside CI) a real run at a small n.

    ATTNLAB_BIN=build/bin/attnlab /usr/bin/python3 tests/scripts/test_bench_exact_peer.py
"""
import csv
import os
import subprocess
import sys
import tempfile

from checks import ROOT, Checks, import_tools

import_tools()
import bench_exact_peer as bep  # noqa: E402

c = Checks()
tool = os.path.join(ROOT, "tools", "bench_exact_peer.py")
# The table from rows written by hand: two builds, PyTorch in both formats, at one length and two thread counts.
rows = []
for t, default, native, peer in ((1, 0.050, 0.040, 0.045), (2, 0.024, 0.030, 0.025)):
    rows += [{"impl": "attnlab", "build": "default", "dtype": "fp32", "n": 4096, "d": 64, "threads": t,
              "time_s": default, "device": "CPU X", "detail": "attnlab default: isa=AVX2"},
             {"impl": "attnlab", "build": "native", "dtype": "fp32", "n": 4096, "d": 64, "threads": t,
              "time_s": native,
              "device": "CPU X", "detail": "attnlab native: isa=AVX512"},
             {"impl": bep.PEER, "build": "", "dtype": "fp32", "n": 4096, "d": 64, "threads": t, "time_s": peer,
              "device": "CPU X", "detail": "torch 2.x"},
             {"impl": bep.PEER, "build": "", "dtype": "bf16", "n": 4096, "d": 64, "threads": t, "time_s": peer / 2,
              "device": "CPU X", "detail": "torch 2.x"}]
md, summary = bep.table(rows)
c.check("measured on CPU X" in md, "the table names the device")
one = {s["threads"]: s for s in summary}
c.check(set(one) == {1, 2}, f"one summary per thread count ({sorted(one)})")
c.check(abs(one[1]["ratios"]["default"] - 0.050 / 0.045) < 1e-12, "the ratio is attnlab's time over PyTorch's")
c.check(one[1]["fastest"] == "attnlab native" and one[2]["fastest"] == "attnlab default",
        f"the fastest float32 exact per thread count ({one[1]['fastest']}, {one[2]['fastest']})")
c.check(all("bf16" not in s["fastest"] for s in summary), "bfloat16 is said, not the float32 baseline")
line = [x for x in md.splitlines() if x.startswith("| 64 | 4096 | 1 |")]
c.check(len(line) == 1 and "| 1.11 | 0.89 |" in line[0], f"the row's ratios ({line})")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "exact_peer.csv")
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=bep.FIELDS)
        w.writeheader()
        w.writerows(rows)
    r = subprocess.run([sys.executable, tool, "--table-only", "--out", out], capture_output=True, text=True,
                       timeout=60)
    c.check(r.returncode == 0 and open(os.path.join(tmp, "exact_peer.md")).read() == md,
            f"--table-only redraws the same table from the CSV ({r.stderr.strip()[-200:]})")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    refusals = [([], "--torch-python"),
                (["--torch-python", "/usr/bin/python3", "--build", "x=/nonexistent"], "LABEL=BIN"),
                (["--torch-python", "/usr/bin/python3", "--threads", f"1,{cores + 1}"], "cores"),
                (["--torch-python", "/usr/bin/python3", "--dtypes", "bf16"], "fp32")]
    # Debian's torch 1.13 (or none) has no scaled_dot_product_attention: refused before attnlab is timed.
    probe = subprocess.run(["/usr/bin/python3", "-c", "import torch.nn.functional as F; "
                            "print(hasattr(F, 'scaled_dot_product_attention'))"], capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        refusals.append((["--torch-python", "/usr/bin/python3", "--n", "64"], "scaled_dot_product_attention"
                         if probe.returncode == 0 else "no torch"))
    for args, want in refusals:
        r = subprocess.run([sys.executable, tool, *args, "--out", os.path.join(tmp, "r.csv")], capture_output=True,
                           text=True, timeout=120)
        c.check(r.returncode != 0 and want in r.stderr and "scaling" not in r.stdout + r.stderr,
                f"{args} refused before timing ({r.returncode}: {r.stderr.strip()[-200:]})")
    torch2 = os.environ.get("ATTNLAB_TORCH2_PYTHON")
    if torch2 and cores >= 2:
        r = subprocess.run([sys.executable, tool, "--torch-python", torch2, "--n", "256", "--d", "16", "--threads",
                            "1,2", "--repeats", "1", "--out", out], capture_output=True, text=True, timeout=600)
        c.check(r.returncode == 0, f"a real run ({r.stderr.strip()[-300:]})")
        got = list(csv.DictReader(open(out))) if r.returncode == 0 else []
        c.check(len(got) == 2 + 2 * 2, f"attnlab and PyTorch fp32 + bf16 at both thread counts ({len(got)} rows)")
        c.check({x["d"] for x in got} == {"16"}, "every row at the head dimension asked for")
        c.check(all(x["device"] for x in got), "every row names the device")
    else:
        print("skipped the real run: set ATTNLAB_TORCH2_PYTHON to a Python with torch >= 2")
c.finish()
