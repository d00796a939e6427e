#!/usr/bin/env python3
"""Model level of the reduced-precision study (issue "Reduced precision", item 4): the project's trained models with
every attention swapped to a method run in emulated bfloat16 or float16 storage (attnlab's exact CPU emulation, eager
and careful policies), against the same models with attnlab's exact attention in float64 — so that an approximation
harmless in float64 can be seen to be harmful in half precision, and the rounding's own cost (exact@FORMAT) read
beside it.

Models and windows as tools/dropin.py (its Model class: the masked LM `mlm`, the causal LM `causal`, in float64,
held-out windows, seeded masks). Every attention of a swap is attnlab's; only the attention is in the reduced format
(the rest of the model stays float64): what the attention's storage costs, not the whole network's. Per (model, spec,
precision, policy): loss, loss_se, dloss (against exact float64) and its paired SE, KL and top-1 agreement against the
exact model, whether every logit stayed finite. A swap whose attention returns non-finite values makes the next layer's
attention refuse its inputs: a `failed` row. A method the emulation does not cover (the causal kernel forms, the
methods not yet emulated) is a `refused` row with the reason.

    tools/precision_model.py [--out results/precision_model.csv.gz] [--models mlm,causal] [--windows 8]
"""
import argparse
import csv
import gzip
import os
import sys
import time
import warnings

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dropin  # noqa: E402  (its imports pin torch's and OpenBLAS's kernels and find the attnlab module)
import torch  # noqa: E402

attnlab = dropin.attnlab

SPECS = {"mlm": ["exact", "linear", "performer:features=64", "performer:features=256", "nystrom:landmarks=32",
                 "linformer:k=64", "local:window=32", "reformer:rounds=2", "probsparse", "vq:codes=32"],
         "causal": ["exact", "linear", "performer:features=64", "local:window=32", "reformer:rounds=2", "probsparse"]}
PRECISIONS = [("fp64", ""), ("bf16", "eager"), ("bf16", "careful"), ("fp16", "eager"), ("fp16", "careful")]
COLUMNS = ["model", "spec", "precision", "policy", "status", "loss", "loss_se", "dloss", "dloss_se", "kl", "top1",
           "finite", "windows", "tokens", "time_s"]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "results", "precision_model.csv.gz"))
    p.add_argument("--models", default="mlm,causal")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                   help="threads of torch and of attnlab (default: 2 or the CPUs)")
    a = p.parse_args(argv)
    if a.threads < 1:
        p.error(f"--threads {a.threads}: at least 1")
    torch.set_num_threads(a.threads)
    attnlab.set_threads(a.threads)   # else attnlab's OpenMP default: every core, spinning beside other processes
    rows = []
    for name in a.models.split(","):
        model = dropin.Model(name, a.windows)
        d = model.study(measures=False)
        for spec in SPECS[name]:
            for fmt, pol in PRECISIONS:
                swap = spec if fmt == "fp64" else f"{spec}@{fmt}-{pol}"
                r = dict(model=name, spec=attnlab.canonical(spec) if spec != "exact" else "exact", precision=fmt,
                         policy=pol, windows=a.windows, tokens=model.tokens)
                t = time.time()
                try:
                    attnlab.canonical(swap, causal=model.causal)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)   # a failing output is this row's finding
                        # A swap whose attention returns non-finite values is a `failed` row (attnlab.study's
                        # measure: the next layer's attention refuses its inputs), not an exception.
                        r.update(d.measure(swap))
                except ValueError as e:
                    r["status"] = "refused: " + str(e).splitlines()[0][:200]
                r["time_s"] = round(time.time() - t, 2)
                rows.append(r)
                print(f"precision_model: {name} {swap[:50]:50s} {r['status'][:40]:40s} "
                      f"dloss {r.get('dloss', float('nan')):+.4f} ({r['time_s']} s)", file=sys.stderr)
    tmp = a.out + ".tmp"
    with gzip.open(tmp, "wt", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, a.out)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
