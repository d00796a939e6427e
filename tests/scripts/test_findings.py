#!/usr/bin/env python3
"""The committed results stay small and the quoted numbers stay true:
  - every number README.md, the pages under docs/ and the notebooks quote equals what tools/findings.py computes from
    the committed CSVs (README.md is docs/README.template.md rendered, docs/NAME.md docs/NAME.template.md; the
    notebooks' text is tools/notebook_texts.py's), and results/findings.md is up to date;
  - a changed number is caught: the README or a page under docs/ with one quoted value altered fails the check, and
    so does a rendered page that is missing;
  - a placeholder without a value is caught: in README.md or a page (left unrendered) or in a template (unknown key,
    any case), the check fails naming the placeholder and its file and line, and rendering writes nothing;
  - the committed quick-preset results/ take at most 7.72 MB (results/bench/, the timing runs, 1 MB), and every CSV
    there is compressed.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from checks import ROOT, TOOLS, Checks, import_tools

import_tools()
c = Checks()
check = c.check


# The findings are computed from the CSVs once, here; the checks below that alter a page or a template (in a copy)
# take them from the saved file (--items) instead of computing them again: what they test is the comparison.
items_file = os.path.join(tempfile.mkdtemp(prefix="attnlab_findings_items_"), "items.json")
r = subprocess.run([sys.executable, os.path.join(TOOLS, "findings.py"), "--check", "--save-items", items_file],
                   capture_output=True, text=True, timeout=300)
check(r.returncode == 0, f"README, notebooks and findings.md quote what the CSVs give: {r.stderr[-2000:]}")
print(r.stdout.strip())

# Every page with a template is compared: the README and the pages under docs/.
import findings  # noqa: E402
rendered = [os.path.relpath(page, ROOT) for _, page in findings.pages()]
check(rendered[0] == "README.md" and {"docs/figures.md", "docs/reproducing.md", "docs/benchmarks.md"} <= set(rendered),
      f"findings renders the README and the pages under docs/: {rendered}")

# The check can fail: in a copy of the repository, alter one quoted number in README.md, then in a page.
items = findings.load_items(items_file)
check(len(items) > 900 and "evb.floor_trained" in items, f"the saved findings: {len(items)}")
copy = tempfile.mkdtemp(prefix="attnlab_findings_")
for sub in ("tools", "docs", "results", "notebooks", "models", os.path.join("python", "attnlab")):
    shutil.copytree(os.path.join(ROOT, sub), os.path.join(copy, sub))   # python/attnlab: attnlab.stats, by path
readme = open(os.path.join(ROOT, "README.md")).read()
value = items["evb.floor_trained"][0]
# Where the README and the figures page quote it: "... is 0.46 on the trained heads" (the line may break anywhere).
quoted = re.compile(re.escape(value) + r"(\s+on\s+the\s+trained\s+heads)")
altered = quoted.sub(lambda m: f"{float(value) + 0.01:.2f}{m.group(1)}", readme, count=1)
check(altered != readme, "the README quotes evb.floor_trained where the test expects it")


def run_copy(*args):
    return subprocess.run([sys.executable, os.path.join(copy, "tools", "findings.py"), "--items", items_file, *args],
                          capture_output=True, text=True, timeout=300)


open(os.path.join(copy, "README.md"), "w").write(altered)
r = run_copy("--check")
check(r.returncode == 1 and "README.md differs" in r.stderr, f"an altered number is caught: {r.stderr[-500:]}")
open(os.path.join(copy, "README.md"), "w").write(readme)

figures_page = os.path.join(copy, "docs", "figures.md")
figures = open(figures_page).read()
altered = quoted.sub(lambda m: f"{float(value) + 0.01:.2f}{m.group(1)}", figures, count=1)
check(altered != figures, "docs/figures.md quotes evb.floor_trained where the test expects it")
open(figures_page, "w").write(altered)
r = run_copy("--check")
check(r.returncode == 1 and "docs/figures.md differs" in r.stderr and "README.md differs" not in r.stderr,
      f"an altered number in a page is caught, and named by its page: {r.stderr[-500:]}")
os.remove(figures_page)
r = run_copy("--check")
check(r.returncode == 1 and "docs/figures.md is missing" in r.stderr, f"a missing page is caught: {r.stderr[-500:]}")
open(figures_page, "w").write(figures)

# The placeholders' own rules, on a text: a key in any case renders (an all-lowercase pattern once let
# {{evb.P_clustered_vq}} and ten others through as literal text), an unknown key and a finding without a value (NaN)
# are named with their line — every one, {{name}} included: a page that talks about placeholders says so in words.
text = "VQ {{evb.P_clustered_vq}}, {{name}} too\nthen {{evb.P_clustered_vqq}} and {{ evb.floor_trained }}\n{{x.nan}}"
with_nan = dict(items, **{"x.nan": ("nan", "a finding whose rows are missing", "x")})
bad = findings.unrendered(text, with_nan, "T")
check(len(bad) == 4 and bad[0].startswith("T:1: {{name}} is no finding")
      and bad[1].startswith("T:2: {{evb.P_clustered_vqq}} is no finding")
      and "did you mean evb.P_clustered_vq" in bad[1] and bad[2].startswith("T:2: {{ evb.floor_trained }}")
      and bad[3].startswith("T:3: {{x.nan}} has no value"), f"unrendered names each placeholder and line: {bad}")
ok = findings.render("VQ {{evb.P_clustered_vq}}", items, "T")
check(ok == f"VQ {items['evb.P_clustered_vq'][0]}", f"a mixed-case key renders: {ok!r}")
try:
    findings.render(text, with_nan, "T")
    check(False, "render refuses a text with placeholders without a value")
except SystemExit as e:
    check("T:2: {{evb.P_clustered_vqq}}" in str(e) and "T:3: {{x.nan}}" in str(e), f"render names them all: {e}")

# README.md with a placeholder left in it (template unchanged): named by file and line; so in a page, rendered
# (docs/figures.md) or written by hand (docs/testing.md, which has no template).
lines = readme.split("\n")
lines.insert(10, "A sentence quoting {{evb.no_such_finding}} unrendered.")
open(os.path.join(copy, "README.md"), "w").write("\n".join(lines))
r = run_copy("--check")
check(r.returncode == 1 and "README.md:11: {{evb.no_such_finding}} left unrendered" in r.stderr,
      f"a placeholder left in README.md fails the check with its line: {r.stderr[-800:]}")
open(os.path.join(copy, "README.md"), "w").write(readme)
for page in ("figures.md", "testing.md"):
    path = os.path.join(copy, "docs", page)
    text = open(path).read()
    open(path, "w").write("{{evb.no_such_finding}}\n" + text)
    r = run_copy("--check")
    check(r.returncode == 1 and f"docs/{page}:1: {{{{evb.no_such_finding}}}} left unrendered" in r.stderr,
          f"a placeholder left in docs/{page} fails the check with its line: {r.stderr[-800:]}")
    open(path, "w").write(text)

# The template with an unknown placeholder: the check fails naming it, and rendering fails before writing anything.
template = os.path.join(copy, "docs", "README.template.md")
readme_template = open(template).read()
t_lines = readme_template.split("\n")
t_lines.insert(4, "Quoting {{regimes.no_such_finding}} here.")
open(template, "w").write("\n".join(t_lines))
open(os.path.join(copy, "README.md"), "w").write(readme)
r = run_copy("--check")
check(r.returncode == 1 and "docs/README.template.md:5: {{regimes.no_such_finding}} is no finding" in r.stderr,
      f"an unknown placeholder in the template fails the check with its line: {r.stderr[-800:]}")
r = run_copy()
check(r.returncode == 1 and "{{regimes.no_such_finding}}" in r.stderr
      and open(os.path.join(copy, "README.md")).read() == readme,
      f"rendering refuses it and leaves README.md as it was: rc {r.returncode}, {r.stderr[-500:]}")
# The same in a page's template: named by its file and line, nothing rendered.
open(template, "w").write(readme_template)
page_template = os.path.join(copy, "docs", "figures.template.md")
p_lines = open(page_template).read().split("\n")
p_lines.insert(2, "Quoting {{regimes.no_such_finding}} here.")
open(page_template, "w").write("\n".join(p_lines))
r = run_copy("--check")
check(r.returncode == 1 and "docs/figures.template.md:3: {{regimes.no_such_finding}} is no finding" in r.stderr,
      f"an unknown placeholder in a page's template fails the check with its line: {r.stderr[-800:]}")
r = run_copy()
check(r.returncode == 1 and open(figures_page).read() == figures,
      f"rendering refuses it and leaves the page as it was: rc {r.returncode}, {r.stderr[-500:]}")
shutil.rmtree(copy)
shutil.rmtree(os.path.dirname(items_file))

def tree_size(top, skip=()):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs
               if not any(os.path.join(d, f).startswith(s) for s in skip))


# The quick preset's results (what README quotes) within 7.6 MB (5 MB until the pretrained model's 72 heads joined the
# spectrum experiment: 144 points of 512 singular values and their cumulative sums, +2 MB; 7.5 MB until the precision
# experiment joined: its CSV and figure, +0.1 MB; 7.6 MB until it gained every family, the model sources' heads and the
# rounding bound's metrics: +0.45 MB; 8.1 MB until it gained the emulated backward's dQ, dK, dV: +0.15 MB; 8.3 MB
# until Performer's, Nyström's and VQ's emulated backward and the backward's overflow counts joined it: +0.08 MB,
# and the pretrained model's precision study, 4 kB: 8.5 MB, of which 0.92 MB were results/bench/, the benchmarks' timing
# runs — not the quick preset's —, given their own budget of 1 MB when attnlab's exact against PyTorch's SDPA joined
# them: 7.6 MB for the rest; 7.65 MB when Linformer's derived rounding bound joined the precision experiment, +0.03 MB;
# 7.7 MB when Performer eager's and Reformer's joined it, +0.025 MB; 7.71 MB when dQ's, dK's and dV's non-finite
# counts were written apart where any gradient fails, +0.005 MB; 7.72 MB when fine-tuning's step times became one
# thread's, their figure's bars and labels redrawn: finetune_time.png +4.6 kB);
# the paper preset's (docs/paper.md) within 7 MB.
paper_dir = os.path.join(ROOT, "results", "paper")
report_dir = os.path.join(ROOT, "results", "report")  # attnlab report on the trained model: its own budget
gpu_dir = os.path.join(ROOT, "results", "precision_gpu")   # real half-precision outputs from a GPU: their own budget
bench_dir = os.path.join(ROOT, "results", "bench")  # the benchmarks' timing runs (tools/bench*.py): their own budget
size = tree_size(os.path.join(ROOT, "results"), skip=(paper_dir + os.sep, report_dir + os.sep, gpu_dir + os.sep,
                                                     bench_dir + os.sep,
                                                     os.path.join(ROOT, "results", ".pretrained_study") + os.sep))
bench_size = tree_size(bench_dir)
check(bench_size <= 1_000_000, f"committed results/bench/ is {bench_size / 1e6:.2f} MB (≤ 1 MB)")
gpu_size = tree_size(gpu_dir)
check(gpu_size <= 4_000_000, f"committed results/precision_gpu/ is {gpu_size / 1e6:.2f} MB (≤ 4 MB)")
paper_size = tree_size(paper_dir)
report_size = tree_size(report_dir)
check(0 < report_size <= 2_000_000, f"committed results/report/ is {report_size / 1e6:.2f} MB (≤ 2 MB)")
check(paper_size <= 7_000_000, f"committed results/paper/ is {paper_size / 1e6:.2f} MB (≤ 7 MB)")
check(size <= 7_720_000, f"committed results/ without paper/ and bench/ is {size / 1e6:.3f} MB (≤ 7.72 MB)")
plain = [f for f in os.listdir(os.path.join(ROOT, "results"))
         if f.endswith(".csv") and f not in ("compare_default.csv", "timings.csv")]
check(not plain, f"experiment CSVs are compressed: {plain}")
print(f"results/ holds {size / 1e6:.2f} MB, results/paper/ {paper_size / 1e6:.2f} MB")
c.finish()
