#!/usr/bin/env python3
"""The numbers the README, the pages under docs/ and the notebooks quote, computed from the committed CSVs so that
they cannot go stale.

    tools/findings.py [--results results]            write RESULTS/findings.md; for results/, also render
                                                     README.md, docs/*.md and the notebooks' text
    tools/findings.py --check                        exit 1 when README.md, a page under docs/, the notebooks' text
                                                     or findings.md differ from what the CSVs give (the test suite
                                                     runs this)

Every finding has a name, a definition (which CSV rows, which statistic) and a formatted value. The prose lives in
templates with {{name}} where a number goes — docs/README.template.md (rendered into README.md), every other
docs/NAME.template.md (rendered into docs/NAME.md; docs/paper.template.md only once the paper preset's results are
committed) — and in tools/notebook_texts.py. Edit the templates, not the pages they render. Needs Debian's
python3-pandas; no matplotlib (the CSVs are read by figures/data.py, figures/dropin_stats.py and bench_data.py, which
the figures share). Imports no module that imports it: tools/make_notebooks.py is a command over write_notebooks()
here.
"""
import argparse
import difflib
import json
import math
import os
import re
import sys

import numpy as np
import pandas as pd

TOOLS = os.path.dirname(os.path.abspath(__file__))
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)
from bench_data import allocator_frame  # noqa: E402
from figures.data import load, upper_half_slope  # noqa: E402  (the scaling figure's fit: sentence and legend agree)
from figures.data import load_finetune, load_pretrained, timed_on  # noqa: E402
from figures.dropin_stats import correlations, load_dropin  # noqa: E402
from notebook_texts import books  # noqa: E402

ROOT = os.path.dirname(TOOLS)
DOCS = os.path.join(ROOT, "docs")
TEMPLATE_SUFFIX = ".template.md"
TEMPLATE = os.path.join(DOCS, "README.template.md")
README = os.path.join(ROOT, "README.md")
PAPER_TEMPLATE = os.path.join(DOCS, "paper.template.md")
PAPER = os.path.join(DOCS, "paper.md")
EXPORT = os.path.join(ROOT, "models", "trained_attention.export.json")
# A placeholder is {{experiment.name}}, in any case (evb.P_clustered_vq, regimes.gaussian_svd_lowT). Every {{...}}
# in a text is checked — not only those of the expected shape — so that a key the pattern does not cover cannot pass
# through unrendered (an all-lowercase pattern once let 11 such placeholders reach the README). No exception: a text
# that talks about placeholders describes them in words ("the finding's name in double braces").
PLACEHOLDER = re.compile(r"\{\{([^{}\n]*)\}\}")
NO_VALUE = {"nan", "-nan", "inf", "-inf", ""}   # a finding formatted like this has no value to quote


def pick(df, **eq):
    """Rows whose columns equal the given values."""
    m = pd.Series(True, index=df.index)
    for col, val in eq.items():
        m &= df[col] == val
    out = df[m]
    if out.empty:
        raise KeyError(f"no rows with {eq}")
    return out["value"]


def f2(x):
    return f"{x:.2f}"


def f3(x):
    return f"{x:.3f}"


def sig(x, n=2):
    """n significant digits, plain notation for 1e-3 ≤ |x| < 1e4, else like 4e7."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    if 1e-3 <= abs(x) < 1e4:
        digits = max(0, n - 1 - int(math.floor(math.log10(abs(x)))))
        return f"{round(x, digits):.{digits}f}"
    m, e = f"{x:.{n - 1}e}".split("e")
    m = m.rstrip("0").rstrip(".")
    return f"{m}e{int(e)}"


def pct(x):
    return f"{100 * x:.0f}%"


def integer(x):
    return f"{x:.0f}"


class Findings:
    def __init__(self):
        self.items = {}   # name -> (value text, definition, experiment)

    def add(self, name, value, fmt, definition, experiment):
        self.items[name] = (fmt(value), definition, experiment)


def per_head(series_df, metric):
    """Per model head (layer, head), the median over sequences of a metric."""
    d = series_df[series_df.metric == metric]
    return d.groupby(["layer", "head"])["value"].median()


def spectrum(F, R):
    d = load(R, "spectrum")
    for src in ("gaussian", "clustered", "lowrank"):
        F.add(f"spectrum.{src}_at128", pick(d, source=src, variant="T=1", metric="cumulative_at_128").median(), f2,
              f"normalized cumulative singular value at index 128 of P, source {src}, T = 1, n = 512 "
              "(median over seeds)",
              "spectrum")
    t = per_head(d[d.source == "trained"], "cumulative_at_128")
    F.add("spectrum.trained_at128_min", t.min(), f2, "trained heads: smallest cumulative singular value at 128 "
          "(per head the median over sequences)", "spectrum")
    F.add("spectrum.trained_at128_max", t.max(), f2, "trained heads: largest of the same", "spectrum")
    F.add("spectrum.trained_at128_median", t.median(), f2, "trained heads: median over heads of the same", "spectrum")
    F.add("spectrum.initialized_at128_min", per_head(d[d.source == "initialized"], "cumulative_at_128").min(), f2,
          "initialised model: smallest cumulative singular value at 128 over heads", "spectrum")
    F.add("spectrum.sharpest_entropy", per_head(d[d.source == "trained"], "mean_row_entropy").min(), f2,
          "trained heads: smallest mean row entropy (nats)", "spectrum")
    F.add("spectrum.max_diff_vs_model", d[d.metric == "max_abs_diff_vs_model"]["value"].max(), lambda x: sig(x, 1),
          "largest |P_attnlab − P_model| over every exported head", "spectrum")


def error_vs_budget(F, R):
    d = load(R, "error_vs_budget")
    at = d[d.step == 64]

    def med(family, variant, metric):
        return pick(at[at.source == family], variant=variant, metric=metric).median()

    for fam in ("clustered", "lowrank", "gaussian", "trained"):
        F.add(f"evb.floor_{fam}", med(fam, "svd", "P_rel_fro"), f2 if fam != "clustered" else f3,
              f"Eckart–Young floor ‖P − P_64‖_F/‖P‖_F at budget 64, n = 512, source {fam} (median over heads/seeds)",
              "error_vs_budget")
    for fam, variants in (("clustered", ("vq", "reformer", "nystrom", "performer")),
                          ("trained", ("reformer", "nystrom"))):
        for v in variants:
            F.add(f"evb.P_{fam}_{v}", med(fam, v, "P_rel_fro"), f2, f"P_rel_fro of {v} at budget 64 on {fam}",
                  "error_vs_budget")
    for v in ("vq", "reformer", "local", "scatterbrain", "nystrom", "linformer_pool", "performer"):
        F.add(f"evb.out_trained_{v}", med("trained", v, "out_rel_fro"), f2,
              f"out_rel_fro of {v} at budget 64 on the trained heads (median of one head per layer)", "error_vs_budget")
    init = at[(at.source == "initialized") & (at.metric == "out_rel_fro") & (at.variant != "linformer_gaussian")]
    F.add("evb.out_initialized_max", init.groupby("variant")["value"].median().max(), f2,
          "initialised model: largest out_rel_fro at budget 64 over the families except Gaussian Linformer",
          "error_vs_budget")
    # Error against cost on the trained heads: how many (method, budget) pairs beat exact attention's time, and what
    # the most accurate one costs.
    tr = d[d.source == "trained"]
    err = tr[tr.metric == "out_rel_fro"].groupby(["variant", "step"])["value"].median()
    speed = tr[tr.metric == "cost_speedup_vs_exact"].groupby(["variant", "step"])["value"].median()
    both = pd.concat({"err": err, "speed": speed}, axis=1).dropna()
    both = both[both.index.get_level_values(0) != "svd"]   # a reference by dense SVD, not a method to run for speed
    if not both.empty:
        F.add("evb.cost_trained_faster", int((both.speed > 1).sum()), integer,
              "trained heads: (method, budget) pairs faster than exact streaming attention in float32 (timing)",
              "error_vs_budget")
        F.add("evb.cost_trained_pairs", len(both), integer, "trained heads: (method, budget) pairs with a cost",
              "error_vs_budget")
        best = both["err"].idxmin()
        F.add("evb.cost_trained_best", f"{best[0]} at budget {int(best[1])}", str,
              "trained heads: the (method, budget) pair with the lowest output error (SVD excluded)", "error_vs_budget")
        F.add("evb.cost_trained_best_err", both.loc[best, "err"], f2, "its output error", "error_vs_budget")
        F.add("evb.cost_trained_best_speedup", both.loc[best, "speed"], lambda x: sig(x, 1),
              "its speed relative to exact streaming attention (exact's time / its time; timing)", "error_vs_budget")


def error_vs_length(F, R):
    d = load(R, "error_vs_length")
    d = d[d.metric == "P_rel_fro"]
    for key, variant in (("nystrom", "nystrom:landmarks"), ("floor", "svd:rank"), ("linformer", "linformer:k")):
        for n in (256, 2048):
            F.add(f"evl.{key}_gaussian_{n}", pick(d, source="gaussian", variant=variant, n=n).median(),
                  f2 if key != "linformer" else lambda x: sig(x, 2),
                  f"P_rel_fro of {variant}=64 on Gaussian inputs at n = {n}", "error_vs_length")
    pool = d[d.variant == "linformer:projection=pool,k"]["value"]
    F.add("evl.pool_min", pool.min(), f2, "Linformer mean pooling (k = 64): smallest P_rel_fro over sources and n",
          "error_vs_length")
    F.add("evl.pool_max", pool.max(), f2, "the largest of the same", "error_vs_length")


def performer(F, R):
    d = load(R, "performer_mse")
    F.add("performer.trig_mse_16", pick(d, variant="iid/trig", step=16, metric="kernel_mse").median(), integer,
          "sampled kernel MSE of iid trig features at M = 16 (Performer Fig. 4 set-up)", "performer_mse")
    F.add("performer.trig_lemma2_16", pick(d, variant="iid/trig", step=16, metric="kernel_mse_lemma2_iid").median(),
          integer, "Lemma 2's closed-form MSE for the same", "performer_mse")


def vq(F, R):
    d = load(R, "vq")
    for key, variant in (("hard", "hard"), ("both", "both (mean-field)"), ("performer", "performer")):
        F.add(f"vq.clustered_64_{key}", pick(d, source="clustered", variant=variant, step=64, metric="out_rel_fro")
              .median(), f2 if key != "both" else f3,
              f"out_rel_fro of VQ variant '{variant}' with 64 codes on clustered keys, n = 512", "vq")


def regimes(F, R):
    d = load(R, "regimes")
    t = d[d.source == "trained"]
    ent = t[t.metric == "entropy"].groupby(["layer", "head"])["value"].mean()
    out = t[t.metric == "out_rel_fro"].pivot_table(index=["layer", "head"], columns="method", values="value")
    sharp, broad = ent.idxmin(), ent.idxmax()
    F.add("regimes.heads", len(ent), integer, "trained heads in the regimes experiment", "regimes")
    F.add("regimes.sharp_entropy", ent[sharp], f2, "entropy (nats) of the sharpest trained head", "regimes")
    F.add("regimes.sharp_local", out.loc[sharp, "local"], lambda x: sig(x, 1), "its local-window output error",
          "regimes")
    F.add("regimes.sharp_svd", out.loc[sharp, "svd"], f2, "its best rank-64 output error", "regimes")
    F.add("regimes.broad_entropy", ent[broad], f2, "entropy (nats) of the broadest trained head", "regimes")
    F.add("regimes.broad_svd", out.loc[broad, "svd"], f2, "its best rank-64 output error", "regimes")
    F.add("regimes.broad_local", out.loc[broad, "local"], f2, "its local-window output error", "regimes")
    F.add("regimes.broad_reformer", out.loc[broad, "reformer"], f2, "its Reformer output error", "regimes")
    F.add("regimes.scatterbrain_worse", int((out["scatterbrain"] > out["local"]).sum()), integer,
          "trained heads on which Scatterbrain (Performer + band) is worse than its band (local) alone", "regimes")
    g = d[(d.source == "gaussian") & (d.method == "svd") & (d.metric == "out_rel_fro")]
    g = g.assign(T=g.variant.str[2:].astype(float)).groupby("T")["value"].median()
    F.add("regimes.gaussian_svd_lowT", g.iloc[0], f2, f"Gaussian inputs: rank-64 output error at T = {g.index[0]:g}",
          "regimes")
    F.add("regimes.gaussian_svd_highT", g.iloc[-1], f3, f"the same at T = {g.index[-1]:g}", "regimes")


def probsparse(F, R):
    d = load(R, "probsparse")
    rec = d[(d.metric == "top_u_recall") & (d.step == 500) & (d.variant == "sampled M̄")]
    for fam in ("gaussian", "clustered", "trained"):
        F.add(f"probsparse.recall_{fam}", rec[rec.source == fam]["value"].median(), pct,
              f"recall of the true top-u queries by the sampled M̄ at c = 5, source {fam} (median)", "probsparse")
    full = d[(d.metric == "top_u_recall") & (d.step == 500) & (d.variant == "full M̄")]
    F.add("probsparse.recall_trained_full", full[full.source == "trained"]["value"].median(), f2,
          "the same with M̄ over all keys, trained heads", "probsparse")
    F.add("probsparse.corr_clustered", pick(d, source="clustered", metric="corr_M_Mbar").median(), f2,
          "correlation of M and the sampled M̄ over queries, clustered keys", "probsparse")
    q = d[(d.metric == "M_quantile") & (d.step == 50)]
    tq = q[q.source == "trained"].groupby(["layer", "head"])["value"].median()
    F.add("probsparse.M_median_trained_min", tq.min(), integer, "trained heads: smallest median M over queries (nats)",
          "probsparse")
    F.add("probsparse.M_median_trained_max", tq.max(), integer, "trained heads: largest median M", "probsparse")
    F.add("probsparse.M_median_gaussian", q[q.source == "gaussian"]["value"].median(), lambda x: sig(x, 2),
          "Gaussian inputs: median M", "probsparse")


def scaling(F, R):
    d = load(R, "scaling")
    t = d[d.metric == "time_s"]

    def slope(frame, variant):
        x = frame[frame.variant == variant].sort_values("n")
        return upper_half_slope(x.n.values.astype(float), x.value.values.astype(float))

    s, start = slope(t, "exact")
    F.add("scaling.exact_slope", s, f2, "log-log slope of exact streaming attention's time against n over the upper "
          "half of the lengths (timing)", "scaling")
    F.add("scaling.slope_from", start, integer, "the shortest length of that fit", "scaling")
    # The paper preset's lengths (to 65536) are where the asymptotics show; quoted when its results are committed.
    paper = os.path.join(R, "paper")
    if os.path.exists(os.path.join(paper, "scaling.csv.gz")):
        p = load(paper, "scaling")
        pt = p[(p.metric == "time_s") & (p.n >= 16384)]
        ps, pstart = slope(pt, "exact")
        F.add("scaling.paper_exact_slope", ps, f2, "paper preset: exact streaming attention's time slope over "
              "n ≥ 16384 (timing)", "scaling")
        F.add("scaling.paper_nmax", p.n.max(), integer, "paper preset: largest n", "scaling")
    mem = d[(d.metric == "peak_memory_bytes")]
    mat = mem[mem.variant == "exact:impl=materialized"].sort_values("n")
    F.add("scaling.materialized_mem_ratio", (mat.value.values[-1] / mat.value.values[-2]), lambda x: sig(x, 2),
          "materialized exact attention: peak memory ratio between the two largest n (a doubling)", "scaling")
    nmax = t.n.max()
    F.add("scaling.nmax", nmax, integer, "largest n of the scaling run", "scaling")
    # The device these costs hold for, as the run's .config recorded it (the CPU's name since it is recorded).
    config = os.path.join(R, "scaling.csv.gz.config")
    lines = open(config, encoding="utf-8").read().splitlines() if os.path.exists(config) else []
    cpu = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("# costs measured on:")), "")
    kernels = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("# costs measured with:")), "")
    F.add("scaling.device", f"{cpu or 'this project’s 2-core x86-64 machine (CPU model not recorded by that run)'}"
          f"{', ' + kernels if kernels else ''}", str, "the machine and kernels the scaling run's costs were measured "
          "with", "scaling")
    F.add("scaling.streaming_mem_kib", mem[(mem.variant == "exact") & (mem.n == nmax)]["value"].max() / 2**10,
          integer, "streaming exact attention: peak memory above the inputs at the largest n (KiB; resolution one "
          "4 KiB page)", "scaling")
    # Nyström's speed-up as a range: the ratio of the fastest calls and the ratio of the median calls.
    te = t[(t.n == nmax)].set_index("variant")["value"]
    tm = d[(d.metric == "time_median_s") & (d.n == nmax)].set_index("variant")["value"]
    ratios = [te["exact"] / te["nystrom"]]
    if "exact" in tm and "nystrom" in tm:
        ratios.append(tm["exact"] / tm["nystrom"])
    F.add("scaling.nystrom_speedup_lo", min(ratios), lambda x: sig(x, 2),
          "exact streaming's time over Nyström's at the largest n: the lower of the ratios of fastest and of median "
          "calls (timing)", "scaling")
    F.add("scaling.nystrom_speedup_hi", max(ratios), lambda x: sig(x, 2),
          "the higher of the two (timing)", "scaling")


def report(F, R):
    """The committed report on the trained model (results/report, `attnlab report --cost-n ...`): its verdicts."""
    path = os.path.join(R, "report", "report.csv")
    if not os.path.exists(path):
        return
    d = pd.read_csv(path)
    heads = d[d.metric == "entropy"][["layer", "head"]].drop_duplicates()
    F.add("report.heads", len(heads), integer, "heads in the committed report", "report")
    F.add("report.n", int(d.n.iloc[0]), integer, "the heads' length (errors measured there)", "report")
    cost_n = d[d.metric == "cost_n"]
    if not cost_n.empty:
        F.add("report.cost_n", int(cost_n.value.iloc[0]), integer, "the length the costs were measured at", "report")
    rec = d[(d.metric == "recommended") & (d.value == 1)]
    F.add("report.keep_exact", len(heads) - len(rec), integer, "heads that keep exact attention (timing)", "report")
    counts = rec.groupby("family").size().sort_values(ascending=False)
    F.add("report.recommended", ", ".join(f"{c} × {f}" for f, c in counts.items()) or "none", str,
          "recommended families and how many heads each (timing)", "report")
    fl = d[(d.metric == "eckart_young_floor") & (d.budget == 64)]
    if not fl.empty:
        F.add("report.floor64_min", fl.value.min(), f2, "smallest Eckart–Young floor ‖P − P_64‖_F/‖P‖_F over the "
              "heads", "report")
        F.add("report.floor64_max", fl.value.max(), f2, "largest such floor", "report")
        # How far the rank-limited methods at budget 64 (rank ≤ 64) are from that floor, per head: the closest one.
        ranked = d[(d.metric == "P_rel_fro") & (d.budget == 64)
                   & d.family.isin(["nystrom", "nystrom_svd", "linformer_pool", "linformer_gaussian", "performer",
                                    "vq"])]
        best = ranked.groupby(["layer", "head"]).value.min()
        floor = fl.set_index(["layer", "head"]).value
        ratio = (best / floor).dropna()
        F.add("report.best64_over_floor", ratio.median(), lambda x: sig(x, 2), "median over heads of (the closest "
              "rank-limited method's ‖P − P̃‖_F/‖P‖_F at budget 64) / (the rank-64 floor)", "report")
        F.add("report.best64_over_floor_min", ratio.min(), lambda x: sig(x, 2), "the smallest such ratio", "report")


def dropin(F, R):
    """The drop-in experiment (tools/dropin.py): what the trained models lose with each method swapped in, and which
    head-level quantity predicts it."""
    path = os.path.join(R, "dropin.csv.gz")
    if not os.path.exists(path):
        return
    df = load_dropin(R)
    cfg = json.load(open(path + ".config"))
    F.add("dropin.windows", cfg["windows"], integer, "held-out windows of 512 bytes per model", "dropin")
    F.add("dropin.check", max(c["max_abs_token_ce_difference"] for c in cfg["checks"].values()), lambda x: sig(x, 1),
          "largest |per-byte loss through attnlab's exact attention − the model's own| over both models", "dropin")
    names = {"mlm": "masked-LM", "causal": "causal"}
    rows = ["| model | family | " + " | ".join(["budget: loss increase ± SE (nats/byte)"] * 1) + " |", "|---|---|---|"]
    corr = correlations(df)   # both models' (a cluster bootstrap: seconds), once
    for m in ("mlm", "causal"):
        dm = df[df.model == m]
        if dm.empty:
            continue
        ex = dm[dm.scope == "exact"].iloc[0]
        F.add(f"dropin.{m}.exact_loss", ex.loss, f3, f"held-out loss of the exact {names[m]} model (nats/byte)",
              "dropin")
        F.add(f"dropin.{m}.exact_loss_se", ex.loss_se, f3, "its standard error over windows", "dropin")
        F.add(f"dropin.{m}.tokens", ex.tokens, integer, "scored bytes (masked-LM: the masked 15%; causal: every next "
              "byte)", "dropin")
        a = dm[dm.scope == "all"]
        for fam, d in a.groupby("family", sort=False):
            cells = ", ".join((f"{b:g}: " if fam != "linear" else "") + f"{x:+.3f} ± {se:.3f}"
                              for b, x, se in zip(d.budget, d.dloss, d.dloss_se))
            rows.append(f"| {names[m]} | {fam} | {cells} |")
        best = a.loc[a.dloss.idxmin()]
        F.add(f"dropin.{m}.best", f"{best.family} at budget {best.budget:g} (+{best.dloss:.3f} ± {best.dloss_se:.3f} "
              f"nats/byte, top-1 agreement {100 * best.top1:.0f}%)", str,
              f"the all-layer swap that loses least on the {names[m]} model", "dropin")
        worst = a.loc[a.dloss.idxmax()]
        F.add(f"dropin.{m}.worst", f"{worst.family} at budget {worst.budget:g} (+{worst.dloss:.2f} nats/byte)", str,
              f"the all-layer swap that loses most on the {names[m]} model", "dropin")
        c = corr[(corr.model == m) & (corr.family == "all families")].set_index("predictor")
        for p in ("head_err", "resid_err", "grad_bound", "grad_lin", "p_tv"):
            r = c.loc[p]
            F.add(f"dropin.{m}.rho_{p}", f"{r.rho:.2f} [{r.lo:.2f}, {r.hi:.2f}]", str,
                  f"Spearman's ρ (95% cluster-bootstrap interval over the {int(r.heads)} heads) over every one-head "
                  f"swap of the {names[m]} model (n = {int(r.n)}): {p} against the measured loss increase", "dropin")
        heads = dm[dm.scope == "head"]
        small = heads[heads.head_err > 0.3]
        F.add(f"dropin.{m}.harmless_share", (small.dloss.abs() <= 2 * small.dloss_se).mean(), pct,
              "share of one-head swaps with head error > 0.3 whose loss increase is within 2 SE of zero", "dropin")
    F.add("dropin.table", "\n".join(rows), str, "all layers swapped: loss increase per family and budget", "dropin")


def finetune(F, R):
    """The fine-tuning experiment (tools/finetune.py): how much of the drop-in loss training wins back per family at
    its default budget, against the exact control trained the same way, and a training step's time."""
    df = load_finetune(R)
    if df is None:
        return
    cfg = json.load(open(os.path.join(R, "finetune.csv.gz.config")))
    for key, fmt, what in (("steps", integer, "optimizer steps of each fine-tuning run"),
                           ("batch", integer, "512-byte sequences per step"), ("windows", integer, "held-out windows"),
                           ("lr", lambda x: f"{x:g}", "peak learning rate (warm-up 10%, cosine to 0)")):
        F.add(f"finetune.{key}", cfg[key], fmt, what, "finetune")
    F.add("finetune.seconds", cfg["seconds"], integer, "wall time of the whole run, both models (s; timing)",
          "finetune")
    F.add("finetune.timed_on", timed_on(R), str, "how the step times were taken (the run's .config)",
          "finetune")
    names = {"mlm": "masked-LM", "causal": "causal"}
    end = df[df.step == df.steps].set_index(["model", "family"])
    start = df[df.step == 0].set_index(["model", "family"])
    rows = [f"| model | family (default budget) | drop-in loss | after {int(cfg['steps'])} steps | gap closed | "
            "left: loss − exact's ± SE | time per step / exact's |", "|---|---|---|---|---|---|---|"]
    diverged, closed = [], {}
    for m in [m for m in names if m in set(df.model)]:
        ex0, ex1 = start.loc[(m, "exact")], end.loc[(m, "exact")]
        F.add(f"finetune.{m}.exact_before", ex0.heldout_loss, f3, f"{names[m]} model, exact control: held-out loss "
              "before fine-tuning (nats/byte)", "finetune")
        F.add(f"finetune.{m}.exact_after", ex1.heldout_loss, f3, "the same after the run", "finetune")
        F.add(f"finetune.{m}.exact_ms", 1e3 * ex1.time_per_step_s, integer, f"{names[m]} model: ms per training step "
              "with attnlab's exact attention (timing)", "finetune")
        for fam in [f for f in dict.fromkeys(df[df.model == m].family)]:
            a, b = start.loc[(m, fam)], end.loc[(m, fam)]
            if b.status != "ok":
                diverged.append(f"{fam} ({names[m]}: {b.status})")
            label = {"exact": "exact (control)", "torch": "PyTorch's own attention (control)"}.get(fam, fam)
            budget = [kv for kv in a.spec.partition(":")[2].split(",") if kv.split("=")[-1] == f"{a.budget:g}"]
            label += f" (`{budget[0]}`)" if budget and fam not in ("exact", "torch") else ""
            gc = "–" if math.isnan(b.gap_closed) else pct(b.gap_closed)
            left = "–" if fam in ("exact", "torch") or math.isnan(b.gap) else f"{b.gap:+.3f} ± {b.gap_se:.3f}"
            after = f"{b.heldout_loss:.3f}" if not math.isnan(b.heldout_loss) else "–"
            rows.append(f"| {names[m]} | {label} | {a.heldout_loss:.3f} | {after} | {gc} | {left} | "
                        f"{b.time_ratio_exact:.2f} |")
            if not math.isnan(b.gap_closed):
                closed[(m, fam)] = b.gap_closed
                F.add(f"finetune.{m}.{fam}.closed", b.gap_closed, pct, f"{names[m]} model, {fam}: the share of its "
                      "drop-in gap fine-tuning closed", "finetune")
    F.add("finetune.table", "\n".join(rows), str, "per model and family: held-out loss before and after fine-tuning, "
          "the share of the drop-in gap closed, the gap left with its paired SE, the time-per-step ratio (timing)",
          "finetune")
    F.add("finetune.diverged", "; ".join(diverged) or "none", str, "runs that diverged or failed", "finetune")
    ctrl = df[df.family.isin(["exact", "torch"])].pivot_table(index=["model", "step"], columns="family",
                                                               values="heldout_loss")
    F.add("finetune.torch_check", (ctrl["exact"] - ctrl["torch"]).abs().max(), lambda x: sig(x, 1),
          "largest |held-out loss with attnlab's exact attention − with PyTorch's| over every step of both controls "
          "(float32 training through two different backward passes)", "finetune")
    for m in names:
        mine = {f: v for (mm, f), v in closed.items() if mm == m}
        if mine:
            best, worst = max(mine, key=mine.get), min(mine, key=mine.get)
            F.add(f"finetune.{m}.most_closed", f"{best} ({pct(mine[best])})", str,
                  f"{names[m]} model: the family that closed the largest share of its drop-in gap", "finetune")
            F.add(f"finetune.{m}.least_closed", f"{worst} ({pct(mine[worst])})", str, "and the smallest", "finetune")
    fam = end[~end.index.get_level_values("family").isin(["exact", "torch"])]
    F.add("finetune.ratio_min", fam.time_ratio_exact.min(), f2, "smallest time-per-step ratio to exact over "
          "families and models (timing)", "finetune")
    F.add("finetune.ratio_max", fam.time_ratio_exact.max(), f2, "largest (timing)", "finetune")
    finetune_step0(F, R, start, names)
    F.add("finetune.load_max", df.time_load_avg.max(), f2, "the machine's largest 1-minute load average at the end "
          "of a unit (2 cores; the run itself keeps it near 2: above, other jobs shared the machine; timing)",
          "finetune")
    F.add("finetune.ratio_torch", end.loc[(slice(None), "torch"), "time_ratio_exact"].max(), f2,
          "PyTorch's own attention: time per step over attnlab's exact attention's, the larger of the two models "
          "(timing)", "finetune")


def finetune_step0(F, R, start, names):
    """Step 0 (float32) against the drop-in experiment's float64 loss for the same swap, where it measured one."""
    dd = load_dropin(R)
    same, differ = 0, []
    for (m, fam), a in (start.iterrows() if dd is not None else []):
        scope = dd[(dd.model == m) & (dd.scope == ("exact" if fam in ("exact", "torch") else "all"))]
        ref = scope if fam in ("exact", "torch") else scope[(scope.family == fam) &
                                                            ((scope.budget == a.budget) | (fam == "linear"))]
        if len(ref) != 1:
            continue
        if abs(a.heldout_loss - ref.loss.iloc[0]) <= 1e-5 * ref.loss.iloc[0]:
            same += 1
        else:
            differ.append(f"{fam} ({names[m]}: {a.heldout_loss:.3f} against {ref.loss.iloc[0]:.3f})")
    F.add("finetune.step0_same", same, integer, "(model, family) pairs whose step-0 loss (float32) equals the drop-in "
          "experiment's float64 loss of the same swap to 1e-5 (relative)", "finetune")
    F.add("finetune.step0_differ", "; ".join(differ) or "none", str, "the pairs where it does not, float32 against "
          "float64", "finetune")


def model_mix(F, R):
    """The report's choices applied together to the model (tools/model_report.py: results/report*/model_check.csv)."""
    for name, sub in (("mlm", "report"), ("causal", "report_causal")):
        path = os.path.join(R, sub, "model_check.csv")
        if not os.path.exists(path):
            continue
        d = pd.read_csv(path, keep_default_na=False).set_index("choice")
        for choice, key in (("per-head target", "per_head"), ("loss target", "loss_target")):
            if choice not in d.index:
                continue
            r = d.loc[choice]
            F.add(f"mix.{name}.{key}.heads", f"{r.heads_swapped} of {r.heads}", str,
                  f"heads swapped in the {choice} mix", "model_report")
            F.add(f"mix.{name}.{key}.speedup", float(r.attention_speedup), lambda x: sig(x, 2),
                  "its attention speed-up at the report's cost length (Σ exact / Σ chosen time; timing)",
                  "model_report")
            F.add(f"mix.{name}.{key}.dloss", f"{float(r.dloss):+.3f} ± {float(r.dloss_se):.3f}", str,
                  "its measured loss increase on held-out windows not used to choose (nats/byte)", "model_report")
            if key == "loss_target":
                F.add(f"mix.{name}.target", float(r.loss_target), lambda x: sig(x, 2), "the loss target (nats/byte)",
                      "model_report")
                if "fit_dloss" in r:
                    F.add(f"mix.{name}.fit_dloss", f"{float(r.fit_dloss):+.3f} ± {float(r.fit_dloss_se):.3f}", str,
                          "the loss-target mix's increase on the windows it was chosen on (optimistic)", "model_report")
                F.add(f"mix.{name}.verdict", "within" if float(r.dloss) <= float(r.loss_target) else "above", str,
                      "the held-out loss increase of the loss-target mix: within or above the target", "model_report")


def pinv(F, R):
    d = load(R, "pinv")
    it = d[d.metric == "iterations_to_1e-6"]
    for v, key in (("order3", "order3"), ("newton", "newton")):
        F.add(f"pinv.iters_{key}_gaussian", pick(it, source="gaussian", variant=v, spec="landmarks=64").median(),
              integer, f"iterations of {v} to ‖I − AZ‖_F ≤ 1e-6 on Gaussian landmark matrices, m = 64", "pinv")
    cond = d[(d.metric == "cond") & (d.source == "trained")]
    for m in (64, 128):
        F.add(f"pinv.cond_trained_{m}", cond[cond.step == m]["value"].median(), lambda x: sig(x, 1),
              f"trained heads: median condition number of the landmark matrix at m = {m}", "pinv")
    F.add("pinv.cond_gaussian_64", pick(d, source="gaussian", metric="cond", step=64).median(), lambda x: sig(x, 1),
          "Gaussian inputs: condition number of the landmark matrix at m = 64", "pinv")
    res = d[(d.metric == "residual") & (d.source == "gaussian") & (d.spec == "landmarks=64") & (d.variant == "order3")]
    F.add("pinv.residual6_gaussian", res[res.step == 6]["value"].median(), lambda x: sig(x, 2),
          "Gaussian inputs, m = 64: ‖I − AZ_6‖_F after the paper's 6 order-3 iterations", "pinv")
    e = d[(d.metric == "nystrom_out_rel_fro") & (d.spec == "landmarks=64") & (d.variant == "order3")]
    e = e[e.step.notna()].assign(k=lambda x: x.step.astype(int))
    tr = e[e.source == "trained"].groupby("k")["value"].median()
    F.add("pinv.best_iter_trained", tr.idxmin(), integer, "trained heads, m = 64: order-3 iterations at which "
          "Nyström's output error is lowest (median over heads)", "pinv")
    F.add("pinv.best_err_trained", tr.min(), f2, "that lowest error", "pinv")
    F.add("pinv.last_err_trained", tr.iloc[-1], lambda x: sig(x, 2), f"the error after {tr.index[-1]} iterations",
          "pinv")
    F.add("pinv.last_iter", tr.index[-1], integer, "the largest iteration count of the sweep", "pinv")
    g = e[e.source == "gaussian"].groupby("k")["value"].median()
    F.add("pinv.best_iter_gaussian", g.idxmin(), integer, "Gaussian inputs, m = 64: the iteration count with the "
          "lowest Nyström output error", "pinv")
    svd = d[(d.metric == "nystrom_out_rel_fro") & (d.spec == "landmarks=64") & (d.variant == "svd")]
    F.add("pinv.svd_err_gaussian", svd[svd.source == "gaussian"]["value"].median(), lambda x: sig(x, 2),
          "Gaussian inputs, m = 64: Nyström's output error with the SVD pseudo-inverse", "pinv")
    F.add("pinv.err6_gaussian", g.get(6, float("nan")), f2, "the same with the paper's 6 order-3 iterations", "pinv")


def model(F):
    meta = json.load(open(EXPORT))
    loss = meta.get("held_out_loss_nats", {})
    if loss:
        F.add("model.loss_initialized", loss["initialized"], f2, "held-out loss of the initialised model (nats/byte)",
              "trained_attention")
        F.add("model.loss_trained", loss["trained"], f2, "held-out loss of the trained model (nats/byte)",
              "trained_attention")


def bench(F, results):
    """The side-by-side benchmark's float32 table (results/bench/merged.csv, written by tools/plot_bench.py)."""
    path = os.path.join(results, "bench", "merged.csv")
    if not os.path.exists(path):
        return
    d = pd.read_csv(path)
    d = d[(d.dtype == "f32") & d.n.isin([4096, 16384]) & (d.method != "gemm")]
    if "build" not in d:
        d = d.assign(build="default")
    num = lambda x: "–" if x != x else f"{x:.3g}"  # noqa: E731
    builds = [b for b in ("default", "fast") if b in set(d.build)]
    both = lambda col, g: " / ".join(num(g[g.build == b][col].iloc[0]) if (g.build == b).any() else "–"  # noqa: E731
                                     for b in builds)
    head = " / ".join(builds)
    rows = [f"| method | n = 4096 (s), {head} | exact / method, {head} | n = 16384 (s), {head} | PyTorch eager (s) | "
            f"PyTorch / attnlab, {head} |", "|---|---|---|---|---|---|"]
    for m, g in d.groupby("method"):
        a, b = g[g.n == 4096], g[g.n == 16384]
        if a.empty or b.empty:
            continue
        rows.append(f"| {m} | {both('attnlab_s', a)} | {both('speedup_vs_exact', a)} | {both('attnlab_s', b)} | "
                    f"{num(b.torch_s.iloc[0])} | {both('torch_over_attnlab', b)} |")
    F.add("bench.table_f32", "\n".join(rows), str, "the float32 table of results/bench (timing)", "bench")
    # The device that table holds for, as the run's context recorded it.
    ctx_path = os.path.join(results, "bench", "attnlab.json")
    if os.path.exists(ctx_path):
        ctx = json.load(open(ctx_path)).get("context", {})
        cpu = ctx.get("attnlab_cpu") or "a CPU whose model that run did not record"
        F.add("bench.device", f"{cpu} ({ctx.get('num_cpus', '?')} CPUs at {ctx.get('mhz_per_cpu', '?')} MHz; "
              f"{ctx.get('attnlab_cost_context', '')})", str, "the machine the benchmark table was measured on",
              "bench")
    # The allocator setting: the default build and PyTorch with glibc's defaults and with GLIBC_TUNABLES.
    a, _ = allocator_frame(os.path.join(results, "bench"))
    if a is not None:
        a = a[(a.dtype == "f32") & a.n.isin([4096, 16384]) & (a.method != "gemm")]
        rows = ["| method | attnlab without / with, n = 4096 | n = 16384 | PyTorch without / with, n = 4096 "
                "| n = 16384 |",
                "|---|---|---|---|---|"]
        for m, g in a.groupby("method"):
            r = lambda col, n: g[g.n == n][col].iloc[0] if (g.n == n).any() else float("nan")  # noqa: E731
            rows.append(f"| {m} | {num(r('ratio', 4096))} | {num(r('ratio', 16384))} | "
                        f"{num(r('torch_ratio', 4096))} | {num(r('torch_ratio', 16384))} |")
        F.add("bench.allocator_f32", "\n".join(rows), str, "float32: time without GLIBC_TUNABLES over time with it, "
              "attnlab's default build and PyTorch (timing)", "bench")
        F.add("bench.allocator_worst", a.ratio.max(), lambda x: sig(x, 2),
              "the largest such ratio over attnlab's methods, float32, n = 4096 and 16384 (timing)", "bench")
    # Each method's parallel efficiency (tools/bench_threads.py: the scaling run at 1 and 2 threads, one run).
    threads_csv = os.path.join(results, "bench", "threads.csv")
    if os.path.exists(threads_csv):
        import bench_threads  # tools/: the table is its own function, so the page and the tool agree
        rows = pd.read_csv(threads_csv).to_dict("records")
        md, summary = bench_threads.table(rows)
        F.add("bench.threads_table", md.strip(), str, "tools/bench_threads.py: every method at 1 and 2 threads "
              "(timing)", "bench")
        F.add("bench.threads_device", rows[0]["device"], str, "the CPU bench_threads.py ran on", "bench")
        for spec, short in (("probsparse", "probsparse"), ("nystrom", "nystrom"), ("exact:impl=streaming", "exact")):
            x = [r for r in summary if r["n"] == 16384 and r["spec"].startswith(spec)]
            if x:
                F.add(f"bench.threads_{short}_speedup", x[0]["speedup"], lambda v: f"{v:.2f}×",
                      f"{short}: speed-up from 1 to 2 threads, float32, n = 16384 (timing)", "bench")
    # attnlab's exact against PyTorch's fused exact attention on the same CPU (tools/bench_exact_peer.py, one run).
    peer_csv = os.path.join(results, "bench", "exact_peer.csv")
    if os.path.exists(peer_csv):
        import bench_exact_peer  # tools/: the page and the tool draw the same table
        rows = pd.read_csv(peer_csv, keep_default_na=False).to_dict("records")
        md, summary = bench_exact_peer.table(rows)
        F.add("bench.exact_peer_table", md.strip(), str, "tools/bench_exact_peer.py: attnlab's exact against PyTorch's "
              "SDPA, float32 (timing)", "bench")
        F.add("bench.exact_peer_device", rows[0]["device"], str, "the CPU it ran on", "bench")
        peer = next(r for r in rows if r["impl"] != "attnlab")
        F.add("bench.exact_peer_torch", peer["detail"].split(",")[0], str, "the peer's PyTorch", "bench")
        for s_ in summary:
            d, n, t = s_["d"], s_["n"], s_["threads"]
            for b, ratio in s_["ratios"].items():
                if ratio is not None:
                    F.add(f"bench.exact_peer_{b}_d{d}_{n}_t{t}", ratio, lambda x: f"{x:.2f}×",
                          f"attnlab's exact ({b} build) / PyTorch SDPA, float32, d = {d}, n = {n}, {t} thread(s) "
                          "(timing)", "bench")
            if s_["peer_s"]:
                F.add(f"bench.exact_peer_sdpa_ms_d{d}_{n}_t{t}", s_["peer_s"] * 1e3, lambda x: sig(x, 3),
                      f"PyTorch SDPA, float32, d = {d}, n = {n}, {t} thread(s), ms (timing)", "bench")
            F.add(f"bench.exact_peer_fastest_d{d}_{n}_t{t}", s_["fastest"], str,
                  f"the fastest float32 exact attention measured, d = {d}, n = {n}, {t} thread(s)", "bench")
    paths = os.path.join(results, "bench", "cost_paths.md")
    if os.path.exists(paths):
        F.add("bench.cost_paths", open(paths).read().strip(), str, "tools/cost_paths.py: every path's cost of the "
              "same methods in one run (timing)", "bench")


def bench_backward(F, results):
    """The backward suite (results/bench/backward_merged.csv, tools/plot_bench.py): float32, n = 16384, attnlab's
    backward and training step against PyTorch autograd of the eager transcriptions; exact's rate against the GEMM."""
    path = os.path.join(results, "bench", "backward_merged.csv")
    if not os.path.exists(path):
        return
    d = pd.read_csv(path)
    d = d[(d.dtype == "f32") & (d.method != "gemm")]
    num = lambda x: "–" if x != x else f"{x:.3g}"  # noqa: E731
    builds = [b for b in ("default", "fast") if b in set(d.build)]
    head = " / ".join(builds)
    big = d[d.n == 16384]
    one = lambda g, b, col: num(g[g.build == b][col].iloc[0]) if (g.build == b).any() else "–"  # noqa: E731
    rows = [f"| method | backward (s), {head} | PyTorch autograd backward (s) | PyTorch / attnlab, {head} | "
            f"step (s), {head} | PyTorch step (s) | step: PyTorch / attnlab, {head} |", "|---|---|---|---|---|---|---|"]
    for m, g in big.groupby("method"):
        if g.torch_backward_s.isna().all():
            continue
        cols = lambda col: " / ".join(one(g, b, col) for b in builds)  # noqa: E731
        rows.append(f"| {m} | {cols('backward_s')} | {num(g.torch_backward_s.iloc[0])} | "
                    f"{cols('torch_over_attnlab_backward')} | {cols('step_s')} | {num(g.torch_step_s.iloc[0])} | "
                    f"{cols('torch_over_attnlab_step')} |")
    F.add("bench.backward_f32", "\n".join(rows), str, "float32, n = 16384: backward and step against PyTorch autograd "
          "(timing)", "bench")
    with_peer = big[big.torch_backward_s.notna() & (big.method != "exact")]
    F.add("bench.backward_worst", with_peer.torch_over_attnlab_backward.min(), lambda x: sig(x, 2),
          "the smallest PyTorch / attnlab backward ratio of the approximations at n = 16384, float32, any build "
          "(timing)", "bench")
    F.add("bench.backward_worst_method",
          with_peer.loc[with_peer.torch_over_attnlab_backward.idxmin(), "method"] if len(with_peer) else "–", str,
          "which method that is (timing)", "bench")
    e = d[(d.method == "exact") & (d.n == 16384)].set_index("build")
    for b in builds:
        if b in e.index:
            F.add(f"bench.exact_backward_gemm_fraction_{b}", e.loc[b, "gemm_fraction"], f2,
                  f"exact backward's rate (10·n²·d flops) over the best in-run GEMM rate, {b} build, float32, "
                  "n = 16384 (timing)", "bench")
            F.add(f"bench.exact_backward_gflops_{b}", e.loc[b, "exact_gflops"], lambda x: sig(x, 3),
                  f"exact backward's GFLOP/s, {b} build, float32, n = 16384 (timing)", "bench")


def spectrum_solvers(F, results):
    """The block-vs-Lanczos run (results/bench/spectrum_solvers.md, written by tools/bench_spectrum.py from its CSVs
    and numpy's SVD): its two tables, quoted whole."""
    path = os.path.join(results, "bench", "spectrum_solvers.md")
    if not os.path.exists(path):
        return
    text = open(path).read().split("\n", 2)[2].strip()   # without the title
    F.add("bench.spectrum_solvers", text.replace("## ", "### "), str,
          "results/bench/spectrum_solvers.md (tools/bench_spectrum.py; timing)", "bench")


def hms(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min" if seconds >= 3600 else \
        f"{seconds // 60} min {seconds % 60:02d} s"


def paper(F, results):
    """The paper preset's run (results/paper): time per experiment, and the large-n spectra."""
    pdir = os.path.join(results, "paper")
    path = os.path.join(pdir, "timings.csv")
    if not os.path.exists(path):
        return
    t = pd.read_csv(path).groupby("experiment", sort=False).agg(seconds=("seconds", "sum"), cores=("cores", "max"))
    total = t.seconds.sum()
    rows = ["| experiment | time | share |", "|---|---|---|"]
    rows += [f"| `{e}` | {hms(r.seconds)} | {100 * r.seconds / total:.0f}% |" for e, r in t.iterrows()]
    F.add("paper.timings", "\n".join(rows), str, "results/paper/timings.csv per experiment (timing)", "paper")
    F.add("paper.total", hms(total), str, "the paper preset's experiments, wall-clock in all (timing)", "paper")
    F.add("paper.cores", int(t.cores.max()), str, "cores of the machine that ran it", "paper")
    if os.path.exists(os.path.join(pdir, "dropin.csv.gz")):
        dd = load_dropin(pdir)
        F.add("paper.dropin.windows", int(dd.windows.iloc[0]), integer, "held-out windows per model (paper)", "paper")
        c = correlations(dd)
        c = c[c.family == "all families"]
        for _, r in c.iterrows():
            F.add(f"paper.dropin.{r.model}.rho_{r.predictor}", f"{r.rho:.2f} [{r.lo:.2f}, {r.hi:.2f}]", str,
                  f"Spearman's ρ (cluster-bootstrap 95% interval over heads), every one-head swap of the {r.model} "
                  f"model at every budget (n = {int(r.n)}): {r.predictor} against the loss increase (paper)", "paper")
    d = load(pdir, "spectrum")
    top = d[(d.spec == "block") & (d.metric == "top_singular_value")]
    nmax = top.n.max()
    big = d[(d.spec == "block") & (d.n == nmax)]
    F.add("paper.topk_nmax", int(nmax), str, "largest n of the matrix-free spectra", "paper")
    F.add("paper.topk_k", int(top.step.max()) + 1, str, "k of the matrix-free spectra", "paper")
    F.add("paper.topk_points", len(big[big.metric == "time_s"]), str, "matrix-free spectra at that n", "paper")
    F.add("paper.topk_time_median", big[big.metric == "time_s"].value.median(), lambda x: sig(x, 2),
          "median time of one of them (s; timing)", "paper")
    F.add("paper.topk_time_max", big[big.metric == "time_s"].value.max(), lambda x: sig(x, 2),
          "slowest of them (s; timing)", "paper")
    F.add("paper.topk_products_median", big[big.metric == "products"].value.median(), lambda x: f"{x:.0f}",
          "median number of block products with P or Pᵀ", "paper")
    F.add("paper.topk_max_residual", big[big.metric == "residual"].value.max(), lambda x: f"{x:.1e}",
          "largest residual ‖Pᵀu − σv‖/σ₁ over every value of them", "paper")


def gradient_family(d):
    """A gradients row's family as the budget families name it (linformer by projection, Nyström's SVD variant)."""
    proj = d["spec"].str.extract(r"projection=(\w+)")[0].fillna("")
    fam = d["method"].where(d["method"] != "linformer", "linformer_" + proj)
    return fam.where(~((d["method"] == "nystrom") & d["spec"].str.contains("pinv=svd")), "nystrom_svd")


def gradients(F, R):
    """The gradients experiment: each method's dQ, dK, dV against exact attention's, beside its output error."""
    d = load(R, "gradients")
    # The grid these findings were defined on: the generated problems and the small transformers' heads; the
    # pretrained model's heads (source pretrained, tools/pretrained.py) would shift the pooled correlations.
    d = d[d.source != "pretrained"]
    d = d.assign(family=gradient_family(d))
    key = ["source", "variant", "seed", "layer", "head", "spec", "family"]
    wide = d.pivot_table(index=key, columns="metric", values="value", dropna=False).reset_index()
    wide = wide.dropna(subset=["output_rel_fro"])
    # Does the output error predict the gradient error? Spearman's rank correlation over every point (method, budget,
    # problem, upstream gradient).
    for g in ("dq", "dk", "dv"):
        F.add(f"gradients.rho_{g}", wide["output_rel_fro"].rank().corr(wide[f"{g}_rel_fro"].rank()), f2,
              f"Spearman correlation of the output error and the {g} error over every point", "gradients")
    F.add("gradients.points", len(wide), integer, "points (method, budget, problem, upstream gradient)", "gradients")
    # Per family at its default budget on the trained masked-LM's heads with the model's own dO (median over heads).
    t = wide[(wide.source == "trained") & (wide.variant == "dO=model") & (wide.default_budget == 1)]
    med = t.groupby("family")[["output_rel_fro", "dq_rel_fro", "dk_rel_fro", "dv_rel_fro"]].median()
    med["ratio"] = med[["dq_rel_fro", "dk_rel_fro"]].max(axis=1) / med["output_rel_fro"]
    med = med.sort_values("output_rel_fro")
    spec = t.groupby("family")["spec"].first()
    rows = ["| family (default budget) | output | dQ | dK | dV | max(dQ, dK) / output |", "|---|---|---|---|---|---|"]
    rows += [f"| `{re.sub(r',?seed=[0-9]+', '', spec[f])}` | {sig(r.output_rel_fro)} | {sig(r.dq_rel_fro)} | "
             f"{sig(r.dk_rel_fro)} | {sig(r.dv_rel_fro)} | {sig(r.ratio)} |" for f, r in med.iterrows()]
    F.add("gradients.default_table", "\n".join(rows), str,
          "per family at its default budget, trained masked-LM heads, the model's own dO: median relative errors",
          "gradients")
    worst = med["ratio"].idxmax()
    F.add("gradients.worst_family", worst, str, "family whose dQ/dK error exceeds its output error the most",
          "gradients")
    F.add("gradients.worst_ratio", med.loc[worst, "ratio"], f2, "that ratio (median over heads)", "gradients")
    F.add("gradients.worse_than_output", ", ".join(f for f in med.index if med.loc[f, "ratio"] > 2), str,
          "families whose dQ or dK error is more than twice their output error (trained heads, default budget)",
          "gradients")


def pretrained(F, R):
    """The pretrained all-MiniLM-L6-v2 (tools/pretrained.py, tools/pretrained_study.py): Linformer's Fig. 1 on its
    heads, what it loses with each family swapped in, which head measure predicts that, and fine-tuning."""
    spec_path = os.path.join(R, "spectrum.csv.gz")
    if os.path.exists(spec_path):
        d = load(R, "spectrum")
        t = per_head(d[d.source == "pretrained"], "cumulative_at_128")
        if len(t):
            F.add("pretrained.spectrum_heads", len(t), integer, "pretrained heads in the spectrum experiment (layers "
                  "× heads, n = 512)", "pretrained")
            F.add("pretrained.at128_median", t.median(), f2, "all-MiniLM-L6-v2: median over heads of the normalized "
                  "cumulative singular value at index 128 of P (n = 512; per head the median over sequences)",
                  "pretrained")
            F.add("pretrained.at128_min", t.min(), f2, "its smallest over heads", "pretrained")
            F.add("pretrained.at128_max", t.max(), f2, "its largest over heads", "pretrained")
            F.add("pretrained.at128_above_90", (t > 0.9).mean(), pct, "share of its heads whose top 128 singular "
                  "values hold over 90% of the spectrum's sum", "pretrained")
    df = load_pretrained(R, "dropin")
    if df is not None:
        ex = df[df.scope == "exact"].iloc[0]
        F.add("pretrained.exact_loss", ex.loss, f3, "all-MiniLM-L6-v2's contrastive loss on the held-out summary → "
              "passage pairs (nats per pair; chance: ln 8 = 2.08)", "pretrained")
        F.add("pretrained.exact_loss_se", ex.loss_se, f3, "its standard error over pairs", "pretrained")
        F.add("pretrained.pairs", ex.pairs, integer, "held-out pairs of the all-layer drop-in", "pretrained")
        F.add("pretrained.hit1", ex.hit1, pct, "the exact model's share of summaries whose own passage it ranks first "
              "among every held-out passage", "pretrained")
        F.add("pretrained.check", ex.max_abs_own, lambda x: sig(x, 1), "largest |per-pair loss through attnlab's "
              "exact attention − the model's own forward| (float64)", "pretrained")
        a = df[df.scope == "all"]
        rows = ["| family | budget: loss increase ± SE (nats per pair) | embedding cosine (mean) | recall@10 |",
                "|---|---|---|---|"]
        for fam, g in a.groupby("family", sort=False):
            cells = ", ".join((f"{b:g}: " if fam != "linear" else "") + f"{x:+.3f} ± {se:.3f}"
                              for b, x, se in zip(g.budget, g.dloss, g.dloss_se))
            cos = " / ".join(f"{c:.2f}" for c in g.cos_mean)
            rec = " / ".join(f"{c:.2f}" for c in g.recall10)
            rows.append(f"| {fam} | {cells} | {cos} | {rec} |")
        F.add("pretrained.table", "\n".join(rows), str, "all-MiniLM-L6-v2, every layer swapped: loss increase, "
              "embedding cosine and retrieval agreement per family and budget", "pretrained")
        best = a.loc[a.dloss.idxmin()]
        F.add("pretrained.best", f"{best.family} at budget {best.budget:g} ({best.dloss:+.3f} ± {best.dloss_se:.3f} "
              f"nats per pair, recall@10 {best.recall10:.2f})", str, "the all-layer swap that loses least",
              "pretrained")
        worst = a.loc[a.dloss.idxmax()]
        F.add("pretrained.worst", f"{worst.family} at budget {worst.budget:g} ({worst.dloss:+.2f} nats per pair, "
              f"recall@10 {worst.recall10:.2f})", str, "the all-layer swap that loses most", "pretrained")
        within = a[a.dloss.abs() <= 2 * a.dloss_se]
        F.add("pretrained.harmless", ", ".join(f"{f} {b:g}" if f != "linear" else f for f, b in
                                              zip(within.family, within.budget)) or "none", str,
              "all-layer swaps whose loss increase is within 2 SE of zero", "pretrained")
        F.add("pretrained.recall_max", a.recall10.max(), f2, "the best recall@10 of any all-layer swap", "pretrained")
    pred_path = os.path.join(R, "pretrained_predictors.csv.gz")
    if os.path.exists(pred_path):
        pr = pd.read_csv(pred_path)
        heads = load_pretrained(R, "heads")
        allf = pr[pr.family == "all families"].set_index("measure")
        for m in allf.index:
            r = allf.loc[m]
            F.add(f"pretrained.rho_{m}", f"{r.rho:.2f} [{r.lo:.2f}, {r.hi:.2f}]", str,
                  f"all-MiniLM-L6-v2: Spearman's ρ (95% cluster-bootstrap interval over its {int(r.heads)} heads) of "
                  f"{m} with the one-head swaps' loss increase (n = {int(r.pairs)})", "pretrained")
        if heads is not None:
            h = heads[heads.scope == "head"]
            F.add("pretrained.head_specs", ", ".join(f"`{s.split(',')[0]}`" for s in dict.fromkeys(h.spec)), str,
                  "the one-head swaps' methods", "pretrained")
            F.add("pretrained.head_pairs", int(heads.pairs.iloc[0]), integer, "pairs the one-head swaps were "
                  "measured on", "pretrained")
            F.add("pretrained.head_significant", (h.dloss.abs() > 2 * h.dloss_se).mean(), pct, "share of one-head "
                  "swaps whose loss change is beyond 2 SE", "pretrained")
    ft = load_pretrained(R, "finetune")
    if ft is not None:
        steps = int(ft.step.max())
        F.add("pretrained.ft_steps", steps, integer, "fine-tuning steps (batches of 8 training pairs, float32)",
              "pretrained")
        rows = [f"| family (default budget) | gap at step 0 ± SE | after {steps} steps ± SE | gap closed | "
                "time per step / exact's |", "|---|---|---|---|---|"]
        ex = ft[(ft.arm == "exact") & (ft.step == steps)]
        t_exact = float(ex.time_per_step_s.iloc[0]) if len(ex) else math.nan
        for fam, g in ft[ft.arm == "method"].groupby("family", sort=False):
            a0, a1 = g[g.step == 0].iloc[0], g[g.step == steps].iloc[0]
            gc = "–" if math.isnan(a1.gap_closed) else pct(a1.gap_closed)
            rows.append(f"| {fam} (`{a0.spec.split(',seed')[0]}`) | {a0.gap:+.3f} ± {a0.gap_se:.3f} | "
                        f"{a1.gap:+.3f} ± {a1.gap_se:.3f} | {gc} | {a1.time_per_step_s / t_exact:.2f} |")
        F.add("pretrained.ft_table", "\n".join(rows), str, "all-MiniLM-L6-v2 fine-tuned with each family swapped "
              "in against an exact control trained alike", "pretrained")
        e0, e1 = ft[(ft.arm == "exact") & (ft.step == 0)].iloc[0], ft[(ft.arm == "exact") & (ft.step == steps)].iloc[0]
        F.add("pretrained.ft_exact", f"{e0.loss:.3f} → {e1.loss:.3f}", str, "the exact control's held-out loss "
              "before and after its fine-tuning (nats per pair)", "pretrained")


def gpu(F, results):
    """tools/bench_gpu.py's committed GPU run (results/bench/gpu_h200.csv): eager PyTorch transcriptions of the
    methods against PyTorch's fused exact attention, bfloat16, d = 64, one sequence of 16 heads, forward."""
    path = os.path.join(results, "bench", "gpu_h200.csv")
    if not os.path.exists(path):
        return
    import bench_gpu   # its crossover definition, declared once there
    d = pd.read_csv(path)
    d = d[(d.dtype == "bf16") & (d.d == 64) & (d["pass"] == "fwd") & (~d.causal) & (d.status == "ok")]
    dev = d.device_name.iloc[0]
    F.add("gpu.device", f"{dev} (PyTorch {d.torch.iloc[0]}, CUDA {d.cuda.iloc[0]})", str,
          "the GPU and software of the committed bench_gpu run", "gpu")
    ex = d[d.method == "exact"].set_index("n").ms
    for n in (4096, 65536):
        F.add(f"gpu.exact_ms_{n}", ex[n], lambda x: sig(x, 2), f"PyTorch's fused exact attention, bf16, n = {n}, "
              "16 heads, d = 64, forward (ms; timing)", "gpu")
    for m in ("linear", "performer", "nystrom", "linformer", "local", "reformer"):
        g = d[d.method == m].set_index("n").ms
        s = {n: ex[n] / g[n] for n in g.index if n in ex.index}
        F.add(f"gpu.{m}_4096", s[4096], lambda x: sig(x, 2), f"{m}: exact time / method time at n = 4096 on the GPU, "
              "bf16 (timing)", "gpu")
        F.add(f"gpu.{m}_crossover", bench_gpu.crossover_text(bench_gpu.crossover(list(s), list(s.values()))), str,
              f"{m}: the length from which it is faster than fused exact attention on the GPU, bf16 (timing)", "gpu")


def precision(F, R):
    """The `precision` experiment: each method in emulated bf16 / fp16 storage, eager and careful (CPU emulation:
    core/precision.hpp; the same values on every x86-64 CPU)."""
    d = load(R, "precision")
    m = d["variant"].fillna("").str.extract(r"T=([0-9.eE+-]+)\s*(\w*)")
    d = d.assign(t=m[0].astype(float), policy=m[1].fillna(""))
    n = int(d.n.max())
    g = d[(d.source == "gaussian") & (d.seed == 0)]
    names = {"nystrom:landmarks=64,pinv=svd": "nystrom_svd64", "linformer:k=256,projection=pool": "linformer_pool256",
             "exact:impl=materialized": "exact_mat", "exact:impl=streaming": "exact_stream", "linear": "linear",
             "performer:features=256": "performer256", "performer:features=64": "performer64",
             "linformer:k=256": "linformer256", "linformer:k=64": "linformer64", "local:window=64": "local64",
             "local:window=16": "local16", "nystrom:landmarks=64": "nystrom64", "nystrom:landmarks=16": "nystrom16",
             "reformer:buckets=8,rounds=2,chunk=64": "reformer64", "reformer:buckets=8,rounds=2,chunk=32": "reformer32",
             "probsparse:factor=5": "probsparse5", "probsparse:factor=2": "probsparse2", "vq:codes=64": "vq64",
             "vq:codes=16": "vq16", "scatterbrain:": "scatterbrain"}

    def short(spec):
        for k, v in names.items():
            if spec.startswith(k):
                return v
        return None

    g = g.assign(short=g.spec.map(short))
    for s in names.values():
        c = g[(g.short == s) & (g.n == n) & (g.t == 1)]
        if c.empty:
            continue
        if not s.startswith("exact"):
            F.add(f"precision.{s}_approx", pick(c, dtype="fp64", metric="err_total").iloc[0], lambda x: sig(x, 2),
                  f"{s}: approximation error against exact attention in float64, gaussian, n = {n}, t = 1",
                  "precision")
        for fmt in ("bf16", "fp16"):
            for pol in ("eager", "careful"):
                e = c[(c.dtype == fmt) & (c.policy == pol)]
                if (e.metric == "refused").any():
                    text, value = "not emulated", "not emulated"
                elif (e[e.metric.isin(["nonfinite", "zero_rows"])].value > 0).any():
                    nf = int(pick(e, metric="nonfinite").iloc[0])
                    zr = int(pick(e, metric="zero_rows").iloc[0])
                    value = f"fails ({nf} non-finite entries, {zr} zero rows)"
                else:
                    value = sig(pick(e, metric="err_rounding").iloc[0], 2)
                F.add(f"precision.{s}_{fmt}_{pol}", value, str,
                      f"{s} in emulated {fmt} storage, {pol} policy: rounding error against its own float64 output "
                      f"(or the failure), gaussian, n = {n}, d = 64, t = 1", "precision")
                # The first temperature (at the longest n) and the first n (at t = 1) at which the output fails.
                a = g[(g.short == s) & (g.dtype == fmt) & (g.policy == pol)]
                bad = a[a.metric.isin(["nonfinite", "zero_rows"]) & (a.value > 0)]
                at_n = bad[bad.n == n].t
                F.add(f"precision.{s}_{fmt}_{pol}_fails_t", f"t = {at_n.min():g}" if len(at_n) else "none", str,
                      f"{s}, {fmt}, {pol}: the smallest temperature (of {sorted(set(a.t))}) at which the output has "
                      f"non-finite entries or all-zero rows, gaussian, n = {n}", "precision")
                at_t = bad[bad.t == 1].n
                F.add(f"precision.{s}_{fmt}_{pol}_fails_n", f"n = {at_t.min()}" if len(at_t) else "none", str,
                      f"{s}, {fmt}, {pol}: the shortest length (of {sorted(set(a.n))}) at which the output has "
                      "non-finite entries or all-zero rows, gaussian, t = 1", "precision")
    # The emulated backward (exact's two paths, the pattern softmax, ProbSparse's exact rows, the kernel methods,
    # Linformer, Nyström): dQ's rounding error, and where the gradients fail.
    for s in ("exact_stream", "exact_mat", "local64", "reformer64", "probsparse5", "linear", "performer256",
              "performer64", "linformer256", "nystrom64", "nystrom_svd64", "scatterbrain"):
        c = g[(g.short == s) & (g.n == n) & (g.t == 1)]
        for fmt in ("bf16", "fp16"):
            for pol in ("eager", "careful"):
                e = c[(c.dtype == fmt) & (c.policy == pol)]
                for grad in ("dq", "dv"):
                    x = e[e.metric == f"err_{grad}"]
                    if len(x):
                        F.add(f"precision.{s}_{fmt}_{pol}_{grad}", x.value.iloc[0], lambda v: sig(v, 2),
                              f"{s}: rounding error of {grad} (backward) against its own float64 gradient, {fmt} "
                              f"{pol}, gaussian, n = {n}, t = 1", "precision")
    for s in ("performer256", "performer64", "linear", "nystrom_svd64"):
        for fmt in ("bf16", "fp16"):
            for pol in ("eager", "careful"):
                a = g[(g.short == s) & (g.dtype == fmt) & (g.policy == pol) & (g.metric == "grad_nonfinite")]
                bad = a[a.value > 0]
                at_n, at_t = bad[bad.n == n].t, bad[bad.t == 1].n
                F.add(f"precision.{s}_{fmt}_{pol}_grad_fails_t", f"t = {at_n.min():g}" if len(at_n) else "none", str,
                      f"{s}, {fmt}, {pol}: the smallest temperature (of {sorted(set(a.t))}) at which dQ, dK or dV "
                      f"has non-finite entries, gaussian, n = {n}", "precision")
                F.add(f"precision.{s}_{fmt}_{pol}_grad_fails_n", f"n = {at_t.min()}" if len(at_t) else "none", str,
                      f"{s}, {fmt}, {pol}: the shortest length (of {sorted(set(a.n))}) at which dQ, dK or dV has "
                      "non-finite entries, gaussian, t = 1", "precision")
    gb = d[d.metric == "grad_nonfinite"]
    F.add("precision.grad_nonfinite", int(gb.value.sum()), str,
          "non-finite gradient entries over every emulated backward of the precision experiment", "precision")
    def failing(rows, with_policy):
        """'spec in fmt [policy] (source k of m, ...)' over the specs with a failing cell (k of the m cells, lengths or
        heads × temperatures, of that source)."""
        parts = []
        by = ["spec", "dtype"] + (["policy"] if with_policy else [])
        for keys, c in rows.assign(bad=lambda x: x.value > 0).groupby(by):
            if not c.bad.any():
                continue
            where = ", ".join(f"{src} {int(x.bad.sum())} of {len(x)}" for src, x in c.groupby("source")
                              if x.bad.any())
            parts.append(f"{short(keys[0]) or keys[0]} in {' '.join(keys[1:])} ({where})")
        return "; ".join(parts) if parts else "none"

    # Where even the careful policy's gradients fail, and where any output or gradient fails: per spec, format (and
    # policy), the sources and how many of their cells.
    F.add("precision.careful_grad_fails", failing(gb[gb.policy == "careful"], False), str,
          "where the careful policy's gradients have non-finite entries: spec, format, and per source the cells "
          "(lengths or heads × temperatures) that do", "precision")
    out_bad = d[d.metric.isin(["nonfinite", "zero_rows"]) & d.dtype.isin(["bf16", "fp16"])]
    out_bad = out_bad.groupby(["spec", "dtype", "policy", "source", "n", "sequence", "layer", "head", "t"],
                              dropna=False).value.max().reset_index()
    F.add("precision.output_fails", failing(out_bad, True), str,
          "every spec, format and policy whose output has non-finite entries or all-zero rows somewhere in the grid, "
          "with per source the failing cells", "precision")
    F.add("precision.grad_fails", failing(gb[gb.dtype.isin(["bf16", "fp16"])], True), str,
          "every spec, format and policy whose dQ, dK or dV has non-finite entries somewhere in the grid, with per "
          "source the failing cells", "precision")
    # dQ, dK and dV apart (the experiment's grad_nonfinite_dq, _dk, _dv): on Gaussian heads, per spec, format and
    # policy whose gradients fail, each gradient's first failing length at t = 1 and temperature at the longest n.
    split = []
    gs = g[g.metric.str.startswith("grad_nonfinite_") & g.dtype.isin(["bf16", "fp16"])]
    for (spec, fmt, pol), c in gs.groupby(["spec", "dtype", "policy"], sort=False):
        if not (c.value > 0).any():
            continue
        parts = []
        for grad in ("dq", "dk", "dv"):
            bad = c[(c.metric == f"grad_nonfinite_{grad}") & (c.value > 0)]
            at_n, at_t = bad[bad.t == 1].n, bad[bad.n == n].t
            first = " / ".join(x for x in (f"n = {at_n.min()}" if len(at_n) else "",
                                           f"t = {at_t.min():g}" if len(at_t) else "") if x)
            parts.append(f"d{grad[1].upper()} {first or 'finite'}")
        split.append(f"{short(spec) or spec} {fmt} {pol}: {', '.join(parts)}")
    F.add("precision.grad_fails_split", "; ".join(split) if split else "none", str,
          "per spec, format and policy whose gradients fail on Gaussian heads: dQ's, dK's and dV's first failing "
          f"length at t = 1 and first failing temperature at n = {n} (each 'finite' where it never fails)", "precision")
    # The discrete-choice methods' total error in the format beside their float64 approximation error.
    for s in ("reformer64", "vq64", "probsparse5", "nystrom64"):
        c = g[(g.short == s) & (g.n == n) & (g.t == 1)]
        for fmt in ("bf16", "fp16"):
            e = c[(c.dtype == fmt) & (c.policy == "careful") & (c.metric == "err_total")]
            if len(e):
                F.add(f"precision.{s}_{fmt}_careful_total", e.value.iloc[0], lambda x: sig(x, 2),
                      f"{s}: total error against exact float64 attention in {fmt} careful, gaussian, n = {n}, t = 1",
                      "precision")
    # Exact attention's derived worst-case bound (analysis/rounding_bound.hpp) against every measurement.
    bounds = d[d.metric.isin(["bound", "bound_ratio", "bound_violations", "bound_rows_none"])]

    def bound_checks(prefix, b, cells, outside, ratio):
        """A derived bound's three numbers over the cells of b: how many were checked, the entries outside it, and
        the largest share of it a measurement reached."""
        F.add(f"{prefix}_cells", int((b.metric == "bound_violations").sum()), str, cells, "precision")
        F.add(f"{prefix}_violations", int(pick(b, metric="bound_violations").sum()), str, outside, "precision")
        F.add(f"{prefix}_ratio_max", pick(b, metric="bound_ratio").max(), lambda x: sig(x, 2), ratio, "precision")

    b = bounds[bounds.spec.str.startswith("exact")]
    bound_checks("precision.bound", b,
                 "cells (exact, both paths, every source, length, temperature, format, policy) where the emulated "
                 "output was checked entry by entry against the derived worst-case rounding bound",
                 "output entries outside the derived bound, all cells",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F over all cells")
    for fmt in ("bf16", "fp16"):
        c = b[(b.source == "gaussian") & (b.n == n) & (b.t == 1) & (b.dtype == fmt) & (b.policy == "careful")
              & b.spec.str.startswith("exact:impl=streaming")]
        F.add(f"precision.bound_{fmt}", pick(c, metric="bound").iloc[0], lambda x: sig(x, 2),
              f"the derived worst-case bound ‖bound‖_F / ‖O‖_F, exact streaming, {fmt} careful, gaussian, n = {n}, "
              "t = 1", "precision")
        F.add(f"precision.bound_{fmt}_measured", pick(c, metric="bound_ratio").iloc[0], lambda x: sig(x, 2),
              f"what the measurement reached of that bound (‖Ô − O‖_F / ‖bound‖_F), {fmt} careful", "precision")
    # The pattern methods' bound (exact's materialised one over their pattern) and linear attention's (its own
    # derivation; +inf on the rows where the format may overflow).
    pb = bounds[bounds.method.isin(["local", "sparse"])]
    bound_checks("precision.pattern_bound", pb,
                 "cells (the pattern methods the experiment runs — local windows, sparse patterns —, every source, "
                 "length, temperature, format, policy) checked entry by entry against exact attention's materialised "
                 "bound over the pattern",
                 "the pattern methods' output entries outside that bound, all cells",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of the pattern methods")
    lb = bounds[bounds.method == "linear"]
    bound_checks("precision.linear_bound", lb,
                 "cells (linear attention, every source, length, temperature, format, policy) checked entry by "
                 "entry against its derived bound",
                 "linear attention's output entries outside its bound (a failed entry on a row without a guarantee is "
                 "none)",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of linear attention, over its rows with a guarantee")
    for fmt in ("bf16", "fp16"):
        c = lb[(lb.source == "gaussian") & (lb.n == n) & (lb.t == 1) & (lb.dtype == fmt) & (lb.policy == "careful")]
        F.add(f"precision.linear_bound_{fmt}", pick(c, metric="bound").iloc[0], lambda x: sig(x, 2),
              f"linear attention's derived bound ‖bound‖_F / ‖O‖_F, {fmt} careful, gaussian, n = {n}, t = 1",
              "precision")
    # Linformer's (exact's materialised bound over the projected keys and values, with the envelopes of EK and FV
    # as formed in float32 and stored).
    fb = bounds[bounds.method == "linformer"]
    bound_checks("precision.linformer_bound", fb,
                 "cells (Linformer's specs, every source, length, temperature, format, policy) checked entry by "
                 "entry against its derived bound",
                 "Linformer's output entries outside its bound, all cells",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of Linformer")
    for proj in ("pool", "gaussian"):
        for fmt in ("bf16", "fp16"):
            c = fb[(fb.source == "gaussian") & (fb.n == n) & (fb.t == 1) & (fb.dtype == fmt)
                   & (fb.policy == "careful") & fb.spec.str.startswith(f"linformer:k=256,projection={proj}")]
            F.add(f"precision.linformer_bound_{proj}_{fmt}", pick(c, metric="bound").iloc[0], lambda x: sig(x, 2),
                  f"Linformer's derived bound ‖bound‖_F / ‖O‖_F, k = 256, {proj} projections, {fmt} careful, "
                  f"gaussian, n = {n}, t = 1", "precision")
    # Performer's (careful: the stabilised features' exponent errors, then linear's sums and division).
    pfb = bounds[(bounds.method == "performer") & (bounds.policy == "careful")]
    bound_checks("precision.performer_bound", pfb,
                 "cells (Performer careful, every spec, source, length, temperature, format) checked entry by entry "
                 "against its derived bound",
                 "Performer's output entries outside its bound, all cells",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of Performer careful, over its rows with a guarantee")
    for fmt in ("bf16", "fp16"):
        c = pfb[(pfb.source == "gaussian") & (pfb.n == n) & (pfb.t == 1) & (pfb.dtype == fmt)
                & pfb.spec.str.startswith("performer:features=256")]
        F.add(f"precision.performer_bound_{fmt}", pick(c, metric="bound").iloc[0], lambda x: sig(x, 2),
              f"Performer's derived bound ‖bound‖_F / ‖O‖_F, 256 features, {fmt} careful, gaussian, n = {n}, t = 1",
              "precision")
    tr = pfb[(pfb.source == "trained") & (pfb.dtype == "fp16") & (pfb.metric == "bound_rows_none")]
    F.add("precision.performer_bound_trained_fp16_none", int(tr.value.max()) if len(tr) else 0, str,
          "the most rows of one trained head (n = 512) on which Performer careful's bound gives up in fp16, any t "
          "(its features underflow fp16's range there)", "precision")
    uf = d[(d.method == "performer") & (d.policy == "careful") & (d.source == "trained") & (d.t == 1)
           & (d.metric.isin(["err_rounding", "underflow"]))]
    for fmt in ("bf16", "fp16"):
        x = uf[(uf.dtype == fmt) & uf.spec.str.startswith("performer:features=256")]
        F.add(f"precision.performer_trained_{fmt}_rounding", pick(x, metric="err_rounding").max(),
              lambda v: sig(v, 2), f"Performer 256 careful's rounding error on the trained heads, {fmt}, t = 1, the "
              "largest over the heads", "precision")
    F.add("precision.performer_trained_fp16_underflow",
          int(pick(uf[(uf.dtype == "fp16") & uf.spec.str.startswith("performer:features=256")],
                   metric="underflow").max()), str,
          "stored entries of Performer 256 careful that underflowed to zero on one trained head, fp16, t = 1",
          "precision")
    # Performer eager's (the reference code's features, every step stored: each stored exponent's rounding is a
    # relative error of its feature) and Reformer's (exact's streaming bound over the key sets, given both runs'
    # buckets: a row whose key set rounding moved has none).
    peb = bounds[(bounds.method == "performer") & (bounds.policy == "eager")]
    bound_checks("precision.performer_eager_bound", peb,
                 "cells (Performer eager, every spec, source, length, temperature, format) checked entry by entry "
                 "against its derived bound",
                 "Performer eager's output entries outside its bound (a failed entry on a row without a guarantee is "
                 "none)",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of Performer eager, over its rows with a guarantee")
    pe_none = peb[peb.metric == "bound_rows_none"]
    for fmt in ("bf16", "fp16"):
        x = pe_none[pe_none.dtype == fmt]
        F.add(f"precision.performer_eager_bound_{fmt}_full", f"{int((x.value == 0).sum())} of {len(x)}", str,
              f"Performer eager cells ({fmt}, every spec, source, length, temperature) where its bound holds on "
              "every row", "precision")
    c = peb[(peb.source == "gaussian") & (peb.n == 1024) & (peb.t == 1) & (peb.dtype == "fp16")
            & peb.spec.str.startswith("performer:features=256")]
    F.add("precision.performer_eager_bound_fp16", pick(c, metric="bound").iloc[0], lambda x: sig(x, 2),
          "Performer eager's derived bound ‖bound‖_F / ‖O‖_F, 256 features, fp16, gaussian, n = 1024, t = 1",
          "precision")
    # Scatterbrain's (the Performer estimate's envelopes off the band, the band's corrections, normalised; in units
    # of each row's reference).
    sbb = bounds[bounds.method == "scatterbrain"]
    bound_checks("precision.scatterbrain_bound", sbb,
                 "cells (Scatterbrain, every source, length, temperature, format, policy) checked entry by entry "
                 "against its derived bound",
                 "Scatterbrain's output entries outside its bound (a failed entry on a row without a guarantee is "
                 "none)",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of Scatterbrain, over its rows with a guarantee")
    for fmt in ("bf16", "fp16"):
        for pol in ("eager", "careful"):
            c = sbb[(sbb.source == "gaussian") & (sbb.n == n) & (sbb.t == 1) & (sbb.dtype == fmt)
                    & (sbb.policy == pol)]
            F.add(f"precision.scatterbrain_bound_{fmt}_{pol}", pick(c, metric="bound").iloc[0], lambda x: sig(x, 2),
                  f"Scatterbrain's derived bound ‖bound‖_F / ‖O‖_F, 64 features, {fmt} {pol}, gaussian, n = {n}, "
                  "t = 1", "precision")
    sb_none = sbb[sbb.metric == "bound_rows_none"]
    F.add("precision.scatterbrain_bound_full", f"{int((sb_none.value == 0).sum())} of {len(sb_none)}", str,
          "Scatterbrain cells (every source, length, temperature, format, policy) where its bound holds on every row",
          "precision")
    # Nyström's (given both runs' pseudo-inverses: Ẑ − Z enters as computed; the landmarks, the two softmaxes and
    # the products bounded).
    nyb = bounds[bounds.method == "nystrom"]
    bound_checks("precision.nystrom_bound", nyb,
                 "cells (Nyström's specs, every source, length, temperature, format, policy) checked entry by entry "
                 "against its bound given both runs' pseudo-inverses",
                 "Nyström's output entries outside its bound (a failed entry on a row without a guarantee is none)",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of Nyström, over its rows with a guarantee")
    for label, prefix in (("iterative", "nystrom:landmarks=64,pinv=iterative"),
                          ("svd", "nystrom:landmarks=64,pinv=svd")):
        for fmt in ("bf16", "fp16"):
            c = nyb[(nyb.source == "gaussian") & (nyb.n == n) & (nyb.t == 1) & (nyb.dtype == fmt)
                    & (nyb.policy == "careful") & nyb.spec.str.startswith(prefix)]
            F.add(f"precision.nystrom_bound_{label}_{fmt}", pick(c, metric="bound").iloc[0], lambda x: sig(x, 2),
                  f"Nyström's bound given both pseudo-inverses, ‖bound‖_F / ‖O‖_F, 64 landmarks, pinv={label}, {fmt} "
                  f"careful, gaussian, n = {n}, t = 1", "precision")
    ny_none = nyb[(nyb.metric == "bound_rows_none") & (nyb.value > 0)]
    F.add("precision.nystrom_bound_none_cells", int(len(ny_none)), str,
          "Nyström cells with rows where its bound gives up (a stored F·Ẑ or O may pass fp16's range)", "precision")
    F.add("precision.nystrom_bound_none_svd",
          "all" if (ny_none.spec.str.contains("pinv=svd") & (ny_none.dtype == "fp16")).all() else "not all", str,
          "whether every Nyström cell with rows without a guarantee is a pinv=svd one in fp16", "precision")
    rfb = bounds[bounds.method == "reformer"]
    bound_checks("precision.reformer_bound", rfb,
                 "cells (Reformer's specs, every source, length, temperature, format, policy) checked entry by entry "
                 "against its derived bound on the rows whose key set both runs share",
                 "Reformer's output entries outside its bound (rows whose key set moved carry none)",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of Reformer, over its rows with a guarantee")
    def share_without(b):
        """The share of the rows of b's cells (n rows each) on which their bound gives up."""
        x = b[b.metric == "bound_rows_none"]
        return x.value.sum() / x.n.sum()

    for fmt in ("bf16", "fp16"):
        for src in ("gaussian", "pretrained"):
            F.add(f"precision.reformer_moved_{fmt}_{src}",
                  pct(share_without(rfb[(rfb.dtype == fmt) & (rfb.source == src)])), str,
                  f"the share of Reformer's rows whose key set rounding moved ({fmt}, {src}, every spec, length, "
                  "temperature and policy): the buckets of the stored Q, K hashed by float32 rotations differ from "
                  "float64's", "precision")
    # ProbSparse's (exact's streaming bound on the exact rows, mean(V)'s on the lazy ones, given both runs' top-u
    # queries: a row chosen differently has none).
    psb = bounds[bounds.method == "probsparse"]
    bound_checks("precision.probsparse_bound", psb,
                 "cells (ProbSparse's specs, every source, length, temperature, format, policy) checked entry by entry "
                 "against its derived bound on the rows both runs chose alike",
                 "ProbSparse's output entries outside its bound (rows chosen differently carry none)",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of ProbSparse, over its rows with a guarantee")
    for fmt in ("bf16", "fp16"):
        F.add(f"precision.probsparse_flipped_{fmt}", f"{100 * share_without(psb[psb.dtype == fmt]):.2g}%", str,
              f"the share of ProbSparse's rows without a guarantee ({fmt}, every spec, source, length, temperature "
              "and policy): chosen differently by the emulated run (the sparsity measure of the stored Q, K picks "
              "other top-u queries), or an exact row where the format may overflow",
              "precision")
    # Transformer-VQ's (k-means codebook: the attention given both runs' fits, where they partition the keys alike).
    vqb = bounds[bounds.method == "vq"]
    bound_checks("precision.vq_bound", vqb,
                 "cells (VQ's specs, k-means codebooks, every source, length, temperature, format, policy) checked "
                 "entry by entry against its derived bound given both runs' codebooks",
                 "VQ's output entries outside its bound (where the two k-means fits partition the keys differently, "
                 "it claims none)",
                 "the largest measured ‖Ô − O‖_F / ‖bound‖_F of VQ, over its rows with a guarantee")
    for fmt in ("bf16", "fp16"):
        x = vqb[(vqb.dtype == fmt) & (vqb.metric == "bound_rows_none")]
        F.add(f"precision.vq_fits_agree_{fmt}", f"{int((x.value == 0).sum())} of {len(x)}", str,
              f"VQ's cells ({fmt}, every spec, source, length, temperature and policy) where the emulated run's "
              "k-means fit (float32, on the stored keys) partitions the keys as float64's does, up to the codes' "
              "numbering: there its bound holds on every row", "precision")
    # VQ's rounding error where the fits agree against where they do not: how much of it is the refit.
    vk = ["source", "n", "seed", "sequence", "layer", "head", "spec", "t", "dtype", "policy"]
    vq_all = d[d.method == "vq"]
    agree = vq_all[vq_all.metric == "bound_rows_none"].set_index(vk)["value"].rename("none")
    vq_err = vq_all[vq_all.metric == "err_rounding"].set_index(vk)["value"].rename("err")
    vj = pd.concat([agree, vq_err], axis=1, join="inner").reset_index()
    for fmt in ("bf16", "fp16"):
        for same, word in ((True, "agree"), (False, "differ")):
            e = vj[(vj.dtype == fmt) & ((vj.none == 0) == same)].err
            F.add(f"precision.vq_err_fits_{word}_{fmt}", e.median() if len(e) else float("nan"),
                  lambda x: sig(x, 2),
                  f"VQ's median rounding error against its own float64 output ({fmt}, every spec, source, length, "
                  f"temperature and policy) over the cells where the two k-means fits {word}", "precision")
    # Where the bound gives up (some row without a guarantee) against where the emulation fails, fp16 eager, t = 1.
    none = lb[(lb.source == "gaussian") & (lb.t == 1) & (lb.dtype == "fp16") & (lb.policy == "eager")
              & (lb.metric == "bound_rows_none") & (lb.value > 0)].n
    F.add("precision.linear_bound_gives_up_n", f"n = {none.min()}" if len(none) else "none", str,
          "the shortest length at which linear attention's bound gives up on some row (fp16 eager, gaussian, t = 1: "
          "the format may overflow there)", "precision")
    # Where the format costs more than the approximation: every method and budget (exact left out), cells without a
    # failure, per source at t = 1 (every length of the generated sources; every head of the model sources).
    # The generated sources have no sequence, layer or head (NaN): filled, since NaN keys never match in a join (an
    # earlier version lost every generated cell that way and counted the models' heads only).
    key = ["source", "n", "seed", "sequence", "layer", "head", "spec", "t"]
    dk = d.fillna({"sequence": -1, "layer": -1, "head": -1})
    approx = dk[(dk.dtype == "fp64") & (dk.metric == "err_total")][key + ["value"]].rename(columns={"value": "approx"})
    rnd = dk[(dk.metric == "err_rounding") & dk.dtype.isin(["bf16", "fp16"]) & ~dk.spec.str.startswith("exact")
             & (dk.t == 1)]
    j = rnd[key + ["dtype", "policy", "value"]].rename(columns={"value": "rounding"})
    j = j.merge(approx, on=key, how="inner", validate="many_to_one")
    j = j[j.approx > 1e-12]  # a budget at its exact limit (pooled Linformer with k = n) has no approximation error
    for fmt in ("bf16", "fp16"):
        for pol in ("eager", "careful"):
            c = j[(j.dtype == fmt) & (j.policy == pol)]
            F.add(f"precision.exceeds_{fmt}_{pol}", f"{int((c.rounding > c.approx).sum())} of {len(c)}", str,
                  f"cells (method × budget × source × length or head, t = 1; outputs with non-finite entries left "
                  f"out, all-zero rows counted) where the {fmt} {pol} rounding error exceeds the method's "
                  "approximation error in float64", "precision")
            r = c.rounding / c.approx
            F.add(f"precision.ratio_{fmt}_{pol}_median", r.median(), lambda x: sig(x, 2),
                  f"the median of rounding ÷ approximation error over those cells, {fmt} {pol}", "precision")
    h = j[j.source.isin(["trained", "pretrained"])]
    for fmt in ("bf16", "fp16"):
        for pol in ("eager", "careful"):
            c = h[(h.dtype == fmt) & (h.policy == pol)]
            F.add(f"precision.heads_{fmt}_{pol}_max_ratio", (c.rounding / c.approx).max(), lambda x: sig(x, 2),
                  f"the largest rounding ÷ approximation error on the trained and pretrained models' heads, {fmt} "
                  f"{pol}, t = 1", "precision")


def precision_model(F, R):
    """tools/precision_model.py: the trained models with their attention in emulated bf16 / fp16 storage."""
    path = os.path.join(R, "precision_model.csv.gz")
    d = pd.read_csv(path)
    for model in ("mlm", "causal"):
        m = d[d.model == model]
        for fmt in ("bf16", "fp16"):
            for pol in ("eager", "careful"):
                e = m[(m.spec == "exact") & (m.precision == fmt) & (m.policy == pol)].iloc[0]
                F.add(f"pmodel.{model}_exact_{fmt}_{pol}", abs(e.dloss), lambda x: sig(x, 1),
                      f"{model} model, every attention exact in emulated {fmt} storage ({pol}): |loss change| against "
                      "exact float64 attention (nats/byte; 8 held-out windows)", "precision_model")
    for model, spec, name in (("mlm", "linear", "linear"), ("mlm", "performer:features=64", "performer64"),
                              ("mlm", "nystrom:landmarks=32", "nystrom32"), ("mlm", "linformer:k=64", "linformer64"),
                              ("mlm", "local:window=32", "local32"), ("mlm", "reformer:", "reformer"),
                              ("mlm", "probsparse:", "probsparse"), ("mlm", "vq:codes=32", "vq32"),
                              ("causal", "local:window=32", "local32"), ("causal", "reformer:", "reformer"),
                              ("causal", "probsparse:", "probsparse"), ("causal", "linear", "linear"),
                              ("causal", "performer:features=64", "performer64")):
        m = d[d.model == model]
        rows = m[m.spec.str.startswith(spec)]
        f64 = rows[rows.precision == "fp64"].iloc[0]
        F.add(f"pmodel.{model}_{name}_fp64", f64.dloss, lambda x: sig(x, 2),
              f"{model} model, {spec} in every attention, float64: loss change against exact (nats/byte)",
              "precision_model")
        for fmt in ("bf16", "fp16"):
            for pol in ("eager", "careful"):
                r = rows[(rows.precision == fmt) & (rows.policy == pol)].iloc[0]
                value = sig(r.dloss, 2) if r.status == "ok" else r.status.split(":")[0]
                F.add(f"pmodel.{model}_{name}_{fmt}_{pol}", value, str,
                      f"{model} model, {spec} in every attention, emulated {fmt} ({pol}): loss change against exact "
                      "float64 (nats/byte), or the failure", "precision_model")


def pretrained_precision(F, R):
    """tools/pretrained_study.py --only precision: all-MiniLM-L6-v2 (trained elsewhere) with every attention in
    emulated bf16 / fp16 storage."""
    path = os.path.join(R, "pretrained_precision.csv.gz")
    if not os.path.exists(path):   # not the main job's: tools/pretrained_study.py writes it
        return
    d = pd.read_csv(path, keep_default_na=False, na_values=[""])
    d["budget"] = d.budget.astype(str).str.replace(r"\.0$", "", regex=True)
    fams = [f for f in dict.fromkeys(d.family) if f != "exact"]
    moved, failed = [], []
    for fam in ["exact"] + fams:
        rows = d[d.family == fam]
        f64 = rows[rows.precision == "fp64"].iloc[0]
        if fam != "exact":
            budget = "" if f64.budget == "nan" else f" (budget {f64.budget})"
            F.add(f"pprec.{fam}_fp64", f64.dloss, lambda x: sig(x, 2),
                  f"all-MiniLM-L6-v2, {fam}{budget} in every attention, float64: contrastive loss "
                  "change against exact (nats; 64 pairs of n = 256)", "pretrained_precision")
        for fmt in ("bf16", "fp16"):
            for pol in ("eager", "careful"):
                r = rows[(rows.precision == fmt) & (rows.policy == pol)].iloc[0]
                ok = r.status == "ok"
                value = sig(r.dloss, 2) if ok else r.status.split(":")[0]
                F.add(f"pprec.{fam}_{fmt}_{pol}", value, str,
                      f"all-MiniLM-L6-v2, {fam} in every attention, emulated {fmt} ({pol}): loss change against "
                      "exact float64 (nats), or the failure", "pretrained_precision")
                if ok and fam != "exact":
                    moved.append((abs(r.dloss - f64.dloss), fam, fmt, pol, f64.dloss))
                elif str(r.status).startswith("failed"):
                    failed.append(f"{fam} {fmt} {pol}")
    F.add("pprec.failed", ", ".join(failed) if failed else "none", str,
          "all-MiniLM-L6-v2: the swaps whose attention returned non-finite values in the format",
          "pretrained_precision")
    ex = d[(d.family == "exact") & (d.precision != "fp64")]
    F.add("pprec.exact_max", ex.dloss.abs().max(), lambda x: sig(x, 1),
          "all-MiniLM-L6-v2: the largest |loss change| of exact attention in any emulated format and policy (nats)",
          "pretrained_precision")
    big = max(moved, default=(math.nan, "none", "", "", math.nan))
    F.add("pprec.largest_move", f"{sig(big[0], 2)} ({big[1]}, {big[2]} {big[3]})", str,
          "all-MiniLM-L6-v2: the largest change of a method's loss from its float64 one by the format (among swaps "
          "that stayed finite)", "pretrained_precision")
    usable = max((m for m in moved if m[4] < 1.0), default=(math.nan, "none", "", "", math.nan))
    F.add("pprec.largest_move_usable", f"{sig(usable[0], 2)} ({usable[1]}, {usable[2]} {usable[3]})", str,
          "all-MiniLM-L6-v2: the same among the families that cost under 1 nat in float64", "pretrained_precision")


def stabilisers(F, R):
    """tools/stabilisers.py: which stabiliser fixes which half-precision failure (kernel methods, 2 × 2 and more)."""
    path = os.path.join(R, "stabilisers.csv.gz")
    if not os.path.exists(path):   # not the main job's: tools/stabilisers.py writes it
        return
    d = pd.read_csv(path, keep_default_na=False, na_values=[""])
    d["fail"] = (d.nonfinite > 0) | (d.zero_rows > 0)
    d["omega"] = d.omega.fillna("")   # linear attention has no ω
    n = d.n.max()
    F.add("stab.n", int(n), integer, "the longest length of the stabiliser study", "stabilisers")
    for fmt in ("bf16", "fp16"):
        for (m, stab, acc, om), g in d[d.format == fmt].groupby(["method", "stabiliser", "accumulators", "omega"]):
            bad = g[g.fail]
            key = f"stab.{m}_{stab}_{acc}" + (f"_omega_{om}" if om else "") + f"_{fmt}"
            F.add(key + "_fails", "none" if bad.empty else
                  f"n ≥ {bad.n.min()}" if m == "linear" else f"t ≥ {bad.temperature.min():g}", str,
                  f"{m}, {stab} / {acc} accumulators{f' / ω {om}' if om else ''}, {fmt}: where the output has "
                  "non-finite entries or all-zero rows (Gaussian, d = 64; n and t of the grid)", "stabilisers")
            c = g[(g.n == n) & (g.temperature == 1)]
            e = c.err_rounding
            F.add(key + "_err", e.iloc[0] if len(e) and pd.notna(e.iloc[0]) and not c.fail.iloc[0] else "fails",
                  lambda x: x if isinstance(x, str) else sig(x, 2),
                  f"{m}, {stab} / {acc}{f' / ω {om}' if om else ''}, {fmt}: rounding error against the same variant "
                  f"in float64, n = {n}, t = 1", "stabilisers")


def compute(results):
    F = Findings()
    for fn in (spectrum, error_vs_budget, error_vs_length, performer, vq, regimes, probsparse, scaling, pinv, bench,
               bench_backward, spectrum_solvers, paper, report, dropin, finetune, model_mix, gradients, pretrained,
               gpu, precision, precision_model, pretrained_precision, stabilisers):
        fn(F, results)
    model(F)
    return F.items


def load_items(path):
    """The findings main() saved with --save-items, as compute() returns them."""
    with open(path) as f:
        return {name: tuple(item) for name, item in json.load(f).items()}


def findings_md(items, results):
    out = ["# Findings", "",
           f"Computed by `tools/findings.py` from the CSVs in `{os.path.relpath(results, ROOT)}/`; the README, the "
           "pages under docs/ and the notebooks quote these names (each in double braces in docs/*.template.md and "
           "tools/notebook_texts.py). Timing "
           "findings vary between runs and machines; every other value is reproducible.", ""]
    by_exp = {}
    for name, (value, definition, exp) in items.items():
        by_exp.setdefault(exp, []).append((name, value, definition))
    for exp in sorted(by_exp):
        out += [f"## {exp}", "", "| name | value | definition |", "|---|---|---|"]
        out += [f"| `{n}` | {v if chr(10) not in v else '(a table; see its definition)'} | {d} |"
                for n, v, d in by_exp[exp]]
        out.append("")
    return "\n".join(out)


def at(where, text, pos):
    """'WHERE:LINE' of a position in text, or WHERE with '{line}' filled in."""
    line = 1 + text.count("\n", 0, pos)
    return where.format(line=line) if "{line}" in where else f"{where}:{line}"


def unrendered(text, items, where):
    """'WHERE:LINE: {{key}} ...' for every placeholder of text that has no value: a key that no finding has, or a
    finding whose value is NaN or infinite (its rows are missing from the CSVs). Empty when text renders."""
    out = []
    for m in PLACEHOLDER.finditer(text):
        key = m.group(1)
        if key not in items:
            close = difflib.get_close_matches(key, list(items), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(f"{at(where, text, m.start())}: {m.group(0)} is no finding{hint}")
        elif items[key][0].strip().lower() in NO_VALUE:
            out.append(f"{at(where, text, m.start())}: {m.group(0)} has no value ({items[key][0]!r}: {items[key][1]})")
    return out


def render(text, items, where):
    """text with each placeholder replaced by its finding's value; exits naming every placeholder without one."""
    bad = unrendered(text, items, where)
    if bad:
        sys.exit("findings: placeholders without a value (tools/findings.py computes the findings):\n  " +
                 "\n  ".join(bad))
    return PLACEHOLDER.sub(lambda m: items[m.group(1)][0], text)


def rel(path):
    return os.path.relpath(path, ROOT)


def pages(paper=True):
    """Every rendered page as (template, page), the README first: docs/README.template.md renders into README.md,
    every other docs/NAME.template.md into docs/NAME.md. docs/paper.template.md quotes the paper preset's results
    (results/paper): it is a page only when paper is true, i.e. once they are committed."""
    out = [(TEMPLATE, README)]
    for name in sorted(os.listdir(DOCS)):
        template = os.path.join(DOCS, name)
        if not name.endswith(TEMPLATE_SUFFIX) or template == TEMPLATE or (template == PAPER_TEMPLATE and not paper):
            continue
        out.append((template, os.path.join(DOCS, name[:-len(TEMPLATE_SUFFIX)] + ".md")))
    return out


def template_problems(items, paper):
    """Every placeholder without a value in the texts that are rendered: the templates of every page (the README's,
    docs/*.template.md's; the paper page's when paper is true) and the notebooks' markdown in
    tools/notebook_texts.py."""
    out = []
    for template, _ in pages(paper):
        out += unrendered(open(template).read(), items, rel(template))
    for name, cells in books().items():
        md = [t for kind, t in cells if kind == "md"]
        for i, t in enumerate(md):
            out += unrendered(t, items, f"tools/notebook_texts.py, {name}'s markdown cell {i + 1}, line {{line}}")
    return out


def leftover_placeholders(path, text):
    """'PATH:LINE: {{key}} left unrendered' for every placeholder in a committed, rendered text."""
    return [f"{at(path, text, m.start())}: {m.group(0)} left unrendered" for m in PLACEHOLDER.finditer(text)]


def notebook_texts(items):
    """The notebooks' markdown as write_notebooks writes it with these findings."""
    return {name: [render(t, items, name) for kind, t in cells if kind == "md"] for name, cells in books().items()}


def write_notebooks(items):
    """notebooks/*.ipynb from tools/notebook_texts.py's cells, the markdown rendered with these findings (text and
    code; outputs are made when they run). Prints each notebook's name. Needs python3-nbformat."""
    import nbformat as nbf
    for name, cells in books().items():
        nb = nbf.v4.new_notebook()
        nb.cells = [nbf.v4.new_markdown_cell(render(t, items, name)) if k == "md" else nbf.v4.new_code_cell(t)
                    for k, t in cells]
        for i, cell in enumerate(nb.cells):   # stable cell ids: a re-render changes a notebook only where its text does
            cell["id"] = f"{os.path.splitext(name)[0]}-{i}"
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbf.write(nb, os.path.join(ROOT, "notebooks", name))
        print(name)


def committed_notebook_texts():
    out = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "notebooks"))):
        if name.endswith(".ipynb"):
            nb = json.load(open(os.path.join(ROOT, "notebooks", name)))
            out[name] = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "results"))
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on any difference")
    ap.add_argument("--save-items", metavar="FILE", help="also write the computed findings to FILE (JSON)")
    ap.add_argument("--items", metavar="FILE",
                    help="take the findings from FILE (--save-items' output from the same CSVs) instead of computing "
                         "them: a template edit re-rendered in a second; --check then compares the pages with those "
                         "findings, not with the CSVs")
    a = ap.parse_args()
    items = load_items(a.items) if a.items else compute(a.results)
    if a.save_items:
        with open(a.save_items, "w") as f:
            json.dump(items, f)
    md = findings_md(items, a.results)
    md_path = os.path.join(a.results, "findings.md")
    quick = os.path.abspath(a.results) == os.path.join(ROOT, "results")
    # The paper page exists once the paper preset has run (results/paper/timings.csv).
    has_paper = "paper.total" in items
    # Every placeholder without a value, in every text, before anything is written or compared.
    bad = template_problems(items, has_paper)
    if bad:
        print("findings: placeholders without a value (add the finding to tools/findings.py or fix the name):\n  " +
              "\n  ".join(bad), file=sys.stderr)
        print(f"findings: {len(items)} numbers computed; {len(bad)} placeholders without a value"
              + ("" if a.check else "; nothing written"))
        return 1
    # {page: (template, the page's text rendered with these findings)}, the README first.
    rendered = {page: (template, render(open(template).read(), items, rel(template)))
                for template, page in pages(has_paper)}
    if not a.check:
        with open(md_path, "w") as f:
            f.write(md)
        print(md_path)
        if quick:   # the README, the pages and the notebooks quote the quick preset's committed results
            for page, (_, text) in rendered.items():
                with open(page, "w") as f:
                    f.write(text)
                print(page)
            write_notebooks(items)
        return 0
    problems = []
    # The committed pages: a placeholder left in them is named by file and line — in a rendered page (the comparisons
    # below would catch it too, but as a diff), in the paper page whether or not its results are here, and in a page
    # written by hand (docs/NAME.md without a template), which nothing renders.
    committed = [(page, open(page).read()) for page in rendered if os.path.exists(page)]
    for name in sorted(os.listdir(DOCS)):
        page = os.path.join(DOCS, name)
        if name.endswith(".md") and not name.endswith(TEMPLATE_SUFFIX) and page not in rendered:
            committed.append((page, open(page).read()))
    for path, text in committed:
        problems += leftover_placeholders(rel(path), text)
    for name, cells in committed_notebook_texts().items():
        for i, t in enumerate(cells):
            problems += leftover_placeholders(f"notebooks/{name}, markdown cell {i + 1}, line {{line}}", t)
    if not os.path.exists(md_path) or open(md_path).read() != md:
        problems.append(f"{md_path} is not what the CSVs give (run tools/findings.py)")
    for page, (template, text) in rendered.items():
        source = "results/paper" if template == PAPER_TEMPLATE else "the CSVs' findings"
        if not os.path.exists(page):
            problems.append(f"{rel(page)} is missing: it is {rel(template)} rendered with {source} (run "
                            "tools/findings.py)")
            continue
        have = open(page).read()
        if have != text:
            diff = difflib.unified_diff(have.splitlines(), text.splitlines(), rel(page), "rendered from the CSVs",
                                        lineterm="", n=0)
            problems.append(f"{rel(page)} differs from {rel(template)} rendered with {source} (edit the template, "
                            "then run tools/findings.py):\n" + "\n".join(list(diff)[:40]))
    want, have = notebook_texts(items), committed_notebook_texts()
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            problems.append(f"notebooks/{name}: its text differs from tools/notebook_texts.py rendered with the "
                            "findings (run tools/make_notebooks.py)")
    for p in problems:
        print("findings:", p, file=sys.stderr)
    print(f"findings: pages compared with their templates: {', '.join(rel(page) for page in rendered)}")
    print(f"findings: {len(items)} numbers checked against the CSVs; "
          f"{'all as quoted' if not problems else str(len(problems)) + ' differences'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
