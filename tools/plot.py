#!/usr/bin/env python3
"""Render the figures of attnlab's experiments from their tidy CSVs (results/*.csv.gz or *.csv) as PNGs
(results/figures/).

    tools/plot.py [--results results] [--out results/figures] [experiment ...]

Each figure names the paper figure it redraws in its caption line. Needs Debian's python3-matplotlib and
python3-pandas (tools/setup.sh --python-stack installs them); run it with /usr/bin/python3 or ATTNLAB_PYTHON.
"""
import argparse
import multiprocessing
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figures.data import csv_path, is_model_head, load  # noqa: E402,F401  (notebooks: plot.load, plot.is_model_head)
from figures.budget import plot_error_vs_budget  # noqa: E402
from figures.dropin import plot_dropin  # noqa: E402
from figures.finetune import plot_finetune  # noqa: E402
from figures.gradients import plot_gradients  # noqa: E402
from figures.length import plot_error_vs_length  # noqa: E402
from figures.performer import plot_performer_mse  # noqa: E402
from figures.pinv import plot_pinv  # noqa: E402
from figures.precision import plot_precision  # noqa: E402
from figures.pretrained import plot_pretrained  # noqa: E402
from figures.probsparse import plot_probsparse  # noqa: E402
from figures.regimes import plot_regimes  # noqa: E402
from figures.scaling import plot_scaling  # noqa: E402
from figures.spectrum import plot_spectrum  # noqa: E402
from figures.vq import plot_vq  # noqa: E402

PLOTS = {"spectrum": plot_spectrum, "pinv": plot_pinv, "error_vs_budget": plot_error_vs_budget,
         "error_vs_length": plot_error_vs_length, "performer_mse": plot_performer_mse, "vq": plot_vq,
         "regimes": plot_regimes, "probsparse": plot_probsparse, "scaling": plot_scaling, "dropin": plot_dropin,
         "finetune": plot_finetune, "gradients": plot_gradients, "precision": plot_precision,
         "pretrained_dropin": plot_pretrained}   # tools/pretrained_study.py's (and its fine-tuning's)
SLOW = ("error_vs_budget", "dropin")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", help=f"which (default: all of {', '.join(PLOTS)} with a CSV)")
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=None, help="default: RESULTS/figures")
    a = ap.parse_args()
    out = a.out or os.path.join(a.results, "figures")
    names = a.experiments or [n for n in PLOTS if csv_path(a.results, n)]
    for n in names:
        if n not in PLOTS:
            sys.exit(f"no plot for '{n}'; known: {', '.join(PLOTS)}")
    # The experiments' figures are independent: drawn by as many processes as there are cores (matplotlib is
    # single-threaded), the slowest first (error_vs_budget's log axes take ~20 s of layout), listed in fixed order.
    jobs = sorted(names, key=lambda n: n not in SLOW)
    workers = min(len(jobs), len(os.sched_getaffinity(0)))
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            done = dict(zip(jobs, pool.map(draw, [(n, a.results, out) for n in jobs], chunksize=1)))
    else:
        done = {n: draw((n, a.results, out)) for n in jobs}
    for n in names:
        for p in done[n]:
            print(p)


def draw(job):
    name, results, out = job
    return list(PLOTS[name](results, out))


if __name__ == "__main__":
    main()
