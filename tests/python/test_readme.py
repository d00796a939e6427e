"""The README's quick start runs as written: its first Python block, executed in a scratch directory, swaps, captures
(and the export it saves is one `attnlab report` reads), runs the drop-in study and fine-tunes."""
import os
import re
import subprocess

import pytest

pytest.importorskip("torch")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def quick_start():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Quick start: your own model", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_quick_start_runs_as_written(tmp_path, monkeypatch, capsys):
    code = quick_start()
    binary = os.environ.get("ATTNLAB_BIN") and os.path.abspath(os.environ["ATTNLAB_BIN"])
    assert len(code.strip().splitlines()) <= 30   # a quick start, not a tutorial (the issue: ≤ 30 lines)
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "README.md quick start", "exec"), scope)
    rows, ft = scope["rows"], scope["ft"]
    assert rows[0]["scope"] == "exact" and rows[0]["max_abs_own"] <= 1e-10
    assert {r["scope"] for r in rows} == {"exact", "all", "layer", "head"}
    assert [r["step"] for r in ft if r["arm"] == "method"] == [0, 1, 2, 3, 4]
    assert all(r["status"] == "ok" for r in ft)
    assert (tmp_path / "my_export" / "meta.json").exists()
    if binary:   # the report command the comment names reads the export
        r = subprocess.run([binary, "report", "--model-dir", "my_export", "--causal", "--out", "my_report",
                            "--families", "local", "--repeats", "1"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "my_report" / "report.csv").exists()
