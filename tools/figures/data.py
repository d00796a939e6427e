"""The tidy CSVs as frames, and the fits that a figure and a quoted number share; no matplotlib, so that
tools/findings.py reads the results without a plotting library. The figures (common.py and the family modules) and
tools/findings.py import from here."""
import json
import os
import sys

import numpy as np
import pandas as pd

SCHEMA_VERSION = 2
# A model head's columns (results schema 2; docs/reproducing.md: "Results files"): empty (NaN here) for generated
# sources.
HEAD = ["sequence", "layer", "head"]


def csv_path(results, name):
    """results/NAME.csv.gz (the default, compact) or results/NAME.csv; None when neither exists."""
    for ext in (".csv.gz", ".csv"):
        p = os.path.join(results, name + ext)
        if os.path.exists(p):
            return p
    return None


def cost_device(results, name):
    """Where an experiment's costs were measured, from its .config ("# costs measured on:" and "with:" lines, written
    by `attnlab run`): "this CPU (AMD EPYC 9B14; threads=2 products=... isa=...)", or "this CPU" for an older
    .config without them. Every figure that draws a cost says it (issue "Costs on the machine the user runs")."""
    path = csv_path(results, name)
    on, with_ = "", ""
    try:
        for line in open(path + ".config"):
            if line.startswith("# costs measured on:"):
                on = line.split(":", 1)[1].strip()
            elif line.startswith("# costs measured with:"):
                with_ = line.split(":", 1)[1].strip()
    except (OSError, TypeError):
        pass
    inner = "; ".join(x for x in (on, with_) if x)
    return f"this CPU ({inner})" if inner else "this CPU"


def load(results, name):
    """An experiment's tidy CSV: schema checked, point_done rows dropped, value numeric; n, d, seed, sequence, layer,
    head and step numeric (NaN: none). The source is the source's name alone (trained, not trained/L1H2): the panels
    aggregate a model's heads (median) by source."""
    path = csv_path(results, name)
    if path is None:
        sys.exit(f"no {name}.csv.gz or {name}.csv in {results}")
    df = pd.read_csv(path, keep_default_na=False)
    versions = set(df["schema_version"])
    if versions == {1}:
        sys.exit(f"{path}: results schema 1 (model heads packed into source, seed and variant); this script reads "
                 f"schema {SCHEMA_VERSION}: migrate it with `python3 tools/migrate_results.py {path}` (same values, "
                 "new columns)")
    if versions != {SCHEMA_VERSION}:
        sys.exit(f"{path}: schema version {versions}, this script reads {SCHEMA_VERSION}")
    df = df[df["metric"] != "point_done"].copy()
    df["value"] = pd.to_numeric(df["value"], errors="raise")
    # Numbers, not strings (matplotlib would make them categories); empty: NaN (no step, not a model head).
    for col in ("n", "d", "seed", "step", *HEAD):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def is_model_head(d):
    """Rows of a model's head (trained, initialized, trained_causal: a layer and a head; the user's files have heads but
    no layers)."""
    return d["layer"].notna()


def head_name(d):
    """Each row's source and head as one name, for a figure that draws each head apart: "trained/L1H2" (a model
    head), "files/head0" (the user's files), else the source."""
    layer, head = (d[c].fillna(-1).astype(int).astype(str) for c in ("layer", "head"))
    model, files = is_model_head(d), d["head"].notna() & ~is_model_head(d)
    return d["source"].mask(model, d["source"] + "/L" + layer + "H" + head).mask(files, d["source"] + "/head" + head)


def n_heads(d):
    """How many distinct (layer, head) pairs the rows hold (a head counts once over its held-out sequences); 1 for a
    generated source."""
    return len(d[["layer", "head"]].drop_duplicates())


def upper_half_slope(x, y):
    """The log-log slope over the upper half of the lengths (at least the two largest), and that range's start. The
    scaling figure's legend and the findings quote the same fit."""
    ok = np.isfinite(y) & (y > 0)
    x, y = x[ok], y[ok]
    if len(x) < 2:
        return float("nan"), None
    k = min(len(x) - 2, len(x) // 2)
    return np.polyfit(np.log(x[k:]), np.log(y[k:]), 1)[0], x[k]


# The fine-tuning experiment's text columns (tools/finetune.py); every other column is a number.
FINETUNE_TEXT = ["code_version", "model", "objective", "family", "spec", "status", "window_loss_sums"]


def load_finetune(results):
    """results/finetune.csv.gz (tools/finetune.py) with its numeric columns as numbers (empty: NaN); None without
    one."""
    path = os.path.join(results, "finetune.csv.gz")
    if not os.path.exists(path):
        return None
    return numeric_csv(path, FINETUNE_TEXT)


def numeric_csv(path, text):
    """A CSV with every column but those in `text` as numbers (empty cells: NaN)."""
    df = pd.read_csv(path, keep_default_na=False)
    for c in df.columns:
        if c not in text:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


PRETRAINED_TEXT = {"model", "scope", "family", "spec", "arm", "status"}


def load_pretrained(results, name):
    """results/pretrained_NAME.csv.gz (or .csv) with its numeric columns as numbers; None without one."""
    for ext in (".csv.gz", ".csv"):
        path = os.path.join(results, f"pretrained_{name}{ext}")
        if os.path.exists(path):
            return numeric_csv(path, PRETRAINED_TEXT)
    return None


def timed_on(results):
    """How the run's step times were taken (its .config: torch's threads, the processes side by side)."""
    try:
        cfg = json.load(open(os.path.join(results, "finetune.csv.gz.config")))
    except (OSError, ValueError):
        return "threads not recorded"
    threads, jobs = cfg.get("torch_threads"), cfg.get("jobs", 1)
    what = f"{threads} thread{'s' if threads != 1 else ''} a process"
    return what + (f", {jobs} processes training side by side" if jobs > 1 else ", one process alone")
