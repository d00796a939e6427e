"""The model-level studies on the pretrained all-MiniLM-L6-v2 (tools/pretrained_study.py): what the model loses with
each family swapped into every layer (its contrastive loss and its retrieval agreement), and fine-tuning against the
exact control."""
import math

from .common import family_colour, family_label, family_marker, finish, plt
from .data import load_pretrained

def plot_pretrained(results, out):
    done = []
    d = load_pretrained(results, "dropin")
    if d is not None:
        done.append(_dropin(d, out))
    f = load_pretrained(results, "finetune")
    if f is not None:
        done.append(_finetune(f, out))
    return done


def _dropin(df, out):
    a = df[df.scope == "all"]
    fams = list(dict.fromkeys(a.family))
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 0.36 * len(fams) + 1.6), sharey=True)
    y = {f: i for i, f in enumerate(fams)}
    for ax, col, se, xlabel in ((axes[0], "dloss", "dloss_se", "loss increase over exact (nats per pair, ± SE)"),
                                (axes[1], "recall10", None, "recall@10 of the exact model's passages")):
        for f in fams:
            d = a[a.family == f].reset_index(drop=True)
            n = len(d)
            for i, r in d.iterrows():   # the family's budgets side by side, smallest (lightest) first
                off = (i - (n - 1) / 2) * 0.22
                alpha = 0.45 + 0.55 * (i + 1) / n
                ax.errorbar(r[col], y[f] + off, xerr=None if se is None else r[se], fmt=family_marker(f),
                            color=family_colour(f), alpha=alpha, ms=5, capsize=2, lw=1)
                if ax is axes[0] and not (isinstance(r.budget, float) and math.isnan(r.budget)):
                    ax.annotate(f"{r.budget:g}", (r[col], y[f] + off), xytext=(4, -3), textcoords="offset points",
                                fontsize=6, color="#444444")
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    if not (a.dloss - a.dloss_se > 0).all():
        axes[0].axvline(0, color="black", lw=0.8)
    axes[1].axvline(1, color="black", lw=0.8)
    if (a.dloss - a.dloss_se > 0).all():   # every increase clear of zero: a log axis over their range
        axes[0].set_xscale("log")
        axes[0].set_xlim((a.dloss - a.dloss_se).min() * 0.7, (a.dloss + a.dloss_se).max() * 1.4)
    else:
        axes[0].set_xscale("symlog", linthresh=0.05)
    axes[0].set_yticks(range(len(fams)))
    axes[0].set_yticklabels([family_label(f) for f in fams])
    axes[0].invert_yaxis()
    ex = df[df.scope == "exact"].iloc[0]
    return finish(fig, out, "pretrained_dropin",
                  f"all-MiniLM-L6-v2 (pretrained, 6 layers × 12 heads, passages of 256 tokens, float64, CPU): every "
                  f"head of every layer swapped; left: the in-batch contrastive loss it was trained with (exact "
                  f"{ex.loss:.3f} nats per pair, {int(ex.pairs)} summary → passage pairs), one or three budgets per "
                  "family (labelled); right: how many of the exact model's 10 best passages per summary the swapped "
                  "model still ranks in its top 10")


def _finetune(df, out):
    fig, ax = plt.subplots(figsize=(6.2, 3.8))
    m = df[(df.arm == "method") & df.gap.notna()]
    for f in dict.fromkeys(m.family):
        d = m[m.family == f].sort_values("step")
        ax.errorbar(d.step, d.gap, yerr=d.gap_se, color=family_colour(f), marker=family_marker(f), capsize=2,
                    label=family_label(f))
    ax.axhline(0, color="black", lw=1, ls="--", label="exact control (trained alike)")
    ax.set_xlabel("fine-tuning step (AdamW, batches of 8 pairs)")
    ax.set_ylabel("held-out loss − exact control's (nats per pair)")
    ax.legend()
    ax.grid(alpha=0.3)
    return finish(fig, out, "pretrained_finetune",
                  "all-MiniLM-L6-v2, float32 fine-tuning with each family swapped into every head (default budgets) "
                  "against an exact control trained the same way: the gap on held-out pairs, ± paired SE")
