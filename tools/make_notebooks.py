#!/usr/bin/env python3
"""Writes the notebooks under notebooks/ (text and code cells; outputs are made when they run). Run from the
repository root with Debian's python3 (python3-nbformat, python3-pandas): tools/make_notebooks.py

The cells are tools/notebook_texts.py's. Numbers in the text are {{name}} placeholders filled from tools/findings.py
(computed from results/), so the text cannot drift from the CSVs; `tools/findings.py --check` (in the test suite)
fails when a committed notebook's text differs from what this script writes. `tools/findings.py` (without --check)
writes the notebooks too."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import findings  # noqa: E402


def main():
    findings.write_notebooks(findings.compute(os.path.join(findings.ROOT, "results")))


if __name__ == "__main__":
    main()
