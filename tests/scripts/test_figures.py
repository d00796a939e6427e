#!/usr/bin/env python3
"""The figures a reader sees (tools/figures/, drawn by tools/plot.py) stay readable, on tiny synthetic CSVs:
  - error against budget: at most 6 series a panel; no panel mixes budget units (the sparse patterns are drawn at
    the keys per query the CSV measured, ProbSparse at its active queries + 1); the y axis within the useful range
    of a relative error [1e-4, 10] and covering every value inside it; values beyond it drawn as ▲/▼ at the edge
    and counted, never dropped;
  - error against cost: units on the axes (ms, MiB); memory below one page drawn as open markers, not dropped;
  - scaling: at most 6 series a panel; slopes fitted over the upper half of the lengths; time in ms; memory in MiB
    with no floor below the measurement's resolution, unresolved values as open markers with a note; the spread
    drawn when the CSV has time_max_s, and the figure drawn without it;
  - every figure of the driver on the committed CSVs: at most 6 series a panel except where noted, compact PNGs;
  - plot.load, plot.is_model_head and the plot_* functions importable (the notebooks use them).
Needs Debian's python3-matplotlib and python3-pandas; no attnlab build.
"""
import os
import shutil
import tempfile

import numpy as np
import pandas as pd

from checks import ROOT, Checks, import_tools

import_tools()
import plot  # noqa: E402
from figures import common, data  # noqa: E402

c = Checks()
check = c.check


# Every figure passes through common.save: keep a record of what each one holds before it is closed.
drawn = {}
_save = common.save


def recording_save(fig, out, name):
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    drawn[name] = [dict(series=common.series_count(ax), ylim=ax.get_ylim(), xlim=ax.get_xlim(), yscale=ax.get_yscale(),
                        xlabel=ax.get_xlabel(), ylabel=ax.get_ylabel(),
                        title=ax.get_title("right") + ax.get_title("left"),
                        lines=[(ln.get_label(), ln.get_marker(), ln.get_markerfacecolor(), ln.get_xdata(orig=False),
                                ln.get_ydata(orig=False), ln.get_color()) for ln in ax.get_lines()],
                        collections=len(ax.collections))
                   for ax in axes]
    return _save(fig, out, name)


common.save = recording_save

COLUMNS = ["schema_version", "code_version", "experiment", "point", "source", "method", "spec", "n", "d", "seed",
           "sequence", "layer", "head", "dtype", "variant", "step", "metric", "value"]


def write(results, name, rows):
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df:
            df[c] = {"schema_version": 2, "code_version": "test", "experiment": name}.get(c, "")
    for c in ("sequence", "layer", "head"):   # integers, empty where a row is not a model head
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    df["point"] = range(len(df))
    df[COLUMNS].to_csv(os.path.join(results, f"{name}.csv.gz"), index=False)


tmp = tempfile.mkdtemp(prefix="attnlab_figures_")
res, out = os.path.join(tmp, "results"), os.path.join(tmp, "figures")
os.makedirs(res)

# ---- error against budget: every family of experiments/budget_families.hpp on a generated source and two heads
FAMILIES = {"svd": [8, 16, 32], "nystrom": [8, 16, 32], "nystrom_svd": [8, 16, 32], "linformer_pool": [8, 16, 32],
            "linformer_gaussian": [8, 16, 32], "cur": [8, 16, 32], "performer": [16, 32, 64], "vq": [8, 16, 32],
            "local": [4, 8, 16], "reformer": [8, 16, 32], "probsparse": [1, 2, 5], "scatterbrain": [4, 8, 16]}
KEYS = {4: 9.0, 8: 17.0, 16: 33.0, 32: 63.0}        # local's measured keys per query at a window
REFORMER_KEYS = {8: 31.0, 16: 61.0, 32: 116.0}
rows = []
rng = np.random.default_rng(0)
for src, head in (("gaussian", {}), ("trained", dict(sequence=0, layer=0, head=0)),
                  ("trained", dict(sequence=0, layer=1, head=0))):
    for fam, budgets in FAMILIES.items():
        for i, b in enumerate(budgets):
            base = dict(source=src, variant=fam, step=b, n=512, d=64, seed=0, method=fam, spec=f"{fam}:b={b}", **head)
            err = 0.5 / (i + 1) * (1 + 0.1 * rng.random())
            if fam == "cur":
                err = 1e10 / (i + 1)      # explodes: beyond the axis, must be drawn as ▲
            if fam == "svd" and i == 2:
                err = 1e-6                # below the axis: ▼
            for metric in ("P_rel_fro", "out_rel_fro"):
                rows.append(dict(base, metric=metric, value=err))
            rows.append(dict(base, metric="cost_time_s", value=1e-4 * (i + 1)))
            rows.append(dict(base, metric="cost_time_median_s", value=1.2e-4 * (i + 1)))
            rows.append(dict(base, metric="cost_peak_memory_bytes", value=0 if fam == "local" else 8192 * (i + 1)))
            rows.append(dict(base, metric="cost_speedup_vs_exact", value=3.0 / (i + 1)))
            if fam == "local":
                rows.append(dict(base, metric="keys_per_query", value=KEYS[b]))
            if fam == "reformer":
                rows.append(dict(base, metric="keys_per_query", value=REFORMER_KEYS[b]))
            if fam == "probsparse":
                rows.append(dict(base, metric="selected_queries", value=7.0 * b))
write(res, "error_vs_budget", rows)
paths = plot.plot_error_vs_budget(res, out)
check(len(paths) == 4 and all(os.path.exists(p) for p in paths), f"four budget/cost figures written: {paths}")

for name in ("error_vs_budget_P_rel_fro", "error_vs_budget_out_rel_fro"):
    axes = drawn.get(name, [])
    check(len(axes) >= 8, f"{name}: a grid of panels (sources x budget units): {len(axes)}")
    check(all(a["series"] <= 6 for a in axes), f"{name}: at most 6 series a panel: {[a['series'] for a in axes]}")
    for a in axes:
        lo, hi = a["ylim"]
        check(a["yscale"] == "log" and lo >= 1e-4 * 0.999 and hi <= 10 * 1.001,
              f"{name}: y within the useful range [1e-4, 10]: {a['ylim']}")
    # Rows are sources (sorted); every value of a row inside [1e-4, 10] lies inside each of its panels' axes.
    d = pd.DataFrame(rows)
    d = d[d.metric == name.replace("error_vs_budget_", "")]
    per_row = len(axes) // d.source.nunique()
    for r, (fam, g) in enumerate(sorted(d.groupby("source"))):
        med = g.groupby(["variant", "step"])["value"].median()
        inside = med[(med >= 1e-4) & (med <= 10)]
        for a in axes[r * per_row:(r + 1) * per_row]:
            lo, hi = a["ylim"]
            check(lo <= inside.min() and inside.max() <= hi,
                  f"{name}: {fam}'s axis {a['ylim']} covers its values in range [{inside.min()}, {inside.max()}]")
    # Each panel's budget unit: the sparse panel's local line at the measured keys per query, not at the window.
    sparse = [a for a in axes if any(lab.startswith("local window") for lab, *_ in a["lines"])]
    check(bool(sparse) and all(sorted(x for lab, mk, _, xd, _, _ in a["lines"] if lab.startswith("local window")
                                      for x in xd) == sorted(KEYS[b] for b in FAMILIES["local"]) for a in sparse),
          f"{name}: local drawn at the measured keys per query")
    check(all("keys per query" in a["xlabel"] for a in sparse if a["xlabel"]), f"{name}: the sparse panels' unit")
    mixed = [a for a in axes if any(lab.startswith("local window") for lab, *_ in a["lines"]) and
             any(lab.startswith("Nyström") for lab, *_ in a["lines"])]
    check(not mixed, f"{name}: no panel holds both a window-budget and a landmark-budget family")
    probs = [x for a in axes for lab, mk, _, xd, _, _ in a["lines"] if lab == "ProbSparse" for x in xd]
    check(sorted(set(probs)) == [8.0, 15.0, 36.0], f"{name}: ProbSparse at its rank bound u + 1: {sorted(set(probs))}")
    # CUR's errors (1e10) lie beyond the axis: drawn as ▲ at its top and counted in the panel, not dropped.
    cur = [a for a in axes if any(lab == "CUR" for lab, *_ in a["lines"])]
    ups = [sum(len(xd) for lab, mk, _, xd, _, _ in a["lines"] if mk == "^" and lab.startswith("_")) for a in cur]
    check(bool(cur) and all(u >= 3 for u in ups), f"{name}: CUR's 3 points above the axis drawn as ▲: {ups}")
    check(all("above 10" in a["title"] for a in cur), f"{name}: the panel says how many lie above: "
          f"{[a['title'] for a in cur]}")
    downs = [a for a in axes if any(mk == "v" for _, mk, *_ in a["lines"])]
    check(bool(downs) and all("below" in a["title"] for a in downs), f"{name}: points below the axis drawn and noted")

for name, unit in (("error_vs_cost_time", "(ms)"), ("error_vs_cost_memory", "(MiB)")):
    axes = drawn.get(name, [])
    check(bool(axes) and all(a["series"] <= 6 for a in axes), f"{name}: at most 6 series a panel")
    check(any(unit in a["xlabel"] for a in axes), f"{name}: the x axis states its unit {unit}: "
          f"{set(a['xlabel'] for a in axes)}")
    for a in axes:
        lo, hi = a["ylim"]
        check(lo >= 1e-4 * 0.999 and hi <= 10 * 1.001, f"{name}: y within [1e-4, 10]: {a['ylim']}")
mem = drawn.get("error_vs_cost_memory", [])
opened = [x for a in mem for lab, mk, mfc, xd, _, col in a["lines"] if str(mfc) in ("white", "w") for x in xd]
check(len(opened) >= 6 and all(abs(x - 2048 / 2**20) < 1e-12 for x in opened),
      f"error_vs_cost_memory: memory below one page (local's 0 bytes) drawn as open markers at half a page: {opened}")

# ---- scaling: the quick preset's methods; exact's time flat at the small lengths, quadratic above
NS = [256, 512, 1024, 2048]
METHODS = ["exact:impl=materialized", "exact", "linear", "performer", "nystrom", "linformer:k=128", "vq",
           "probsparse", "local", "reformer"]
SPECS = {"exact:impl=materialized": "exact:impl=materialized,tile=256", "exact": "exact:impl=streaming,tile=256",
         "linformer:k=128": "linformer:k=128,projection=gaussian"}


def scaling_rows(spread):
    rows = []
    for v in METHODS:
        for n in NS:
            t = {256: 1e-3, 512: 1e-3, 1024: 4e-3, 2048: 16e-3}[n] if v == "exact" else 1e-6 * n
            base = dict(source="gaussian", variant=v, method=v.split(":")[0], spec=SPECS.get(v, v), n=n, d=64, seed=0)
            rows.append(dict(base, metric="time_s", value=t))
            if spread:
                rows.append(dict(base, metric="time_median_s", value=1.1 * t))
                rows.append(dict(base, metric="time_max_s", value=1.5 * t))
            memory = 0 if v == "exact" else (n * n * 4 if v.startswith("exact:") else 64 * n * 4)
            rows.append(dict(base, metric="peak_memory_bytes", value=memory))
    return rows


for spread in (False, True):
    write(res, "scaling", scaling_rows(spread))
    drawn.pop("scaling", None)
    paths = plot.plot_scaling(res, out)
    axes = drawn.get("scaling", [])
    what = "with time_max_s" if spread else "without time_max_s"
    check(len(paths) == 1 and len(axes) >= 4, f"scaling ({what}): drawn, time and memory panels: {len(axes)}")
    check(all(a["series"] <= 6 for a in axes), f"scaling ({what}): at most 6 series a panel: "
          f"{[a['series'] for a in axes]}")
    time_axes = [a for a in axes if "(ms)" in a["ylabel"]]
    mem_axes = [a for a in axes if "(MiB)" in a["ylabel"]]
    check(len(time_axes) >= 2 and len(mem_axes) >= 2, f"scaling ({what}): time in ms and memory in MiB")
    check(all(a["xlabel"] == "sequence length n" and a["yscale"] == "log" for a in axes),
          f"scaling ({what}): log-log against n")
    labels = [lab for a in time_axes for lab, *_ in a["lines"]]
    exact = [lab for lab in labels if lab.startswith("exact (streaming)")]
    check(exact and all("slope 2.00" in lab for lab in exact),
          f"scaling ({what}): exact's slope fitted over the upper half of the lengths (2.00, not the full range's "
          f"{np.polyfit(np.log(NS), np.log([1e-3, 1e-3, 4e-3, 16e-3]), 1)[0]:.2f}): {exact}")
    check(all(a["collections"] > 0 for a in time_axes) == spread,
          f"scaling ({what}): the spread drawn exactly when the CSV has it")
    page = 4096 / 2**20
    for a in mem_axes:
        lo, hi = a["ylim"]
        check(page / 4 <= lo < page, f"scaling ({what}): the memory axis starts just below one page, no lower "
              f"floor: {a['ylim']}")
        drawn_exact = [(mfc, yd) for lab, mk, mfc, xd, yd, col in a["lines"] if str(mfc) in ("white", "w")]
        check(drawn_exact and all(abs(y - lo) < 1e-15 for _, yd in drawn_exact for y in yd),
              f"scaling ({what}): exact's unresolved memory as open markers on the bottom edge")
        check("below one page at every n" in a["title"] and "not resolved" in a["title"],
              f"scaling ({what}): the panel says exact's memory is below the resolution: {a['title']!r}")

# ---- every figure of the driver on the committed CSVs: readable panels, compact PNGs
drawn.clear()
committed = os.path.join(ROOT, "results")
for name, fn in plot.PLOTS.items():
    if data.csv_path(committed, name):
        for p in fn(committed, out):
            from PIL import Image
            with Image.open(p) as im:
                check(im.mode == "P", f"{os.path.basename(p)}: a compact palette PNG ({im.mode})")
for name, axes in drawn.items():
    many = [a["series"] for a in axes if a["series"] > 6]
    check(not many, f"{name}: at most 6 labelled series a panel: {[a['series'] for a in axes]}")
check(all(callable(getattr(plot, f)) for f in ("load", "is_model_head", "plot_error_vs_budget", "plot_scaling",
                                                 "plot_spectrum", "plot_pinv", "plot_regimes", "plot_probsparse",
                                                 "plot_vq", "plot_performer_mse", "plot_error_vs_length")),
      "plot.load, plot.is_model_head and plot.plot_* importable")
# Results schema 1 is refused, naming the migration (tools/migrate_results.py).
old = os.path.join(tmp, "schema1")
os.makedirs(old)
with open(os.path.join(old, "vq.csv"), "w") as f:
    f.write("schema_version,code_version,experiment,point,source,method,spec,n,d,seed,variant,step,metric,value\n"
            "1,v,vq,p,trained/L0H1,vq,vq:codes=8,64,16,0,hard,8,out_rel_fro,0.5\n")
try:
    data.load(old, "vq")
    check(False, "a schema-1 CSV is refused")
except SystemExit as e:
    check("schema 1" in str(e) and "tools/migrate_results.py" in str(e), f"schema 1 refused with the hint: {e}")
shutil.rmtree(tmp)
c.finish()
