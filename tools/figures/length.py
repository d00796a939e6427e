"""Error against n at a fixed budget."""
import re

from .common import finish, lines_per_source
from .data import load


def plot_error_vs_length(results, out):
    df = load(results, "error_vs_length")
    # The budget from the specs themselves (landmarks=64, k=64, ...): the caption says what was run.
    budgets = {int(m.group(1)) for m in (re.search(r"=(\d+)", s) for s in df["spec"].unique()) if m}
    budget = str(budgets.pop()) if len(budgets) == 1 else "fixed"
    fig, right = lines_per_source(df[df.metric == "P_rel_fro"], "n", "sequence length n", "‖P − P̃‖_F / ‖P‖_F")
    return [finish(fig, out, "error_vs_length",
           f"Error against n at a fixed budget ({budget} landmarks, k, features or codes; rank {budget} for the "
           "SVD): can Linformer's k and Nyström's m stay constant as n grows?", right=right)]
