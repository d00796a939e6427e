"""Time and peak memory against n, with log-log slopes fitted where the asymptotics show (the upper half of the
lengths). Two panels per quantity, a few methods each: exact attention with the kernel and low-rank methods, and
exact attention with the sparse and clustering ones."""
import numpy as np

from .common import family_colour, family_key, family_label, family_marker, finish, log_ticks, plt
from .data import cost_device, load, upper_half_slope

PAGE = 4096   # the memory measurement's resolution: one page; below it a value is not resolved
GROUPS = [("exact, kernel and low-rank methods", ["exact", "exact_materialized", "linear", "performer", "nystrom",
                                                   "linformer_gaussian", "linformer_pool"]),
          ("exact, sparse and clustering methods", ["exact", "local", "reformer", "probsparse", "vq"])]


def split(variants, spec_of):
    """[(title, [variant])] for the panels: each variant in the group of its family; exact (streaming) in both as
    the reference; families no group knows in the second (at most 6 series a panel: more start a third)."""
    known = {f for _, fams in GROUPS for f in fams}
    out = [(t, [v for v in variants if family_key(spec_of[v]) in fams]) for t, fams in GROUPS]
    rest = [v for v in variants if family_key(spec_of[v]) not in known]
    while rest:
        room = 6 - len(out[-1][1])
        if room > 0:
            out[-1][1].extend(rest[:room])
            rest = rest[room:]
        else:
            out.append(("other methods", [v for v in variants if family_key(spec_of[v]) == "exact"] + rest[:5]))
            rest = rest[5:]
    return [g for g in out if g[1]]


def plot_scaling(results, out):
    df = load(results, "scaling")
    spec_of = df.groupby("variant")["spec"].first().to_dict()
    order = list(dict.fromkeys(df["variant"]))   # the run's order
    metrics = set(df["metric"])

    def table(metric):
        return df[df.metric == metric].pivot_table(index="n", columns="variant", values="value", aggfunc="median")

    t = table("time_s")
    spread = table("time_max_s") if "time_max_s" in metrics else None
    m = table("peak_memory_bytes")
    refused = df[df.metric == "refused_memory"].groupby("variant")["n"].min().to_dict()
    groups = split([v for v in order if v in t.columns or v in m.columns], spec_of)
    ns = sorted(df["n"].dropna().unique())
    fig, axes = plt.subplots(2, len(groups), figsize=(6.2 * len(groups), 8.6), squeeze=False)
    starts = set()
    for c, (title, variants) in enumerate(groups):
        ax = axes[0][c]
        for v in variants:
            if v not in t.columns:
                continue
            key = family_key(spec_of[v])
            x, y = t.index.values.astype(float), t[v].values
            slope, start = upper_half_slope(x, y)
            if start is not None:
                starts.add(start)
            style = dict(color=family_colour(key), marker=family_marker(key), ms=4, lw=2 if key == "exact" else 1.5,
                         ls="--" if key == "exact_materialized" else "-")
            ok = np.isfinite(y)
            ax.plot(x[ok], y[ok] * 1e3, label=f"{display(v, key)}: slope {slope:.2f}", **style)
            if spread is not None and v in spread.columns:   # fastest to slowest of the repeats, as a bar
                hi = spread[v].reindex(t.index).values
                good = ok & np.isfinite(hi)
                ax.errorbar(x[good], y[good] * 1e3, yerr=[np.zeros(good.sum()), (hi[good] - y[good]) * 1e3],
                            fmt="none", ecolor=style["color"], elinewidth=1, capsize=3, alpha=0.8, label="_nolegend_")
        ax.set(xscale="log", yscale="log", title=title, xlabel="sequence length n",
               ylabel="time per call on this CPU, float32 (ms)")
        log_ticks(ax, ns)
        ax.legend(loc="upper left", fontsize=7.5)
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
        memory_panel(axes[1][c], m, variants, spec_of, ns, refused)
    start = f"n ≥ {int(min(starts))}" if starts else "the largest lengths"
    text = ("Nyströmformer Table 1 / Linformer Table 3 analogues (float32, d = 64, Gaussian inputs), measured on "
            f"{cost_device(results, 'scaling')} against attnlab's own exact attention — not a GPU's, nor another "
            "library's exact attention: time per call "
            f"after a warm-up (line: fastest of the repeats{'; bar: up to the slowest' if spread is not None else ''}"
            f") and peak memory against n. Slopes: log-log fits over the upper half of the lengths ({start}), where "
            "the asymptotics show. Memory: measured in a separate untimed call from the resident set (a lower bound, "
            "resolution one 4 KiB page); open markers at the bottom: below one page, not resolved.")
    return [finish(fig, out, "scaling", text)]


def display(variant, key):
    """The legend's name: the family's, with the run's parameter when the variant names one (linformer:k=128)."""
    name = family_label(key)
    _, _, opts = variant.partition(":")
    opts = ",".join(o for o in opts.split(",") if o and not o.startswith(("impl=", "projection=")))
    return f"{name} ({opts.replace('=', ' = ')})" if opts else name


def memory_panel(ax, m, variants, spec_of, ns, refused):
    """Peak memory above the inputs (MiB) on a log axis over the resolved values; values below one page are
    drawn as open markers on the axis' bottom edge; a note says what exact streaming attention needs."""
    floor = PAGE / 2**20
    resolved = [m[v][m[v] >= PAGE].values / 2**20 for v in variants if v in m.columns]
    vals = np.concatenate(resolved) if resolved else np.array([])
    lo = floor / 2
    hi = max(vals.max() * 1.8, floor * 20) if vals.size else floor * 100
    any_unresolved = False
    for i, v in enumerate(variants):
        if v not in m.columns:
            continue
        key = family_key(spec_of[v])
        x, y = m.index.values.astype(float), m[v].values
        ok = np.isfinite(y)
        x, y = x[ok], y[ok]
        col, mk = family_colour(key), family_marker(key)
        res = y >= PAGE
        ls = "--" if key == "exact_materialized" else "-"
        # resolved values as a line (broken where a value is not resolved), unresolved ones open at the bottom
        yy = np.where(res, y / 2**20, np.nan)
        ax.plot(x, yy, ls=ls, marker=mk, ms=4, color=col, lw=2 if key == "exact" else 1.5,
                label=display(v, key))
        if (~res).any():
            any_unresolved = True
            shift = 1 + 0.025 * (i - (len(variants) - 1) / 2)   # side by side where several share an n
            ax.plot(x[~res] * shift, np.full((~res).sum(), lo), ls="none", marker=mk, ms=7, mfc="white", mec=col,
                    mew=1.3,
                    clip_on=False, label="_nolegend_", zorder=4)
    ax.axhline(floor, color="0.6", ls=":", lw=0.8)
    ax.text(0.99, floor, " 1 page (4 KiB)", transform=ax.get_yaxis_transform(), ha="right", va="bottom",
            fontsize=7, color="0.4")
    ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="peak memory above the inputs (MiB)",
           ylim=(lo, hi))
    log_ticks(ax, ns)
    ax.grid(True, which="major", lw=0.3, alpha=0.5)
    notes = []
    if any_unresolved:
        notes.append("open markers on the bottom edge: below one page (not resolved)")
    exact = [v for v in variants if family_key(spec_of[v]) == "exact" and v in m.columns]
    for v in exact:   # say what exact streaming attention needs, however small
        peak = np.nanmax(m[v].values)
        notes.append("exact (streaming): below one page at every n" if peak < PAGE else
                     f"exact (streaming): at most {peak / 2**10:.0f} KiB at any n")
    for v in variants:
        if v in refused:
            notes.append(f"{display(v, family_key(spec_of[v]))}: refused from n = {int(refused[v])} (memory guard)")
    ax.legend(loc="upper left", fontsize=7.5)
    ax.set_title("\n".join(notes), fontsize=7.5, loc="left")   # above the panel, not over its data
