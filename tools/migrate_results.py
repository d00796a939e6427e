#!/usr/bin/env python3
"""Migrate tidy results CSVs from results schema 1 to schema 2 (docs/reproducing.md: "Results files").

    tools/migrate_results.py PATH...              # in place
    tools/migrate_results.py --out DIR PATH...    # converted copies (and their .config sidecars) in DIR

PATH is a results CSV (.csv or .csv.gz, as `attnlab run` and `attnlab compare --csv` write them) or a directory,
whose *.csv and *.csv.gz are taken. Schema 2 gives the model head, its layer, the held-out sequence and the compute
type their own columns (sequence, layer, head, dtype, after seed), where schema 1 packed them into others:

    source "trained/L1H2", seed 0       ->  source trained, sequence 0, layer 1, head 2 (seed 0 stays: the
                                            methods' seed, which is the sequence index)
    source "files/head3"                ->  source files, head 3
    regimes: variant "L1H2" / "head3"   ->  layer 1, head 2, sequence = seed / head 3; variant empty
    spectrum: variant "L1H2" / "head=3" ->  the same
    compare: variant "float32,causal",  ->  dtype float32, variant causal (empty without the mask), head 0,
             step 0                         step empty

Every other field keeps its text (values, point ids, code versions, row order); schema_version becomes 2. The
result is the bytes `attnlab run` writes for those rows (gzip level 9, no time stamp), so a migrated file resumes.
Files already at schema 2 are left alone; CSVs with other columns (dropin.csv.gz, report.csv, bench tables) are
skipped. Standard library only, so it runs with any python3; tools/compare_results.py imports it to compare a
schema-1 directory with a schema-2 one.
"""
import argparse
import csv
import gzip
import io
import os
import re
import shutil
import sys
import zlib

COLUMNS_V1 = ["schema_version", "code_version", "experiment", "point", "source", "method", "spec", "n", "d", "seed",
              "variant", "step", "metric", "value"]
COLUMNS_V2 = ["schema_version", "code_version", "experiment", "point", "source", "method", "spec", "n", "d", "seed",
              "sequence", "layer", "head", "dtype", "variant", "step", "metric", "value"]
VERSION = "2"

_MODEL_SOURCE = re.compile(r"^(.+)/L(\d+)H(\d+)$")   # "trained/L1H2" (error_vs_budget, pinv, probsparse, vq)
_FILES_SOURCE = re.compile(r"^files/head(\d+)$")     # "files/head3"
_HEAD_VARIANT = re.compile(r"^L(\d+)H(\d+)$")        # regimes, spectrum: variant "L1H2"
_FILES_VARIANT = {"regimes": re.compile(r"^head(\d+)$"), "spectrum": re.compile(r"^head=(\d+)$")}


def migrate_row(r):
    """One schema-1 row (a dict by COLUMNS_V1) as a schema-2 row (a dict by COLUMNS_V2)."""
    out = dict(r, schema_version=VERSION, sequence="", layer="", head="", dtype="")
    experiment, source, variant = r["experiment"], r["source"], r["variant"]
    if r["metric"] == "point_done":
        return out
    m = _MODEL_SOURCE.match(source)
    if m:
        out.update(source=m[1], layer=m[2], head=m[3], sequence=r["seed"])
        return out
    m = _FILES_SOURCE.match(source)
    if m:
        out.update(source="files", head=m[1])
        return out
    if experiment in ("regimes", "spectrum"):
        m = _HEAD_VARIANT.match(variant)
        if m:
            out.update(layer=m[1], head=m[2], sequence=r["seed"], variant="")
            return out
        m = _FILES_VARIANT[experiment].match(variant)
        if m and source == "files":
            out.update(head=m[1], variant="")
            return out
    if experiment == "compare":
        dtype, _, rest = variant.partition(",")
        if rest not in ("", "causal"):
            raise ValueError(f"compare row with variant '{variant}' (expected DTYPE or DTYPE,causal)")
        out.update(dtype=dtype, variant=rest, head=r["step"], step="")
    return out


def read_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    return (gzip.decompress(raw) if path.endswith(".gz") else raw).decode("utf-8")


def write_text(path, text):
    """Atomically, gzip-compressed when the name ends in .gz: the bytes attnlab's write_text_file gives (zlib level 9,
    no time stamp), so that the same rows give the same file."""
    data = text.encode("utf-8")
    if path.endswith(".gz"):
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        data = z.compress(data) + z.flush()
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def header_of(path):
    text = read_text(path)
    return next(csv.reader(io.StringIO(text[:text.find("\n")] if "\n" in text else text)), [])


def migrate_text(text, name="<text>"):
    """A schema-1 file's text as schema 2's text; (text, rows, dropped lines). Raises ValueError when the text is not a
    schema-1 results CSV. Lines that are not whole rows (a torn last line of an interrupted run) are dropped, as a
    resumed run would."""
    lines = text.split("\n")
    header = next(csv.reader([lines[0]]), [])
    if header != COLUMNS_V1:
        raise ValueError(f"{name}: not a results schema 1 CSV (header {','.join(header)})")
    body = lines[1:]
    torn = body.pop() if body else ""   # after the last newline: empty unless the last line is torn
    out = io.StringIO()
    w = csv.DictWriter(out, COLUMNS_V2, lineterminator="\n")
    w.writeheader()
    n, dropped = 0, 1 if torn else 0
    for fields in csv.reader(body):
        if len(fields) != len(COLUMNS_V1):
            dropped += 1
            continue
        r = dict(zip(COLUMNS_V1, fields))
        if r["schema_version"] != "1":
            raise ValueError(f"{name}: a row of schema version {r['schema_version']} under schema 1's header")
        w.writerow(migrate_row(r))
        n += 1
    return out.getvalue(), n, dropped


def migrate_file(path, out_path=None):
    """Migrates one file (to out_path, default in place); returns a line saying what was done."""
    header = header_of(path)
    target = out_path or path
    if header == COLUMNS_V2:
        if out_path:
            shutil.copyfile(path, out_path)
            if os.path.exists(path + ".config"):
                shutil.copyfile(path + ".config", out_path + ".config")
        return f"{path}: already schema {VERSION}" + (f", copied to {out_path}" if out_path else "")
    if header != COLUMNS_V1:
        return f"{path}: skipped (not a results-schema CSV: its own columns)"
    text, n, dropped = migrate_text(read_text(path), path)
    write_text(target, text)
    if out_path and os.path.exists(path + ".config"):
        shutil.copyfile(path + ".config", out_path + ".config")
    note = f", {dropped} malformed line(s) dropped" if dropped else ""
    return f"{path}: {n} rows migrated to schema {VERSION}" + (f" in {target}" if out_path else "") + note


def results_files(path):
    if os.path.isdir(path):
        return [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith((".csv", ".csv.gz"))]
    return [path]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="results CSVs or directories of them")
    p.add_argument("--out", metavar="DIR", help="write the migrated copies here (default: in place)")
    a = p.parse_args(argv)
    files = [f for path in a.paths for f in results_files(path)]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        sys.exit(f"migrate_results: no such file: {', '.join(missing)}")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        names = [os.path.basename(f) for f in files]
        if len(set(names)) != len(names):
            sys.exit("migrate_results: --out DIR takes files of distinct names")
    for f in files:
        try:
            print(migrate_file(f, os.path.join(a.out, os.path.basename(f)) if a.out else None))
        except ValueError as e:
            sys.exit(f"migrate_results: {e}")


if __name__ == "__main__":
    main()
