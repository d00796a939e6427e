"""The methods in emulated bfloat16 and float16 (the `precision` experiment): rounding error against temperature, per
method, beside the method's own approximation error; failures (non-finite or all-zero outputs) marked."""
import re

import numpy as np
import pandas as pd

from .common import finish, panels, plt
from .data import load

STYLE = {("bf16", "eager"): dict(color="#1f77b4", ls="-", marker="o"),
         ("bf16", "careful"): dict(color="#1f77b4", ls="--", marker="s", mfc="none"),
         ("fp16", "eager"): dict(color="#d62728", ls="-", marker="o"),
         ("fp16", "careful"): dict(color="#d62728", ls="--", marker="s", mfc="none")}
TITLES = {"exact:impl=materialized": "exact, materialised P",
          "exact:impl=streaming": "exact, streaming (online softmax)"}


def split_variant(df):
    """The variant 'T=4 eager' → temperature 4.0, policy 'eager' ('' for the native formats)."""
    m = df["variant"].fillna("").str.extract(r"T=([0-9.eE+-]+)\s*(\w*)")
    df = df.assign(temperature=m[0].astype(float), policy=m[1].fillna(""))
    return df


def short(spec):
    for k, v in TITLES.items():
        if spec.startswith(k):
            return v
    name, _, params = spec.partition(":")
    # Linformer's projection in the title: the Gaussian E, F round about twice as much as pooling (figures.md)
    proj = re.search(r"(?:^|,)projection=(\w+)", params)
    linformer = "k = {}" + (f", {proj.group(1)} E, F" if proj else "")
    for method, key, form in (("performer", "features", "{} features"), ("linformer", "k", linformer),
                              ("local", "window", "window {}"), ("nystrom", "landmarks", "{} landmarks"),
                              ("reformer", "chunk", "chunk {}"), ("probsparse", "factor", "c = {}"),
                              ("vq", "codes", "{} codes")):
        b = re.search(rf"(?:^|,){key}=(\d+)", params)
        if name == method and b:
            return f"{name} ({form.format(b.group(1))})"
    return name


def plot_precision(results, out):
    df = split_variant(load(results, "precision"))
    n = int(df["n"].max())
    src = "gaussian" if (df.source == "gaussian").any() else df.source.iloc[0]
    d = df[(df.n == n) & (df.source == src)]
    # One panel per family at its default budget (the experiment's first spec of each method); the other budgets are
    # in the CSV and the findings.
    specs = list(dict.fromkeys(d["spec"]))
    seen, first = set(), []
    for spec in specs:
        key = spec if spec.startswith("exact") else spec.partition(":")[0]
        if key not in seen:
            seen.add(key)
            first.append(spec)
    specs = first
    fig, axes = panels(len(specs), 4.4, 3.6)
    for ax, spec in zip(axes, specs):
        g = d[d.spec == spec]
        approx = g[(g.dtype == "fp64") & (g.metric == "err_total")].groupby("temperature")["value"].mean()
        if spec.startswith("exact"):
            approx = None   # exact attention's own error in float64 is its rounding (~1e-16): nothing to draw
        else:
            ax.semilogy(approx.index, approx.values, color="0.3", ls=":", lw=1.5,
                        label="approximation (fp64):\n‖Õ_fp64 − O‖ / ‖O‖")
        top = 1.0
        for (fmt, pol), st in STYLE.items():
            c = g[(g.dtype == fmt) & (g.policy == pol)]
            err = c[c.metric == "err_rounding"].groupby("temperature")["value"].mean()
            bad = c[c.metric.isin(["nonfinite", "zero_rows"]) & (c.value > 0)].temperature.unique()
            if not err.empty:
                ok = err[~err.index.isin(bad)]
                ax.semilogy(ok.index, ok.values, ms=4, lw=1.3, label=f"{fmt} {pol}", **st)
                top = max(top, float(np.nanmax(ok.values)) if len(ok) else top)
            if len(bad):
                ax.plot(sorted(bad), [top * 3] * len(bad), ls="none", marker="x", ms=8, mew=2, color=st["color"])
            if c[c.metric == "refused"].shape[0]:
                ax.text(0.02, 0.02 + 0.07 * list(STYLE).index((fmt, pol)), f"{fmt} {pol}: not emulated",
                        transform=ax.transAxes, fontsize=7, color=st["color"])
        ax.set_xscale("log", base=2)
        ax.set(title=short(spec), xlabel="logit temperature t (Q·t)", ylabel="relative output error")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles, labels = axes[-1].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], ls="none", marker="x", ms=8, mew=2, color="0.3"))
    labels.append("failed: non-finite\nor all-zero rows")
    w, h = fig.get_size_inches()
    fig.set_size_inches(w + 2.4, h)
    right = w / (w + 2.4)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.005, 0.55), frameon=False)
    paths = [finish(fig, out, "precision",
                   f"Each method in emulated bfloat16 and float16 storage ({src} Q, K, V, n = {n}, d = "
                   f"{int(d.d.iloc[0])}; eager: every intermediate stored in the format; careful: accumulators and "
                   "statistics in float32): rounding error ‖Õ_fmt − Õ_fp64‖/‖Õ_fp64‖ against the method's own "
                   "float64 output, beside its approximation error (dotted); x: the output had non-finite entries or "
                   "all-zero rows (at the top).",
                   right=right)]
    heads = plot_heads(df, out)
    return paths + ([heads] if heads else [])


HEAD_SOURCES = ("trained", "pretrained")


def plot_heads(df, out):
    """On the model sources' heads at t = 1: each method's rounding error in bf16 / fp16 (careful, eager) against its
    approximation error in float64, one point per head and budget; above the diagonal the format costs more than the
    approximation does. Exact attention has no approximation error: it is left out."""
    d = df[df.source.isin(HEAD_SOURCES) & (df.temperature == 1) & ~df.spec.str.startswith("exact")]
    if d.empty:
        return None
    key = ["source", "sequence", "layer", "head", "spec"]
    approx = d[(d.dtype == "fp64") & (d.metric == "err_total")].set_index(key)["value"].rename("approx")
    approx = approx[approx > 1e-12]  # a budget at its exact limit (pooled Linformer, k = n) has nothing to compare
    fig, axes = panels(len(HEAD_SOURCES), 4.8, 4.2)
    # Axes on the useful range: the 1st to 99th percentile of both errors (points beyond sit on the edges).
    both = pd.concat([approx, d[d.dtype.isin(["bf16", "fp16"]) & (d.metric == "err_rounding")].value])
    both = both[both > 1e-12]
    lo, hi = 10 ** np.floor(np.log10(both.quantile(0.01))), 10 ** np.ceil(np.log10(both.quantile(0.99)))
    clipped = 0
    for ax, src in zip(axes, HEAD_SOURCES):
        for (fmt, pol), st in STYLE.items():
            c = d[(d.source == src) & (d.dtype == fmt) & (d.policy == pol) & (d.metric == "err_rounding")]
            c = c.set_index(key)["value"].rename("rounding").to_frame().join(approx, how="inner")
            if c.empty:
                continue
            clipped += int(((c.approx < lo) | (c.approx > hi) | (c.rounding < lo) | (c.rounding > hi)).sum())
            ax.loglog(c.approx.clip(lo, hi), c.rounding.clip(lo, hi), ls="none", marker=st["marker"], ms=4,
                      mfc=st.get("mfc", st["color"]), color=st["color"], alpha=0.7, label=f"{fmt} {pol}")
        ax.plot([lo, hi], [lo, hi], color="0.3", lw=0.8, ls=":", label="rounding = approximation")
        ax.set(xlim=(lo, hi), ylim=(lo, hi), title=f"{src} model's heads (t = 1)",
               xlabel="approximation error in float64 (relative)", ylabel="rounding error (relative)")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    axes[0].legend(fontsize=8, loc="upper left")
    # What is not drawn: the failed cells (no rounding error: non-finite entries or all-zero rows) are counted.
    fails = d[d.dtype.isin(["bf16", "fp16"]) & d.metric.isin(["nonfinite", "zero_rows"]) & (d.value > 0)]
    failed = len(fails.drop_duplicates(key + ["dtype", "policy"]))
    return finish(fig, out, "precision_heads",
                  "Rounding error in emulated bfloat16 / float16 against each approximation's own error in float64, "
                  "per head of the byte-level model trained here (trained) and of all-MiniLM-L6-v2 (pretrained), "
                  "every method and budget of the precision experiment (exact attention left out), t = 1. Points "
                  f"above the diagonal: the format costs more than the approximation. {clipped} points beyond the "
                  f"axes sit on their edges (most of them Nyström with pinv=svd, whose float64 error reaches 1e5); "
                  f"{failed} cells "
                  "whose output failed (non-finite entries or all-zero rows: eager Performer, eager fp16 linear "
                  "attention) are not drawn.")
