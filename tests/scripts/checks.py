"""What every script test shares: the repository's paths, tools/ importable, and the record of checks with its
summary. Standard library only and no attnlab executable: the tests of tools/ import it directly; harness.py adds
the command for the tests that run it."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = os.path.join(ROOT, "tools")


def import_tools():
    """Puts tools/ first on sys.path, so that its modules (plot, findings, figures, ...) import as they do there."""
    sys.path.insert(0, TOOLS)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"FAIL: {what}", flush=True)

    def finish(self):
        print(f"{self.passed} passed, {len(self.failed)} failed")
        sys.exit(1 if self.failed else 0)
