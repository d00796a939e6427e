#!/usr/bin/env python3
"""Merge the CSVs of a sharded sweep (`attnlab run NAME --shard i/N --out part_i.csv`) into one.

    tools/merge_shards.py OUT.csv[.gz] part_0.csv[.gz] part_1.csv[.gz] ...

Every input must carry the same header (schema; tools/migrate_results.py brings schema-1 files to schema 2); only
finished points (those with a point_done row) are kept, each once. Files ending in .gz are read and written
gzip-compressed. Standard library only, so it runs with any python3.
"""
import csv
import gzip
import sys


def open_text(name, mode):
    if name.endswith(".gz"):
        return gzip.open(name, mode + "t", newline="", **({"compresslevel": 9} if mode == "w" else {}))
    return open(name, mode, newline="")


def main(out, parts):
    header, rows, seen = None, [], set()
    for part in parts:
        with open_text(part, "r") as f:
            reader = csv.reader(f)
            h = next(reader, None)
            if h is None:
                continue
            if header is None:
                header = h
            elif h != header:
                old = [p for p, x in ((part, h), (parts[0], header))
                       if x[:1] == ["schema_version"] and "sequence" not in x]
                hint = f"; {old[0]} is of results schema 1: tools/migrate_results.py migrates it" if old else ""
                sys.exit(f"{part}: header differs from {parts[0]}'s{hint}")
            point, metric = header.index("point"), header.index("metric")
            body = list(reader)
            done = {r[point] for r in body if len(r) == len(header) and r[metric] == "point_done"}
            fresh = done - seen
            rows += [r for r in body if len(r) == len(header) and r[point] in fresh]
            seen |= fresh
    if header is None:
        sys.exit("no input rows")
    with open_text(out, "w") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    print(f"{out}: {len(seen)} points from {len(parts)} shards")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
