#!/usr/bin/env python3
"""The Python tooling under tools/ stays layered:
  - no import cycle among tools/*.py and tools/figures/*.py (every import counts, a function's too: a cycle that
    only closes at run time is still one module needing the other);
  - the modules that compute the quoted numbers (tools/findings.py and what it imports) never reach a module that
    imports matplotlib, and findings.compute on the committed results leaves matplotlib unimported: reading CSVs
    needs no plotting library.

    /usr/bin/python3 tests/scripts/test_tools_graph.py [--print]     (--print: list the edges and the cycles)

Needs Debian's python3-pandas and python3-numpy (findings.compute runs); no attnlab build.
"""
import ast
import os
import subprocess
import sys

from checks import ROOT, TOOLS, Checks

c = Checks()
check = c.check


def modules(tools=TOOLS):
    """{module name as tools/ on sys.path sees it: path}: tools/X.py is X, tools/figures/X.py is figures.X."""
    out = {}
    for sub, prefix in (("", ""), ("figures", "figures.")):
        folder = os.path.join(tools, sub)
        for f in sorted(os.listdir(folder)):
            if f.endswith(".py"):
                name = f[:-3]
                out["figures" if (sub and name == "__init__") else prefix + name] = os.path.join(folder, f)
    return out


def imports(path, name, known):
    """The modules of `known` that the file at path imports, anywhere in it (top level or inside a function):
    {module: [line, ...]}. `name` is the file's own module name (for relative imports inside figures/)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = {}

    def add(target, line):
        # import a.b.c: the deepest known module of that dotted name (a.b.c, else a.b, else a)
        parts = target.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in known:
                lines = out.setdefault(".".join(parts[:k]), [])
                if line not in lines:
                    lines.append(line)
                return

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative: from .common import x, from . import common
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:   # from figures import dropin names a module; from figures.dropin import f does not
                if f"{mod}.{a.name}" in known:
                    add(f"{mod}.{a.name}", node.lineno)
                else:
                    add(mod, node.lineno)
    out.pop(name, None)
    return out


def graph(tools=TOOLS):
    known = modules(tools)
    return known, {m: imports(p, m, known) for m, p in known.items()}


def cycles(edges):
    """The strongly connected components with more than one module (Tarjan), each sorted; [] when acyclic."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def imports_matplotlib(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        if any(n == "matplotlib" or n.startswith("matplotlib.") for n in names):
            return True
    return False


def reach(edges, start):
    """Every module start imports, directly or through others (start included)."""
    seen, todo = {start}, [start]
    while todo:
        for w in edges.get(todo.pop(), {}):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def main():
    known, edges = graph()
    if "--print" in sys.argv:
        for m in sorted(edges):
            for w, lines in sorted(edges[m].items()):
                print(f"{m} -> {w}  (line {', '.join(map(str, lines))})")
        print("cycles:", cycles(edges) or "none")

    found = cycles(edges)
    check(not found, "no import cycle among tools/*.py and tools/figures/*.py: " +
          "; ".join(" <-> ".join(c) + " (" + ", ".join(f"{a} -> {b} line {edges[a][b][0]}" for a in c for b in c
                                                     if b in edges[a]) + ")" for c in found))
    # The checker sees a cycle where there is one (a test that cannot fail tests nothing).
    check(cycles({"a": {"b": [1]}, "b": {"c": [1]}, "c": {"a": [1]}, "d": {"a": [1]}}) == [["a", "b", "c"]],
          "cycles() finds a three-module cycle")
    check(imports(os.path.join(TOOLS, "figures", "scaling.py"), "figures.scaling", known).get("figures.common"),
          "relative imports inside figures/ are read (figures.scaling -> figures.common)")

    # Statically: nothing findings.py imports, directly or not, imports matplotlib.
    plotting = {m for m, p in known.items() if imports_matplotlib(p)}
    check("figures.common" in plotting and "plot_bench" in plotting, f"the matplotlib importers are seen: {plotting}")
    for top in ("findings", "make_notebooks"):
        bad = sorted(reach(edges, top) & plotting)
        check(not bad, f"{top} reaches no module that imports matplotlib: {bad}")

    # At run time: computing every finding from the committed results, the templates' and the notebooks' texts
    # included, imports no matplotlib (a fresh interpreter, so nothing else has imported it before).
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import findings; "
            "items = findings.compute(os.path.join(sys.argv[2], 'results')); "
            "findings.template_problems(items, 'paper.total' in items); findings.notebook_texts(items); "
            "findings.findings_md(items, os.path.join(sys.argv[2], 'results')); "
            "print(len(items), 'findings;', 'matplotlib' in sys.modules and 'matplotlib imported' or 'no matplotlib')")
    r = subprocess.run([sys.executable, "-c", code, TOOLS, ROOT], capture_output=True, text=True, timeout=600)
    check(r.returncode == 0 and r.stdout.strip().endswith("no matplotlib"),
          f"findings.compute does not import matplotlib: rc {r.returncode}, {r.stdout.strip()} {r.stderr[-800:]}")
    print(r.stdout.strip())

    c.finish()


if __name__ == "__main__":
    main()
