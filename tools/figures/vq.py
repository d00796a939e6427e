"""Transformer-VQ against codebook size, hard vs soft, vs Performer."""
from .common import family_colour, finish, lines_per_source, plt
from .data import load

# Hard and mean-field assignment in the VQ colours; soft assignment's temperatures in one sequential hue (light:
# cold, close to hard); Performer, read as a soft VQ, in its own colour.
SOFT = plt.get_cmap("Greens")


def style(variant):
    if variant == "hard":
        return dict(color=family_colour("vq"), marker="o", label="hard (keys)")
    if variant.startswith("both"):
        return dict(color="#3f007d", marker="s", lw=2, label="Q and K, mean-field")
    if variant == "performer":
        return dict(color=family_colour("performer"), marker="^", label="Performer (features)")
    if variant.startswith("soft T="):
        t = float(variant.split("=")[1])
        shade = {0.1: 0.45, 1.0: 0.7, 10.0: 0.95}.get(t, 0.7)
        return dict(color=SOFT(shade), marker="D", ms=3.5, ls="--", label=f"soft, T = {variant.split('=')[1]}")
    return dict(label=variant)


def plot_vq(results, out):
    df = load(results, "vq")
    order = ["hard", "both (mean-field)", "soft T=0.1", "soft T=1", "soft T=10", "performer"]
    order = [v for v in order if v in set(df.variant)] + sorted(set(df.variant) - set(order))
    fig, right = lines_per_source(df[df.metric == "out_rel_fro"], "step", "codes (Performer: features)",
                                  "‖O − Õ‖_F / ‖O‖_F", style=style, width=5, order=order)
    return [finish(fig, out, "vq",
           "Transformer-VQ: output error against codebook size, n = 512; keys quantized hard or softly (temperature "
           "T), or Q and K both (mean-field); Performer read as a soft VQ with as many features as codes.",
           right=right)]
