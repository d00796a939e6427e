#!/usr/bin/env python3
"""Compare every non-timing value of two results directories: are they the same results?

    tools/compare_results.py DIR_A DIR_B

For each tidy CSV (.csv.gz or .csv) in DIR_A, the same file in DIR_B must hold the same rows (every identifying
column but the code version) with the same value text, for every metric that is not a time, speed-up or memory
figure (those vary between runs and machines). A file of results schema 1 is migrated to schema 2 on the fly
(tools/migrate_results.py), so that a schema-1 directory compares with a schema-2 one: the same values under the new
columns. Exit 1 on any difference. Needs pandas (Debian's python3-pandas).
"""
import io
import os
import sys

import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import migrate_results  # noqa: E402

if len(sys.argv) != 3:
    sys.exit(__doc__)
a, b = sys.argv[1], sys.argv[2]


def timing(metric):
    return any(w in metric for w in ("time", "speedup", "memory"))


def read(path):
    """The file as text columns, and whether it was migrated from schema 1."""
    if migrate_results.header_of(path) == migrate_results.COLUMNS_V1:
        text, _, _ = migrate_results.migrate_text(migrate_results.read_text(path), path)
        return pd.read_csv(io.StringIO(text), keep_default_na=False, dtype=str), True
    return pd.read_csv(path, keep_default_na=False, dtype=str), False


bad = 0
for f in sorted(os.listdir(a)):
    if not (f.endswith(".csv.gz") or f.endswith(".csv")) or f == "timings.csv":   # timings.csv: wall-clock only
        continue
    if not os.path.exists(os.path.join(b, f)):
        print(f"{f}: missing in {b}")
        bad += 1
        continue
    (x, mx), (y, my) = read(os.path.join(a, f)), read(os.path.join(b, f))
    tidy = "metric" in x.columns
    if tidy:
        keys = [c for c in x.columns if c not in ("code_version", "value")]
        x = x[~x.metric.map(timing)].set_index(keys)["value"].sort_index()
        y = y[~y.metric.map(timing)].set_index(keys)["value"].sort_index()
        same = x.index.equals(y.index) and (x.values == y.values).all()
        n = len(x)
    else:   # a wide table (dropin.csv.gz): drop timing columns
        cols = [c for c in x.columns if "time" not in c and c != "code_version"]
        same = x[cols].equals(y[cols]); n = x[cols].size
    migrated = f" ({' and '.join(d for d, m in ((a, mx), (b, my)) if m)} migrated from schema 1)" if mx or my else ""
    print(f"{f}: {n} non-timing values, {'identical' if same else 'DIFFERENT'}{migrated}")
    if not same:
        bad += 1
        if tidy:
            j = pd.concat({"a": x, "b": y}, axis=1)
            print(j[j.a != j.b].head(5))
sys.exit(1 if bad else 0)
