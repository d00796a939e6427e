"""Tiny harness shared by the script tests that run the attnlab command: the command, a scratch directory, and
checks.py's record of checks."""
import os
import subprocess
import sys
import tempfile

from checks import Checks  # noqa: F401  (the tests import it from here)

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
