#!/usr/bin/env python3
"""The house style's line width (.clang-format: ColumnLimit 120) holds for every code file: C++, CMake, Python and
shell sources under lib/, cli/, experiments/, report/, python/, bench/, tests/, tools/ and examples/ have no line
over 120 characters (counted in characters, not bytes: the comments' formulas are UTF-8).

    /usr/bin/python3 tests/scripts/test_code_width.py

Standard library only; no attnlab build.
"""
import os

from checks import ROOT, Checks

LIMIT = 120
FOLDERS = ("lib", "cli", "experiments", "report", "python", "bench", "tests", "tools", "examples")
SUFFIXES = (".cpp", ".hpp", ".h", ".py", ".sh", ".cmake")
NAMES = ("CMakeLists.txt",)

c = Checks()
files = 0
for folder in FOLDERS:
    for base, dirs, names in os.walk(os.path.join(ROOT, folder)):
        dirs[:] = [d for d in dirs if d not in ("__pycache__",) and not d.startswith(".")]
        for name in sorted(names):
            if not (name.endswith(SUFFIXES) or name in NAMES):
                continue
            path = os.path.join(base, name)
            files += 1
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    width = len(line.rstrip("\n"))
                    c.check(width <= LIMIT, f"{os.path.relpath(path, ROOT)}:{number}: {width} characters")
c.check(files > 100, f"the code files were found ({files})")
c.finish()
