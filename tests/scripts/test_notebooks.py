"""Every notebook under notebooks/ executes headless (nbconvert, Debian's python3 kernel) against the committed
quick-preset CSVs, without an error."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
books = sorted(glob.glob(os.path.join(root, "notebooks", "*.ipynb")))
passed, failed = 0, 0
work = tempfile.mkdtemp(prefix="attnlab_nb_")
env = dict(os.environ, ATTNLAB_ROOT=root, ATTNLAB_RESULTS=os.path.join(root, "results"),
           ATTNLAB_FIGURES=os.path.join(work, "figures"))
for nb in books:
    copy = os.path.join(work, os.path.basename(nb))
    shutil.copy(nb, copy)
    r = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                        "--ExecutePreprocessor.timeout=300", copy], capture_output=True, text=True, cwd=root, env=env)
    if r.returncode == 0:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {os.path.basename(nb)}: {r.stderr[-800:]}")
if not books:
    failed += 1
    print("FAIL: no notebooks found")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
