"""Time and peak memory against n, with fitted log-log slopes."""
import matplotlib.pyplot as plt

from .common import load, finish


def plot_scaling(results, out):
    import numpy as np
    df = load(results, "scaling")
    t = df[df.metric == "time_s"].pivot_table(index="n", columns="variant", values="value")
    m = df[df.metric == "peak_memory_bytes"].pivot_table(index="n", columns="variant", values="value") / 2 ** 20
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for col in t.columns:
        x, y = t.index.values.astype(float), t[col].values
        ok = np.isfinite(y) & (y > 0)
        slope = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0] if ok.sum() >= 2 else float("nan")
        axes[0].loglog(x, y * 1e3, "-o", ms=3, label=f"{col} (slope {slope:.2f})")
    axes[0].set(xlabel="n", ylabel="time (ms), compute + output")
    axes[0].legend(fontsize=6)
    for col in m.columns:
        axes[1].loglog(m.index, m[col].clip(lower=1e-2), "-o", ms=3, label=col)
    axes[1].set(xlabel="n", ylabel="peak memory above inputs (MiB, lower bound)")
    axes[1].legend(fontsize=6)
    return [finish(fig, out, "scaling",
           "Nyströmformer Table 1 / Linformer Table 3 analogues (float32, d = 64, 2 cores): time and peak memory "
           "against n, with fitted log-log slopes.")]
