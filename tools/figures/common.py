"""What every figure shares: colours and labels per method family, the panel grid, log axes, and finish() —
caption, layout and a compact, deterministic PNG. Reading the tidy CSVs is data.py's (no matplotlib there). The figure
families are the other modules of this package; tools/plot.py draws them."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .data import head_name  # noqa: E402

# tab10 (ten distinct hues) rather than tab20's light/dark pairs, which made neighbouring series look alike; figures
# keep to a few series per panel and colour methods by FAMILY_COLOURS. Fonts large enough to read in a README.
plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.get_cmap("tab10").colors)
plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
                     "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.framealpha": 0.9})

# One colour per method family, the same in every figure; the references (the SVD floor, exact attention) are black.
# Families that share a panel get clearly different hues; grey is kept for reference lines.
FAMILY_COLOURS = {
    "svd": "black", "exact": "black", "exact_materialized": "#555555",
    "nystrom": "#1f77b4", "nystrom_svd": "#17becf", "cur": "#bcbd22",
    "linformer_pool": "#ff7f0e", "linformer_gaussian": "#8c564b", "performer": "#d62728",
    "vq": "#9467bd", "probsparse": "#e377c2", "linear": "#008b8b",
    "local": "#2ca02c", "reformer": "#1f3a93", "scatterbrain": "#d4a017",
}
FAMILY_LABELS = {
    "svd": "SVD, rank R (floor)", "exact": "exact (streaming)", "exact_materialized": "exact (materialized P)",
    "nystrom": "Nyström", "nystrom_svd": "Nyström, SVD pinv", "cur": "CUR", "linformer_pool": "Linformer, pooling",
    "linformer_gaussian": "Linformer, Gaussian", "performer": "Performer", "vq": "VQ", "probsparse": "ProbSparse",
    "linear": "linear (elu)", "local": "local window", "reformer": "Reformer", "scatterbrain": "Scatterbrain",
}
# Markers differ between the families of one panel, so that coinciding lines (local and Scatterbrain on sharp
# heads) both stay visible.
FAMILY_MARKERS = {"svd": "o", "exact": "o", "exact_materialized": "s", "nystrom": "o", "nystrom_svd": "s", "cur": "D",
                  "linformer_pool": "o", "linformer_gaussian": "s", "performer": "^", "vq": "o", "probsparse": "s",
                  "linear": "D", "local": "o", "reformer": "s", "scatterbrain": "^"}
_SPARE = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354"]
_spare_used = {}
SOURCE_COLOURS = {"clustered": "#1f77b4", "gaussian": "#ff7f0e", "lowrank": "#2ca02c", "initialized": "#7f7f7f",
                  "trained": "#d62728", "files": "#9467bd"}


def family_key(spec):
    """A method spec or variant ('linformer:k=128', 'nystrom:pinv=svd', 'exact:impl=materialized', 'nystrom') ->
    its family's key in FAMILY_COLOURS; unknown names are their own family."""
    name, _, opts = str(spec).partition(":")
    if name == "linformer":
        return "linformer_pool" if "projection=pool" in opts else "linformer_gaussian"
    if name == "nystrom" and "pinv=svd" in opts:
        return "nystrom_svd"
    if name == "exact" and "impl=materialized" in opts:
        return "exact_materialized"
    return name


def family_colour(key):
    """The family's colour; a family this module does not know gets a spare colour, the same for the whole run."""
    if key in FAMILY_COLOURS:
        return FAMILY_COLOURS[key]
    return _spare_used.setdefault(key, _SPARE[len(_spare_used) % len(_SPARE)])


def family_marker(key):
    return FAMILY_MARKERS.get(key, "o")


def family_label(key):
    return FAMILY_LABELS.get(key, key)


def source_colour(src):
    return SOURCE_COLOURS.get(src, family_colour("source:" + src))


def log_range(values, floor=1e-4, cap=10.0, margin=1.6):
    """The y range of a log axis that shows these values: their span with a margin, within [floor, cap] (the
    useful range of a relative error: below 1e-4 nothing is distinguished, above 10 a method has failed). Values
    outside are drawn at the edge by plot_clipped, never dropped."""
    import numpy as np
    v = np.asarray([x for x in values if x == x and x > 0 and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return floor, cap
    lo, hi = max(floor, v.min() / margin), min(cap, v.max() * margin)
    if hi <= lo * 1.5:   # every value beyond one edge: keep a decade or two of axis inside the range
        lo, hi = (hi / 100, hi) if v.min() >= cap else (lo, lo * 100)
    return lo, hi


def plot_clipped(ax, x, y, lo, hi, color, marker="o", ls="-", label=None, ms=4, **kw):
    """A line whose points outside [lo, hi] (a log axis's range; zero and negative values count as below) are drawn
    at the edge as ▲/▼ in the same colour, so that no point disappears. Returns the (x, y) of those points."""
    import numpy as np
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    above, below = y > hi, ~(y >= lo)
    yc = np.clip(np.where(y > 0, y, lo), lo, hi)
    ax.plot(x, yc, ls=ls, color=color, lw=kw.pop("lw", 1.5), label=label, zorder=kw.pop("zorder", 2), **kw)
    inside = ~(above | below)
    ax.plot(x[inside], yc[inside], ls="none", marker=marker, ms=ms, color=color, label="_nolegend_", zorder=3)
    if above.any():
        ax.plot(x[above], yc[above], ls="none", marker="^", ms=ms + 3, color=color, label="_nolegend_", clip_on=False,
                zorder=4)
    if below.any():
        ax.plot(x[below], yc[below], ls="none", marker="v", ms=ms + 3, color=color, label="_nolegend_", clip_on=False,
                zorder=4)
    return list(zip(x[above | below], y[above | below]))


def note_clipped(ax, outside, lo, hi):
    """A line in the panel naming how many points lie beyond the axis and how far."""
    import numpy as np
    ys = np.array([y for _, y in outside], dtype=float)
    parts = []
    if (ys > hi).any():
        parts.append(f"▲ {int((ys > hi).sum())} above {hi:.3g} (up to {ys[ys > hi].max():.0e})")
    if (~(ys >= lo)).any():
        low = ys[~(ys >= lo)]
        least = f" (down to {low[low > 0].min():.0e})" if (low > 0).any() else ""
        parts.append(f"▼ {len(low)} below {lo:.1g}{least}")
    if parts:   # above the panel, not over its data
        ax.set_title("; ".join(parts), loc="right", fontsize=7, pad=2)


def series_count(ax):
    """The data series of a panel: its labelled lines and collections (markers of one series and unlabelled
    reference lines do not count). The tests hold figures to a few."""
    labels = [a.get_label() for a in list(ax.get_lines()) + list(ax.collections)]
    return len({lab for lab in labels if lab and not lab.startswith("_")})


def plain_log_ticks(ax, axis="x"):
    """A log axis labelled 0.1, 0.2, 0.5, 1, 2, 5, ... in plain numbers (not only at the decades, as 10^k)."""
    from matplotlib.ticker import LogLocator, NullFormatter
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def tidy_log_axis(ax, axis="y"):
    """A log axis spanning less than two decades gets plain 1-2-5 labels (matplotlib would label one decade, or
    none). Call after the limits are final."""
    import math
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    if lo > 0 and hi > 0 and math.log10(hi / lo) < 2:
        plain_log_ticks(ax, axis)


def log_ticks(ax, values, axis="x"):
    """Ticks at the values themselves (n = 512, 1024, ...), plain numbers, no minor labels."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator
    vals = sorted({float(v) for v in values if v == v and v > 0})
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(FixedLocator(vals))
    a.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


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
    """The caption along the bottom, wrapped to the figure's width (a long one used to run off the right edge).
    Returns its height as a fraction of the figure's."""
    import textwrap
    width_in, height_in = fig.get_size_inches()
    lines = textwrap.wrap(text, width=max(40, int(width_in * 15.5)))   # ~15 italic 8-pt characters per inch
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=8, style="italic", ha="left", va="bottom")
    return (0.16 * len(lines) + 0.08) / height_in


def finish(fig, out, name, text, bottom=0.04, right=1.0):
    """Every figure ends the same way: its caption (the paper figure it redraws) along the bottom, the layout
    above it, the PNG saved (compact, deterministic) as OUT/NAME.png. Returns the path. right < 1 leaves room for a
    legend outside the panels."""
    used = caption(fig, text)
    fig.tight_layout(rect=(0, max(bottom, used), right, 1))
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


def lines_per_source(d, x, xlabel, ylabel, style=None, width=4.6, order=None):
    """A panel per source (a model's heads: per head), a log-log line per variant (mean over seeds) against column x,
    and one legend for all panels to their right (the same variants in each). style(variant) -> dict(color, marker,
    ls, lw, label); by default the variant's method family's colour and name, svd* in bold black. Returns (fig,
    right), right the fraction of the width the panels take (pass it to finish)."""
    d = d.assign(source=head_name(d))
    sources = sorted(d["source"].unique())
    variants = order or sorted(d["variant"].unique())
    style = style or family_style
    fig, axes = panels(len(sources), width, 3.8)
    for ax, src in zip(axes, sources):
        for variant in variants:
            g = d[(d.source == src) & (d.variant == variant)].groupby(x)["value"].mean()
            if g.empty:
                continue
            st = dict(marker="o", ms=4, ls="-", lw=1.5)
            st.update(style(variant))
            ax.loglog(g.index, g.values, **st)
        ax.set(title=src, xlabel=xlabel, ylabel=ylabel)
        log_ticks(ax, d[x].unique())
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:   # variants missing from the first panel
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    legend_in = 2.1   # inches for the legend, right of the panels
    total = fig.get_size_inches()[0] + legend_in
    fig.set_size_inches(total, fig.get_size_inches()[1])
    right = 1 - legend_in / total
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.005, 0.55), frameon=False)
    return fig, right


def family_style(variant):
    """A variant named by its method ('nystrom:landmarks', 'linformer:projection=pool,k', 'svd:rank'): its family's
    colour, marker and name."""
    key = family_key(variant)
    st = dict(color=family_colour(key), marker=family_marker(key), label=family_label(key))
    if key == "svd":
        st.update(lw=2.5, label="SVD (best rank R)")
    return st
