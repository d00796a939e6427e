"""What every figure shares: reading a tidy CSV, the panel grid, and finish() — caption, layout and a compact,
deterministic PNG. The figure families are the other modules of this package; tools/plot.py draws them."""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.get_cmap("tab20").colors)  # > 10 methods per panel

SCHEMA_VERSION = 1


def csv_path(results, name):
    """results/NAME.csv.gz (the default, compact) or results/NAME.csv; None when neither exists."""
    for ext in (".csv.gz", ".csv"):
        p = os.path.join(results, name + ext)
        if os.path.exists(p):
            return p
    return None


def load(results, name):
    path = csv_path(results, name)
    if path is None:
        sys.exit(f"no {name}.csv.gz or {name}.csv in {results}")
    df = pd.read_csv(path, keep_default_na=False)
    versions = set(df["schema_version"])
    if versions != {SCHEMA_VERSION}:
        sys.exit(f"{path}: schema version {versions}, this script reads {SCHEMA_VERSION}")
    df = df[df["metric"] != "point_done"].copy()
    df["value"] = pd.to_numeric(df["value"], errors="raise")
    df["step"] = pd.to_numeric(df["step"], errors="coerce")  # empty: no step
    for col in ("n", "d", "seed"):  # numbers, not strings (matplotlib would make them categories)
        df[col] = pd.to_numeric(df[col], errors="coerce")
    # "trained/L1H2", "files/head0" -> "trained", "files": the panels aggregate heads (median) by family
    df["family"] = df["source"].str.split("/").str[0]
    return df


def is_head(variant):
    """Model-source spectra name heads "L{layer}H{head}" in the variant column."""
    return isinstance(variant, str) and len(variant) >= 4 and variant[0] == "L" and "H" in variant


def head_of(variant):
    """"L{layer}H{head}" -> (layer, head)."""
    layer, head = variant[1:].split("H")
    return int(layer), int(head)


def panels(k, width=5, height=4):
    """k panels, at most 3 to a row; unused cells hidden. Returns (fig, list of k axes)."""
    cols = min(k, 3)
    rows = (k + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.3), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[k:]:
        ax.set_visible(False)
    return fig, flat[:k]


def caption(fig, text):
    fig.text(0.01, 0.005, text, fontsize=8, style="italic", ha="left", va="bottom")


def finish(fig, out, name, text, bottom=0.04):
    """Every figure ends the same way: its caption (the paper figure it redraws) along the bottom, the layout
    above it, the PNG saved (compact, deterministic) as OUT/NAME.png. Returns the path."""
    caption(fig, text)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return save(fig, out, name)


def save(fig, out, name):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    compact_png(path)
    return path


def compact_png(path):
    """Re-save as a 256-colour palette PNG: line plots need no more, and the committed figures shrink ~3x
    (results/ has a 5 MB budget). Deterministic: the same figure gives the same bytes."""
    try:
        from PIL import Image
    except ImportError:   # matplotlib's own dependency on Debian; without it the RGBA file stays
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


def lines_per_source(d, x, xlabel, ylabel, width=5, legend_size=6):
    """A panel per source, a log-log line per variant (mean over seeds) against column x; svd* in bold black."""
    sources = sorted(d["source"].unique())
    fig, axes = panels(len(sources), width, 4)
    for ax, src in zip(axes, sources):
        for variant, g in d[d.source == src].groupby("variant"):
            g = g.groupby(x)["value"].mean()
            style = dict(color="black", lw=2.5) if variant.startswith("svd") else {}
            ax.loglog(g.index, g.values, "-o", ms=3, label=variant, **style)
        ax.set(title=src, xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize=legend_size)
    return fig
