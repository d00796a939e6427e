"""The fine-tuning experiment (tools/finetune.py): the held-out loss of the trained models while they train on with
each family swapped into every layer, against the exact control; and what a training step costs."""
import math

import numpy as np

from .common import family_colour, family_label, family_marker, finish, plt
from .data import load_finetune, timed_on

MODELS = {"mlm": "masked-LM model (bidirectional)", "causal": "causal LM (next byte)"}
# Three panels per model, at most five families each beside the exact control (≤ 6 labelled series).
GROUPS = [("low-rank", ["nystrom", "nystrom_svd", "linformer_pool", "linformer_gaussian"]),
          ("kernel", ["performer", "linear"]),
          ("sparse and clustered", ["local", "reformer", "probsparse", "vq", "scatterbrain"])]


def plot_finetune(results, out):
    df = load_finetune(results)
    if df is None:
        return []
    return [_curves(df, out), _time(df, out, timed_on(results))]


def _curves(df, out):
    models = [m for m in MODELS if m in set(df.model)]
    fig, axes = plt.subplots(len(models), len(GROUPS), figsize=(4.6 * len(GROUPS), 3.6 * len(models)),
                             squeeze=False)
    for i, m in enumerate(models):
        dm = df[df.model == m]
        exact = dm[dm.family == "exact"].sort_values("step")
        steps = int(dm.steps.iloc[0])
        for j, (gname, fams) in enumerate(GROUPS):
            ax = axes[i][j]
            shown = [f for f in fams if f in set(dm.family)]
            if not shown:   # the causal model has no low-rank method (their pooling and projections see the future)
                ax.text(0.5, 0.5, f"{MODELS[m]}:\nno causal method of this group", ha="center", va="center",
                        transform=ax.transAxes)
                ax.axis("off")
                continue
            ax.plot(exact.step, exact.heldout_loss, color="black", lw=1.8, ls="--", label="exact (control)")
            # The panel's y range: its losses after step 0 and the exact control's; a drop-in start above it sits on
            # the top edge (▲, its value written beside), so that the recovery stays readable when it starts far off.
            d = dm[dm.family.isin(shown) & dm.heldout_loss.notna()]
            ys = list(d[d.step > 0].heldout_loss) + list(exact.heldout_loss)
            lo, hi = min(ys), max(ys)
            lo, hi = lo - 0.05 * (hi - lo), hi + 0.15 * (hi - lo)
            for f in shown:
                d = dm[dm.family == f].sort_values("step")
                d = d[d.heldout_loss.notna()]
                c, mk = family_colour(f), family_marker(f)
                y = d.heldout_loss.clip(upper=hi)
                ok = d.status.iloc[0] == "ok"
                ax.plot(d.step, y, color=c, marker=mk, ms=4, lw=1.4,
                        label=family_label(f) + ("" if ok else " (" + d.status.iloc[0].split(" (")[0] + ")"))
                start = d[d.step == 0]
                if len(start):   # the drop-in loss: an open marker (▲ on the edge when beyond the axis)
                    v = float(start.heldout_loss.iloc[0])
                    above = v > hi
                    ax.plot([0], [min(v, hi)], ls="none", marker="^" if above else mk, ms=8 if above else 7,
                            mfc="white", mec=c, mew=1.5, label="_start", clip_on=False, zorder=4)
                    if above:
                        ax.annotate(f"{v:.2f}", (0, hi), xytext=(9, -4 - 9 * shown.index(f)),
                                    textcoords="offset points", color=c, fontsize=7, va="top")
            ax.set_ylim(lo, hi)
            ax.set_xlim(-0.5, steps * 1.02)
            ax.set_xlabel("fine-tuning step (optimizer updates)")
            ax.set_ylabel("held-out loss (nats/byte)")
            ax.set_title(f"{MODELS[m]}: {gname}", fontsize=9)
            ax.grid(True, lw=0.3, alpha=0.5)
            ax.legend(loc="best", fontsize=7)
    return finish(fig, out, "finetune",
                  "Fine-tuning after the swap: held-out loss of the trained models with every attention layer "
                  f"replaced by the family at its default budget and trained on ({setting(df)}; the same batches "
                  "for every family). Open markers: the drop-in loss before training (▲: beyond the axis, value "
                  "beside); dashed: exact attention trained the same way. No paper figure: Performer's 'backwards "
                  "compatibility' plot is the closest.")


def setting(df):
    """The run's training setting, as the captions state it."""
    r = df.iloc[0]
    return f"{int(r.steps)} AdamW steps at peak lr {r.lr:g}, {int(r.batch)} × 512 bytes a step, float32"


def _time(df, out, timed):
    start = df[df.step == 0]
    models = [m for m in MODELS if m in set(start.model)]
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 4.2), squeeze=False)
    for ax, m in zip(axes[0], models):
        d = start[(start.model == m) & start.time_ratio_exact.notna()]
        d = d.iloc[np.argsort(-d.time_ratio_exact.values, kind="stable")]
        names = {"torch": "PyTorch's own attention", "exact": "exact (attnlab)"}
        labels = [names.get(f, family_label(f)) for f in d.family]
        colours = [family_colour(f) if f != "torch" else "0.5" for f in d.family]
        y = np.arange(len(d))
        ax.barh(y, d.time_ratio_exact, color=colours, height=0.7)
        for k, (v, sec) in enumerate(zip(d.time_ratio_exact, d.time_per_step_s)):
            ax.text(v, k, f" {v:.2f}× ({1e3 * sec:.0f} ms)", va="center", fontsize=7)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xlim(0, max(1.2, float(d.time_ratio_exact.max()) * 1.45))
        ax.set_xlabel("time per training step / exact attention's (attnlab), ratio")
        exact_ms = 1e3 * float(d[d.family == "exact"].time_per_step_s.iloc[0]) if (d.family == "exact").any() \
            else math.nan
        ax.set_title(f"{MODELS[m]}\nexact attention: {exact_ms:.0f} ms per step", fontsize=9)
    return finish(fig, out, "finetune_time",
                  "What a fine-tuning step costs: the median wall time of an optimizer step of the whole model "
                  f"(forward, backward, update; {setting(df)}) with each family swapped in, over exact attention's "
                  f"through attnlab in the same run ({timed}); grey: the model's own PyTorch attention. At n = 512 "
                  "attention is about half of this small model's step (timing: varies by machine).")
