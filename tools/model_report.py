#!/usr/bin/env python3
"""The report's recommendation checked on the model, and a recommendation under a model-level loss target.

`attnlab report` picks per head the cheapest method under a head-level output-error target. This applies every
head's pick *together* to the project's trained model (tools/trained_attention.py's committed weights, float64) and
measures what the model loses: the held-out loss increase (nats/byte, with its paired standard error), KL to the
exact model's byte distributions and top-1 agreement. With --loss-target it also chooses per head the cheapest
method that keeps the whole model within that many nats (attnlab.mix.choose_under_loss_target: greedy on measured
losses, see there), choosing on --windows held-out windows and checking the chosen mix on the windows half-way
between them (W − 1, disjoint from them), so the quoted increase is not the one the choice was fitted to.

Writes OUT/model.md (the per-head table of both choices and the model-level check), OUT/model_mix.csv (the chosen
method per head) and OUT/model_check.csv (the model-level measures of each mix); OUT defaults to the report's
directory. For a model of your own, attnlab.mix and attnlab.torch.swap do the same with your loss.

  tools/model_report.py --report results/report [--model mlm|causal] [--loss-target 0.05] [--windows 16]
"""
import argparse
import csv
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dropin  # noqa: E402  (pins the kernels, finds the attnlab module)
from attnlab import mix as mixes  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", required=True, help="a report directory (attnlab report --model-dir ... --out DIR)")
    p.add_argument("--model", choices=["mlm", "causal"], default="mlm",
                   help="which committed model the report is of (mlm: data/attention; causal: data/attention_causal)")
    p.add_argument("--loss-target", type=float, default=None, help="model-level target: loss increase in nats/byte")
    p.add_argument("--windows", type=int, default=16,
                   help="held-out windows to choose on (the mixes are checked on the W - 1 half-way between them)")
    p.add_argument("--noise", type=float, default=0.1, help="speed-ups within 1 + noise of exact do not count")
    p.add_argument("--z", type=float, default=1.64,
                   help="margin: a trial is kept when its loss increase + z x its standard error is within the target")
    p.add_argument("--out", default=None, help="output directory (default: the report's)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if a.loss_target is not None and not a.loss_target > 0:
        p.error("--loss-target must be > 0 nats")
    if a.windows < 3:
        p.error("--windows must be at least 3 (the check uses the W - 1 windows between them)")
    return a


def check(d, mix):
    """The model-level measures (attnlab.study.Dropin's, against its all-exact baseline) of a mix {(layer, head):
    spec} swapped in together, every other head attnlab's exact attention."""
    return d.measure({c["layer"]: [mix.get((c["layer"], h), "exact") for h in range(c["heads"])] for c in d.calls})


def main(argv):
    a = parse_args(argv)
    try:
        report = mixes.read_report(a.report)
    except ValueError as e:
        sys.exit(f"model_report: {e}")
    out = a.out or (a.report if os.path.isdir(a.report) else os.path.dirname(os.path.abspath(a.report)))
    say = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr))
    t0 = time.time()
    choose_windows = dropin.Model(a.model, a.windows)
    held_windows = dropin.Model(a.model, a.windows, shift=0.5)
    L, H = choose_windows.L, choose_windows.H
    bad = [k for k in report if not (0 <= k[0] < L and 0 <= k[1] < H)]
    if bad:
        sys.exit(f"model_report: the report has heads {bad[:3]} that the {a.model} model ({L} layers x {H} heads) "
                 "does not; is it a report of this model?")
    choose, held = choose_windows.study(measures=False), held_windows.study(measures=False)
    results, chosen = [], {}
    rec = mixes.recommended(report)
    chosen["per-head target"] = rec
    say(f"model_report: the report's per-head recommendation: {len(rec)} of {len(report)} heads swapped")
    results.append(("per-head target", "", rec, check(held, rec), check(choose, rec)))
    if a.loss_target is not None:
        def increase(mix):
            m = check(choose, mix)
            return m["dloss"], m["dloss_se"]
        mix, steps = mixes.choose_under_loss_target(report, increase, a.loss_target, a.noise, a.z, progress=say)
        chosen["loss target"] = mix
        results.append(("loss target", a.loss_target, mix, check(held, mix), check(choose, mix)))
        say(f"model_report: {len(steps)} trials; {len(mix)} heads swapped under {a.loss_target} nats")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model_check.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model", "choice", "loss_target", "heads_swapped", "heads", "attention_speedup", "windows",
                    "tokens", "loss", "dloss", "dloss_se", "kl", "top1", "fit_windows", "fit_dloss", "fit_dloss_se"])
        for name, target, mix, m, fit in results:
            w.writerow([a.model, name, target, len(mix), len(report), f"{mixes.attention_speedup(report, mix):.4g}",
                        len(held_windows.starts), held_windows.tokens, f"{m['loss']:.6f}", f"{m['dloss']:.6f}",
                        f"{m['dloss_se']:.6f}", f"{m['kl']:.6f}", f"{m['top1']:.4f}", a.windows, f"{fit['dloss']:.6f}",
                        f"{fit['dloss_se']:.6f}"])
    with open(os.path.join(out, "model_mix.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model", "choice", "layer", "head", "spec", "family", "budget", "head_error", "time_s",
                    "exact_time_s"])
        for name, mix in chosen.items():
            for key, h in report.items():
                spec = mix.get(key)
                c = next((c for c in h["candidates"] if c["spec"] == spec), None)
                w.writerow([a.model, name, key[0], key[1], spec or "exact", c["family"] if c else "",
                            f"{c['budget']:g}" if c and c["budget"] is not None else "",
                            f"{c['error']:.4g}" if c else "0", f"{c['time_s']:.4g}" if c else
                            f"{h['exact_time_s']:.4g}", f"{h['exact_time_s']:.4g}"])
    lines = [f"# The report's choices on the model ({a.model})", "",
             f"Every head's choice applied together to the committed {a.model} model (float64), measured on "
             f"{len(held_windows.starts)} held-out windows ({held_windows.tokens} scored bytes) half-way between the "
             f"{a.windows} "
             "that the loss-target choice was made on. "
             "Loss increase in nats/byte (± its paired standard error); attention speed-up: Σ exact time / Σ chosen "
             "time over the heads, at the report's cost length. Made by `tools/model_report.py`.", "",
             "| choice | heads swapped | attention speed-up | loss increase | KL(exact ‖ mix) | top-1 agreement | "
             "loss increase on the choosing windows |",
             "|---|---|---|---|---|---|---|"]
    for name, target, mix, m, fit in results:
        label = name + (f" ≤ {target} nats" if target != "" else "")
        lines.append(f"| {label} | {len(mix)} / {len(report)} | {mixes.attention_speedup(report, mix):.2f}× | "
                     f"{m['dloss']:+.4f} ± {m['dloss_se']:.4f} | {m['kl']:.4f} | {100 * m['top1']:.1f}% | "
                     f"{fit['dloss']:+.4f} ± {fit['dloss_se']:.4f} |")
    lines += ["", "| head | " + " | ".join(chosen) + " |", "|---|" + "---|" * len(chosen)]
    for key in report:
        lines.append(f"| L{key[0]}H{key[1]} | " + " | ".join(f"`{mix.get(key, 'exact')}`" for mix in chosen.values())
                     + " |")
    if a.loss_target is not None:
        lines += ["", "How the loss-target choice is made: " + " ".join(
            mixes.__doc__.split("How choose_under_loss_target chooses (greedy, on measured losses):")[1].split())]
    with open(os.path.join(out, "model.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"model_report: wrote {os.path.join(out, 'model.md')}, model_check.csv, model_mix.csv "
          f"in {time.time() - t0:.0f} s")
    for name, target, mix, m, fit in results:
        print(f"  {name}: {len(mix)}/{len(report)} heads swapped, "
              f"attention {mixes.attention_speedup(report, mix):.2f}x,"
              f" loss {m['dloss']:+.4f} ± {m['dloss_se']:.4f} nats/byte (on the choosing windows "
              f"{fit['dloss']:+.4f} ± {fit['dloss_se']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
