"""Transformer-VQ against codebook size, hard vs soft, vs Performer."""
from .common import load, finish, lines_per_source


def plot_vq(results, out):
    df = load(results, "vq")
    fig = lines_per_source(df[df.metric == "out_rel_fro"], "step", "codes (Performer: features)",
                           "‖O − Õ‖_F / ‖O‖_F", width=5.5, legend_size=7)
    return [finish(fig, out, "vq",
           "Transformer-VQ (seed 002): error against codebook size; soft assignment over T; Q and K both "
           "quantized (mean-field); Performer read as a soft VQ at equal size.")]
