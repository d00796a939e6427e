#!/usr/bin/env python3
"""Compare every non-timing value of two results directories: are they the same results?

    tools/compare_results.py DIR_A DIR_B

For each tidy CSV (.csv.gz or .csv) in DIR_A, the same file in DIR_B must hold the same rows (every identifying
column but the code version) with the same value text, for every metric that is not a time, speed-up or memory
figure (those vary between runs and machines). Exit 1 on any difference. Needs pandas (Debian's python3-pandas).
"""
import os
import sys

import pandas as pd

if len(sys.argv) != 3:
    sys.exit(__doc__)
a, b = sys.argv[1], sys.argv[2]


def timing(metric):
    return any(w in metric for w in ("time", "speedup", "memory"))


bad = 0
for f in sorted(os.listdir(a)):
    if not (f.endswith(".csv.gz") or f.endswith(".csv")) or f == "timings.csv":   # timings.csv: wall-clock only
        continue
    if not os.path.exists(os.path.join(b, f)):
        print(f"{f}: missing in {b}")
        bad += 1
        continue
    x = pd.read_csv(os.path.join(a, f), keep_default_na=False, dtype=str)
    y = pd.read_csv(os.path.join(b, f), keep_default_na=False, dtype=str)
    tidy = "metric" in x.columns
    if tidy:
        keys = [c for c in x.columns if c not in ("code_version", "value")]
        x = x[~x.metric.map(timing)].set_index(keys)["value"].sort_index()
        y = y[~y.metric.map(timing)].set_index(keys)["value"].sort_index()
        same = x.index.equals(y.index) and (x.values == y.values).all()
        n = len(x)
    else:   # compare: wide table; drop timing columns
        cols = [c for c in x.columns if "time" not in c and c != "code_version"]
        same = x[cols].equals(y[cols]); n = x[cols].size
    print(f"{f}: {n} non-timing values, {'identical' if same else 'DIFFERENT'}")
    if not same:
        bad += 1
        if tidy:
            j = pd.concat({"a": x, "b": y}, axis=1)
            print(j[j.a != j.b].head(5))
sys.exit(1 if bad else 0)
