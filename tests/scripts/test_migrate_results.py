"""tools/migrate_results.py: schema-1 results CSVs become schema 2 (sequence, layer, head, dtype in their own columns;
every other field's text, the row order and gzip kept), in place or into a directory, idempotently; and
tools/compare_results.py compares a schema-1 directory with a schema-2 one (identical when the values are, different
when one value differs). Standard library and pandas only: no attnlab executable needed."""
import csv
import gzip
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

from checks import TOOLS, Checks, import_tools

import_tools()
import migrate_results  # noqa: E402

c = Checks()
check = c.check


def tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(TOOLS, name), *map(str, args)], capture_output=True, text=True)


V1 = ["schema_version", "code_version", "experiment", "point", "source", "method", "spec", "n", "d", "seed", "variant",
      "step", "metric", "value"]
V2 = ["schema_version", "code_version", "experiment", "point", "source", "method", "spec", "n", "d", "seed", "sequence",
      "layer", "head", "dtype", "variant", "step", "metric", "value"]
# (schema-1 row, the schema-2 row it becomes): every way schema 1 packed a head, a sequence or a dtype elsewhere.
CASES = [
    # a generated source: nothing moves (a spec with commas stays quoted, "inf" stays "inf")
    ("1,v,error_vs_budget,p0,gaussian,svd,\"svd:rank=8,solver=auto\",512,64,2,svd,8,out_rel_fro,0.5",
     "2,v,error_vs_budget,p0,gaussian,svd,\"svd:rank=8,solver=auto\",512,64,2,,,,,svd,8,out_rel_fro,0.5"),
    ("1,v,pinv,p0,gaussian,nystrom,landmarks=8,512,64,0,order3,8,iterations_to_1e-6,inf",
     "2,v,pinv,p0,gaussian,nystrom,landmarks=8,512,64,0,,,,,order3,8,iterations_to_1e-6,inf"),
    ("1,v,pinv,p0,,,,,,,,,point_done,1", "2,v,pinv,p0,,,,,,,,,,,,,point_done,1"),
    # a model head in the source column, the held-out sequence in the seed column
    ("1,v,error_vs_budget,p1,trained/L1H2,svd,svd:rank=8,512,32,3,svd,8,out_rel_fro,0.25",
     "2,v,error_vs_budget,p1,trained,svd,svd:rank=8,512,32,3,3,1,2,,svd,8,out_rel_fro,0.25"),
    ("1,v,vq,p2,trained_causal/L0H3,vq,vq:codes=8,512,32,0,hard,8,out_rel_fro,0.5",
     "2,v,vq,p2,trained_causal,vq,vq:codes=8,512,32,0,0,0,3,,hard,8,out_rel_fro,0.5"),
    ("1,v,probsparse,p3,files/head1,probsparse,,64,16,0,full,50,M_quantile,1.5",
     "2,v,probsparse,p3,files,probsparse,,64,16,0,,,1,,full,50,M_quantile,1.5"),
    # regimes: the head in the variant column
    ("1,v,regimes,p4,initialized,exact,,512,32,1,L3H0,,entropy,2.5",
     "2,v,regimes,p4,initialized,exact,,512,32,1,1,3,0,,,,entropy,2.5"),
    ("1,v,regimes,p5,files,exact,,64,16,0,head2,,entropy,1.25",
     "2,v,regimes,p5,files,exact,,64,16,0,,,2,,,,entropy,1.25"),
    ("1,v,regimes,p6,gaussian,exact,,512,64,0,T=0.5,,entropy,3",
     "2,v,regimes,p6,gaussian,exact,,512,64,0,,,,,T=0.5,,entropy,3"),
    # spectrum: the head in the variant column ("head=H" for the files), the step the singular value's index
    ("1,v,spectrum,p7,trained,exact,,512,32,2,L2H1,5,singular_value,0.125",
     "2,v,spectrum,p7,trained,exact,,512,32,2,2,2,1,,,5,singular_value,0.125"),
    ("1,v,spectrum,p8,files,exact,block,64,16,0,head=0,1,top_singular_value,0.5",
     "2,v,spectrum,p8,files,exact,block,64,16,0,,,0,,,1,top_singular_value,0.5"),
    # compare: the dtype (and "causal") in the variant column, the head in the step column
    ("1,v,compare,p9,gaussian,exact,exact,1024,64,0,float64,0,out_rel_fro,0",
     "2,v,compare,p9,gaussian,exact,exact,1024,64,0,,,0,float64,,,out_rel_fro,0"),
    ("1,v,compare,p10,files,local,local:window=8,64,16,0,\"float32,causal\",2,out_rel_fro,0.75",
     "2,v,compare,p10,files,local,local:window=8,64,16,0,,,2,float32,causal,,out_rel_fro,0.75"),
]
V1_TEXT = ",".join(V1) + "\n" + "".join(a + "\n" for a, _ in CASES)
V2_TEXT = ",".join(V2) + "\n" + "".join(b + "\n" for _, b in CASES)


def gz(text):
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return z.compress(text.encode()) + z.flush()


tmp = tempfile.mkdtemp(prefix="attnlab_migrate_")
old, new = os.path.join(tmp, "old"), os.path.join(tmp, "new")
os.makedirs(old)
with open(os.path.join(old, "mixed.csv.gz"), "wb") as f:
    f.write(gz(V1_TEXT))
with open(os.path.join(old, "mixed.csv.gz.config"), "w") as f:
    f.write("preset = quick\n")
with open(os.path.join(old, "plain.csv"), "w") as f:
    f.write(V1_TEXT)
with open(os.path.join(old, "dropin.csv.gz"), "wb") as f:   # its own columns: skipped
    f.write(gz("code_version,model,layer,head,loss\nv,causal,0,1,2.5\n"))

# Each row as expected, in order; the text of the rest kept; parsed by the csv module as well.
text, n, dropped = migrate_results.migrate_text(V1_TEXT)
check(text == V2_TEXT and n == len(CASES) and dropped == 0, f"migrated text:\n{text}")
for (a, b), row in zip(CASES, csv.reader(io.StringIO(text.split("\n", 1)[1]))):
    check(row == next(csv.reader([b])) and len(row) == len(V2), f"{a} -> {row}")
# A torn last line (an interrupted run) is dropped, as a resumed run drops it.
text, n, dropped = migrate_results.migrate_text(V1_TEXT + "1,v,pinv,p0,gauss")
check(text == V2_TEXT and dropped == 1, f"torn last line: {dropped} dropped")
# Not schema 1: refused.
try:
    migrate_results.migrate_text(V2_TEXT)
    check(False, "a schema-2 text is refused by migrate_text")
except ValueError:
    pass

# Into a directory: gzip kept (the bytes attnlab writes: zlib level 9, no time stamp), sidecars copied, others skipped.
r = tool("migrate_results.py", "--out", new, old)
check(r.returncode == 0, f"migrate --out: {r.stderr}")
check(open(os.path.join(new, "mixed.csv.gz"), "rb").read() == gz(V2_TEXT), "gzip output: attnlab's bytes")
check(gzip.open(os.path.join(new, "mixed.csv.gz"), "rt").read() == V2_TEXT, "gzip output readable")
check(open(os.path.join(new, "plain.csv")).read() == V2_TEXT, "plain output")
check(os.path.exists(os.path.join(new, "mixed.csv.gz.config")), "sidecar copied")
check(not os.path.exists(os.path.join(new, "dropin.csv.gz")) and "dropin.csv.gz: skipped" in r.stdout,
      f"own-column CSVs skipped: {r.stdout}")
check(open(os.path.join(old, "mixed.csv.gz"), "rb").read() == gz(V1_TEXT), "--out leaves the input alone")

# compare_results: schema 1 against schema 2 with the same values -> identical; one value changed -> different.
shutil.copyfile(os.path.join(old, "dropin.csv.gz"), os.path.join(new, "dropin.csv.gz"))
r = tool("compare_results.py", old, new)
check(r.returncode == 0 and "mixed.csv.gz: 13 non-timing values, identical" in r.stdout and "migrated" in r.stdout,
      f"compare 1 vs 2: {r.returncode} {r.stdout} {r.stderr}")
r = tool("compare_results.py", new, new)
check(r.returncode == 0 and "DIFFERENT" not in r.stdout and "migrated" not in r.stdout, f"compare 2 vs 2: {r.stdout}")
changed = V2_TEXT.replace("trained,svd,svd:rank=8,512,32,3,3,1,2,,svd,8,out_rel_fro,0.25",
                          "trained,svd,svd:rank=8,512,32,3,3,1,2,,svd,8,out_rel_fro,0.26")
check(changed != V2_TEXT, "the test changes a value")
with open(os.path.join(new, "plain.csv"), "w") as f:
    f.write(changed)
r = tool("compare_results.py", old, new)
check(r.returncode == 1 and "plain.csv: 13 non-timing values, DIFFERENT" in r.stdout and
      "mixed.csv.gz: 13 non-timing values, identical" in r.stdout, f"compare, one value differs: {r.stdout}")
# A value moved to another head is a difference too (the new columns are part of the rows' identity).
with open(os.path.join(new, "plain.csv"), "w") as f:
    f.write(V2_TEXT.replace("trained,svd,svd:rank=8,512,32,3,3,1,2,", "trained,svd,svd:rank=8,512,32,3,3,1,3,"))
r = tool("compare_results.py", old, new)
check(r.returncode == 1 and "plain.csv: 13 non-timing values, DIFFERENT" in r.stdout,
      f"compare, head moved: {r.stdout}")

# In place, idempotent: a second run leaves schema-2 files alone.
r = tool("migrate_results.py", os.path.join(old, "mixed.csv.gz"), os.path.join(old, "plain.csv"))
check(r.returncode == 0 and open(os.path.join(old, "mixed.csv.gz"), "rb").read() == gz(V2_TEXT) and
      open(os.path.join(old, "plain.csv")).read() == V2_TEXT, f"in place: {r.stdout} {r.stderr}")
r = tool("migrate_results.py", old)
check(r.returncode == 0 and "already schema 2" in r.stdout and
      open(os.path.join(old, "mixed.csv.gz"), "rb").read() == gz(V2_TEXT), f"idempotent: {r.stdout}")
r = tool("migrate_results.py", os.path.join(tmp, "absent.csv"))
check(r.returncode != 0 and "no such file" in r.stderr, f"missing file: {r.stderr}")

shutil.rmtree(tmp)
c.finish()
