"""Tiny harness shared by the script tests: run the attnlab command, record checks, print a summary."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np  # noqa: F401
except ImportError:
    sys.exit(f"{sys.executable} has no numpy: run the script tests with Debian's /usr/bin/python3 "
             "(apt-get install python3-numpy) or set ATTNLAB_PYTHON")

BIN = os.environ.get("ATTNLAB_BIN") or sys.exit("ATTNLAB_BIN is not set (the attnlab executable)")
TMP = tempfile.mkdtemp(prefix="attnlab_script_")


def path(name):
    return os.path.join(TMP, name)


def run(*args, timeout=300):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


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
