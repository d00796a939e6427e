"""The notebooks' shared set-up (each notebook's first code cell imports it): where the CSVs are, where figures go,
and the helpers the cells use. The notebooks live in notebooks/; the CSVs and tools/plot.py one level up (or
ATTNLAB_ROOT, ATTNLAB_RESULTS; figures in ATTNLAB_FIGURES)."""
import os
import sys

import pandas as pd  # noqa: F401  (the cells use pd)
from IPython.display import Image, display

ROOT = os.environ.get("ATTNLAB_ROOT") or (os.path.abspath(os.path.join(os.getcwd(), ".."))
                                          if os.path.basename(os.getcwd()) == "notebooks" else os.getcwd())
sys.path.insert(0, os.path.join(ROOT, "tools"))
import plot  # noqa: E402

RESULTS = os.environ.get("ATTNLAB_RESULTS", os.path.join(ROOT, "results"))
FIGS = os.path.join(os.environ.get("ATTNLAB_FIGURES", "/tmp/attnlab_notebook_figures"))


def show(paths):
    for p in paths:
        display(Image(filename=p))


__all__ = ["os", "sys", "pd", "plot", "display", "Image", "ROOT", "RESULTS", "FIGS", "show"]
