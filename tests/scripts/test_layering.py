#!/usr/bin/env python3
"""The library's layers hold (docs/library.md, "Layout": a layer includes only those above it in the table): every
`#include "attnlab/LAYER/..."` in lib/include/attnlab/LAYER2/ and lib/src/LAYER2/ names a layer at or above LAYER2 in
the table's order (core, io, operators, components, methods, analysis, read from the table itself). lib/src/detail/
holds private helpers: a helper's layer is the lowest one its own includes need, and only files of that layer or
below it in the table may include it. The umbrella header attnlab/attnlab.hpp includes everything. A folder under
lib/include/attnlab/ or lib/src/ that the table does not name fails, so that a new layer is placed before it is used.

The checker is tested first on synthetic trees: a clean one passes, and planted violations (a core header including
a method, a method's source including analysis/, a core source including a detail helper that needs operators/, an
unknown folder) are each reported.

    /usr/bin/python3 tests/scripts/test_layering.py

Standard library only; no attnlab build.
"""
import os
import re
import tempfile

from checks import ROOT, Checks

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?:attnlab/(\w+)/|detail/)([^">]+)[">]')
UMBRELLA = "attnlab.hpp"


def layer_order(library_md):
    """The layers in the order of the Layout table's rows `lib/include/attnlab/LAYER/`."""
    with open(library_md, encoding="utf-8") as f:
        return [m.group(1) for m in re.finditer(r"^\| `lib/include/attnlab/(\w+)/` \|", f.read(), re.M)]


def includes(path):
    """(line number, the included layer or "detail", the rest of the path) of each attnlab or detail include."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                out.append((number, m.group(1) or "detail", m.group(2)))
    return out


def sources(lib):
    """(path, its layer) of every file under lib/include/attnlab/ and lib/src/ (layer None: the umbrella header)."""
    for top in (os.path.join(lib, "include", "attnlab"), os.path.join(lib, "src")):
        for base, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__",) and not d.startswith("."))
            for name in sorted(names):
                path = os.path.join(base, name)
                rel = os.path.relpath(path, top).split(os.sep)
                if len(rel) == 1:
                    yield path, None if name == UMBRELLA else "?"
                else:
                    yield path, rel[0]


def violations(lib, order):
    """Each include that crosses the layers the wrong way, as a line of text; [] when the rule holds."""
    rank = {layer: i for i, layer in enumerate(order)}
    found = []
    files = list(sources(lib))
    # A detail helper's layer: the lowest in the table that its own attnlab includes need.
    detail = {}
    for path, layer in files:
        if layer == "detail":
            need = [rank.get(inc, len(order)) for _, inc, _ in includes(path) if inc != "detail"]
            detail[os.path.basename(path)] = max(need, default=0)
    for path, layer in files:
        rel = os.path.relpath(path, lib)
        if layer is None:
            continue
        if layer == "?" or (layer not in rank and layer != "detail"):
            found.append(f"{rel}: in no layer of the table ({', '.join(order)})")
            continue
        here = rank[layer] if layer != "detail" else detail[os.path.basename(path)]
        for number, inc, rest in includes(path):
            if inc == "detail":
                there = detail.get(os.path.basename(rest))
                if there is None:
                    found.append(f"{rel}:{number}: detail/{rest} does not exist")
                elif there > here:
                    found.append(f"{rel}:{number}: a {layer} file includes detail/{rest}, which needs "
                                 f"{order[there]}/")
            elif inc not in rank:
                found.append(f"{rel}:{number}: attnlab/{inc}/{rest} is in no layer of the table")
            elif rank[inc] > here:
                found.append(f"{rel}:{number}: a {layer} file includes attnlab/{inc}/{rest}, a layer below it")
    return found


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


c = Checks()
order = layer_order(os.path.join(ROOT, "docs", "library.md"))
c.check(order == ["core", "io", "operators", "components", "methods", "analysis"],
        f"docs/library.md's table names the layers in order: {order}")

# The checker on synthetic trees: clean, then one planted violation at a time.
with tempfile.TemporaryDirectory() as tmp:
    clean = {
        "include/attnlab/attnlab.hpp": '#include "attnlab/analysis/a.hpp"\n#include "attnlab/core/c.hpp"\n',
        "include/attnlab/core/c.hpp": '#include "attnlab/core/d.hpp"\n#include <vector>\n',
        "include/attnlab/core/d.hpp": "",
        "include/attnlab/operators/o.hpp": '#include "attnlab/core/c.hpp"\n',
        "include/attnlab/methods/m.hpp": '#include "attnlab/operators/o.hpp"\n// #include "attnlab/analysis/a.hpp"\n',
        "include/attnlab/analysis/a.hpp": '#include "attnlab/methods/m.hpp"\n',
        "src/detail/helper.hpp": '#include "attnlab/operators/o.hpp"\n',
        "src/methods/m.cpp": '#include "attnlab/methods/m.hpp"\n#include "detail/helper.hpp"\n',
        "src/core/c.cpp": '#include <attnlab/core/c.hpp>\n',
    }
    planted = {
        "include/attnlab/core/c.hpp": ('#include "attnlab/methods/m.hpp"\n',
                                       "include/attnlab/core/c.hpp:1: a core file includes attnlab/methods/m.hpp"),
        "src/methods/m.cpp": ('#include "attnlab/methods/m.hpp"\n  #  include <attnlab/analysis/a.hpp>\n',
                              "src/methods/m.cpp:2: a methods file includes attnlab/analysis/a.hpp"),
        "src/core/c.cpp": ('#include "detail/helper.hpp"\n',
                           "src/core/c.cpp:1: a core file includes detail/helper.hpp, which needs operators/"),
        "src/extra/x.cpp": ('#include "attnlab/core/c.hpp"\n', "src/extra/x.cpp: in no layer of the table"),
        "include/attnlab/io/n.hpp": ('#include "attnlab/nowhere/n.hpp"\n',
                                     "include/attnlab/io/n.hpp:1: attnlab/nowhere/n.hpp is in no layer"),
    }
    for name, (text, expected) in planted.items():
        root = os.path.join(tmp, name.replace("/", "_"))
        for rel, body in clean.items():
            write(root, rel, body)
        c.check(violations(root, order) == [], f"the clean synthetic tree passes ({name})")
        write(root, name, text)
        got = violations(root, order)
        c.check(len(got) == 1 and got[0].startswith(expected), f"planted in {name}: {expected!r} reported, got {got}")

# The library itself.
found = violations(os.path.join(ROOT, "lib"), order)
for v in found:
    print(f"  {v}")
c.check(not found, f"every include in lib/ goes up the layers ({len(found)} do not)")
c.check(len(list(sources(os.path.join(ROOT, "lib")))) > 100, "lib/'s files were found")
c.finish()
