"""Resumable wide tables for the Python experiments on the trained models (tools/dropin.py, tools/finetune.py).

A run appends each finished unit's rows to OUT.partial (one write, flushed to disk, before the next unit starts);
the partial's first line names the settings and code it was written with, so a rerun with the same ones continues
where the last stopped and any other starts afresh. The finished table is written sorted and gzip'ed with a zero
time stamp (the same rows give the same bytes), beside OUT.config (the settings as JSON), and the partial removed.
"""
import csv
import gzip
import hashlib
import io
import json
import os
import sys
import time


def fmt(v):
    """A cell: floats to 10 significant digits (repr of the rounded value), empty for None or ''."""
    if v == "" or v is None:
        return ""
    if isinstance(v, float):
        return repr(float(f"{v:.10g}"))
    return str(v)


def settings_key(config, files):
    """config with "code" (a hash of the files that compute the rows, this one included) and the key of both."""
    code = hashlib.sha256()
    for f in list(files) + [os.path.abspath(__file__)]:
        code.update(open(f, "rb").read())
    config = dict(config, code=code.hexdigest()[:16])
    return config, hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


class Partial:
    """OUT.partial of a run: `rows` (formatted dicts) and `done` (unit keys) are what an earlier run with the same
    key finished; complete(rows) -> (rows, done) keeps the units finished whole (a unit torn by an interrupt, or a
    malformed line, is computed again). The file is rewritten with those rows only."""

    def __init__(self, out, prog, key, columns, complete):
        self.path, self.columns = out + ".partial", columns
        self.rows, self.done = [], set()
        if os.path.exists(self.path):
            with open(self.path, newline="") as f:
                if f.readline().strip() == f"# {prog} {key}":
                    self.rows, self.done = complete(list(csv.DictReader(f)))
                    print(f"{prog}: resuming {self.path} ({len(self.done)} units done)", file=sys.stderr)
                else:
                    print(f"{prog}: {self.path} was written with other settings or code; starting afresh",
                          file=sys.stderr)
        with open(self.path, "w", newline="") as f:
            f.write(f"# {prog} {key}\n")
            w = csv.writer(f)
            w.writerow(columns)
            w.writerows([[r[c] for c in columns] for r in self.rows])

    def append(self, new):
        """A unit's rows (dicts, missing columns empty), formatted, on disk in one write before the next unit."""
        formatted = [{c: fmt(r.get(c, "")) for c in self.columns} for r in new]
        buf = io.StringIO()
        csv.writer(buf).writerows([[r[c] for c in self.columns] for r in formatted])
        with open(self.path, "a", newline="") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())
        self.rows += formatted

    def finish(self, out, config, prog, t_start):
        """The table (self.rows, sorted by the caller) as OUT, atomically; OUT.config; the partial removed; a line on
        stdout saying so."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, self.columns, lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows)
        with gzip.GzipFile(out + ".tmp", "wb", mtime=0) as f:
            f.write(buf.getvalue().encode())
        os.replace(out + ".tmp", out)
        with open(out + ".config", "w") as f:
            json.dump(config, f, indent=1)
            f.write("\n")
        os.remove(self.path)
        print(f"{prog}: wrote {out} ({len(self.rows)} rows) in {time.time() - t_start:.0f} s")


def _call(job):
    work, task = job
    return task, work(task)


def _start_worker(init, initargs):
    """A worker ignores Ctrl-C: the main process takes it and stops the pool (one message, not one per worker)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if init:
        init(*initargs)


def pool(tasks, work, jobs, init=None, initargs=()):
    """(task, work(task)) for every task, as each finishes: in this process when jobs is 1 (init(*initargs) first),
    else on `jobs` worker processes, each started by init(*initargs) and given one task at a time (the next free
    worker takes the next task). work and init must be module-level functions; a worker keeps what init and work
    cache between its tasks. The workers are spawned, not forked: torch's and OpenMP's thread pools do not survive a
    fork. A worker's exception is raised here; an interrupt stops the workers (what the caller wrote is kept)."""
    tasks = list(tasks)
    if jobs <= 1 or len(tasks) <= 1:
        if init:
            init(*initargs)
        for t in tasks:
            yield t, work(t)
        return
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(min(jobs, len(tasks)), _start_worker, (init, initargs)) as p:
        yield from p.imap_unordered(_call, [(work, t) for t in tasks], chunksize=1)


def command(main, prog):
    """Runs main(argv) as the command, exiting with its code; an interrupt says what is kept."""
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(f"{prog}: interrupted; the finished units are kept in the .partial file and a rerun continues there")
