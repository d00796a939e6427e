#!/usr/bin/env python3
"""Merge the CSVs of a sharded sweep (`attnlab run NAME --shard i/N --out part_i.csv`) into one.

    tools/merge_shards.py OUT.csv part_0.csv part_1.csv ...

Every input must carry the same header (schema); only finished points (those with a point_done row) are kept,
each once. Standard library only, so it runs with any python3.
"""
import csv
import sys


def main(out, parts):
    header, rows, seen = None, [], set()
    for part in parts:
        with open(part, newline="") as f:
            reader = csv.reader(f)
            h = next(reader, None)
            if h is None:
                continue
            if header is None:
                header = h
            elif h != header:
                sys.exit(f"{part}: header differs from {parts[0]}'s")
            point, metric = header.index("point"), header.index("metric")
            body = list(reader)
            done = {r[point] for r in body if len(r) == len(header) and r[metric] == "point_done"}
            fresh = done - seen
            rows += [r for r in body if len(r) == len(header) and r[point] in fresh]
            seen |= fresh
    if header is None:
        sys.exit("no input rows")
    with open(out, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    print(f"{out}: {len(seen)} points from {len(parts)} shards")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
