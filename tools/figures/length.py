"""Error against n at a fixed budget."""
from .common import load, finish, lines_per_source


def plot_error_vs_length(results, out):
    df = load(results, "error_vs_length")
    fig = lines_per_source(df[df.metric == "P_rel_fro"], "n", "sequence length n", "‖P − P̃‖_F / ‖P‖_F")
    return [finish(fig, out, "error_vs_length",
           "Error against n at a fixed budget (64): can Linformer's k and Nyström's m stay constant as n grows?")]
