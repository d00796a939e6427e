"""The notebooks' cells: {notebook file: [(kind, text)]}, kind "md" or "code", the markdown with {{finding}}
placeholders. Plain data, no imports: tools/findings.py renders the markdown with the findings (and checks the
committed notebooks against it), tools/make_notebooks.py writes the notebooks. Edit the notebooks' text here."""

SETUP = """import os, sys
# The shared set-up (paths, pandas, plot, show) is tools/notebook_setup.py, one level up from notebooks/.
sys.path.insert(0, os.path.join(os.environ.get("ATTNLAB_ROOT") or (os.path.abspath("..") if \
os.path.basename(os.getcwd()) == "notebooks" else os.getcwd()), "tools"))
from notebook_setup import *"""

MODULE_CELL = """# The module is built by tools/test.sh (or tools/setup.sh) into build/python.
sys.path.insert(0, os.path.join(os.environ.get("ATTNLAB_BUILD", os.path.join(ROOT, "build")), "python"))
try:
    import attnlab
except ImportError:
    attnlab = None
    print("attnlab's Python module is not built here: bash tools/test.sh builds build/python/attnlab*.so")
if attnlab:
    import numpy as np
    head = os.path.join(ROOT, "data", "attention", "trained", "seq0_layer2_{}.npy")
    if os.path.exists(head.format("q")):
        q, k, v = (np.load(head.format(x))[0] for x in "qkv")
    else:
        q, k, v = attnlab.generate("clustered", 512, 32, seed=0)
    df = attnlab.compare(q, k, v, ["local:window=4", "reformer:rounds=2,chunk=64", \
"nystrom:landmarks=64", "performer:features=64"], matrix_metrics="off")
    display(df[["method", "spec", "out_rel_fro", "out_mean_cosine", "time_s", "speedup"]])"""


def books():
    """{notebook file: [(kind, text)]}, text with {{finding}} placeholders."""
    return BOOKS


BOOKS = {
    "low_rank.ipynb": [
        ("md", "# Is attention low-rank, and do the low-rank methods find it?\n\n"
               "Three experiments: `spectrum` (Linformer Fig. 1), `error_vs_budget` (every method against its budget, "
               "with the Eckart–Young floor) and `error_vs_length` (a fixed budget as n grows). All numbers come from "
               "the tidy CSVs under `results/` (quick preset, `bash tools/reproduce.sh`)."),
        ("code", SETUP),
        ("md", "## Spectra\n\n"
               "Normalized cumulative singular values of P at n = 512. Linformer reports that a few dozen singular "
               "values carry most of the mass of trained RoBERTa attention. On Gaussian inputs the tail is long "
               "({{spectrum.gaussian_at128}} at index 128 for T = 1); clustered ({{spectrum.clustered_at128}}) and "
               "low-rank ({{spectrum.lowrank_at128}}) inputs are closer to the claim.\n\n"
               "The sources `trained` and `initialized` are the 16 heads of a small byte-level bidirectional masked LM "
               "(4 layers, 4 heads, d_head 32, n = 512, rotary positions) trained for ~4 minutes on the Python "
               "standard library by `tools/trained_attention.py`, and the same model at initialisation. The "
               "initialised model's attention is uniform (rank one: at least {{spectrum.initialized_at128_min}} at "
               "index 128 everywhere). The trained heads spread from {{spectrum.trained_at128_min}} to "
               "{{spectrum.trained_at128_max}} (median {{spectrum.trained_at128_median}}): sharp positional heads "
               "(entropy near 0, attending to a neighbour) are close to permutations and therefore full rank — "
               "Linformer's low-rank claim holds for some heads, not all, of this model."),
        ("code", "show(plot.plot_spectrum(RESULTS, FIGS))\n"
                 "d = plot.load(RESULTS, 'spectrum')\n"
                 "at = d[d.metric == 'cumulative_at_128']\n"
                 "at[~plot.is_model_head(at)].pivot_table(index='source', columns='variant', values='value').round(3)"),
        ("code", "m = d[d.metric.isin(['cumulative_at_128', 'mean_row_entropy', 'stable_rank']) & "
                 "plot.is_model_head(d)]\n"
                 "m.pivot_table(index=['source', 'layer', 'head'], columns='metric', values='value').round(3)"),
        ("md", "## Error against budget\n\n"
               "Black is the best rank-R approximation (`svd:rank=R`): no method whose P̃ has rank ≤ R can go below it "
               "in the error of P (the test suite checks this on every run); in the outputs it is a reference, not a "
               "floor. The gap between the floor and the practical methods is the point: on clustered keys the floor "
               "at rank 64 is {{evb.floor_clustered}} while Nyström ({{evb.P_clustered_nystrom}}) and Performer "
               "({{evb.P_clustered_performer}}) stay near 1."),
        ("code", "show(plot.plot_error_vs_budget(RESULTS, FIGS))\n"
                 "d = plot.load(RESULTS, 'error_vs_budget')\n"
                 "d[(d.metric == 'P_rel_fro') & (d.step == 64)].pivot_table(index='variant', columns='source', "
                 "values='value', aggfunc='median').round(3)"),
        ("md", "On the trained heads (median of one head per layer) the rank-64 floor is {{evb.floor_trained}}, and "
               "the practical methods are far above it in P (Reformer {{evb.P_trained_reformer}}, Nyström "
               "{{evb.P_trained_nystrom}}) — but in the outputs the sparse and clustering methods win: VQ "
               "{{evb.out_trained_vq}}, Reformer {{evb.out_trained_reformer}}, local {{evb.out_trained_local}} and "
               "Scatterbrain {{evb.out_trained_scatterbrain}} against Nyström {{evb.out_trained_nystrom}}, Linformer "
               "pooling {{evb.out_trained_linformer_pool}} and Performer {{evb.out_trained_performer}}. Against "
               "measured cost (the error-against-cost figures): {{evb.cost_trained_faster}} of the "
               "{{evb.cost_trained_pairs}} (method, budget) pairs ran faster than exact streaming attention at n = 512 "
               "with attnlab's current kernels; the most accurate, {{evb.cost_trained_best}} "
               "({{evb.cost_trained_best_err}}), runs at {{evb.cost_trained_best_speedup}}× exact's speed. The SVD "
               "pseudo-inverse makes Nyström explode (landmark matrices with median condition numbers "
               "{{pinv.cond_trained_64}} at m = 64 and {{pinv.cond_trained_128}} at m = 128)."),
        ("code", "d[(d.metric == 'out_rel_fro') & (d.step == 64)].pivot_table(index='variant', columns='source', "
                 "values='value', aggfunc='median').round(3)"),
        ("md", "## Error against length at a fixed budget\n\n"
               "Linformer's theorem lets k grow like log n; the paper then keeps k fixed. Here no method keeps its "
               "error as n grows at budget 64, and the floor itself rises on Gaussian and low-rank inputs."),
        ("code", "show(plot.plot_error_vs_length(RESULTS, FIGS))\n"
                 "d = plot.load(RESULTS, 'error_vs_length')\n"
                 "d[d.metric == 'P_rel_fro'].pivot_table(index=['source', 'variant'], columns='n', "
                 "values='value').round(3)"),
    ],
    "nystrom_pinv.ipynb": [
        ("md", "# Nyströmformer's pseudo-inverse\n\n"
               "Lemma 1 of Nyströmformer: the order-3 iteration converges to A⁺. The paper runs 6 iterations. How far "
               "is that from converged on softmax landmark matrices, and does it matter?"),
        ("code", SETUP),
        ("md", "## Convergence\n\n"
               "The landmark matrices are badly conditioned (segment means shrink the logits: condition numbers "
               "1e3–1e5), so ‖I − AZ₆‖ has barely moved ({{pinv.residual6_gaussian}} on Gaussian inputs at m = 64): "
               "order-3 needs {{pinv.iters_order3_gaussian}} iterations and Newton–Schulz "
               "{{pinv.iters_newton_gaussian}} to reach 1e-6 there. The measured orders are 3 and 2, as the error "
               "recurrences E' = ¾E³ + ¼E⁴ and E' = E² say."),
        ("code", "show(plot.plot_pinv(RESULTS, FIGS))\n"
                 "d = plot.load(RESULTS, 'pinv')\n"
                 "d[d.metric.isin(['cond', 'iterations_to_1e-6', 'order'])].pivot_table(index=['source', 'spec'], "
                 "columns=['metric', 'variant'], values='value', aggfunc='median').round(2)"),
        ("md", "On the trained transformer's heads the landmark matrices are far worse conditioned (median "
               "{{pinv.cond_trained_64}} at m = 64, {{pinv.cond_trained_128}} at m = 128): {{pinv.last_iter}} "
               "iterations do not reach 1e-6, and Nyström's error is lowest after {{pinv.best_iter_trained}} order-3 "
               "iterations ({{pinv.best_err_trained}}) and explodes as the iteration converges "
               "({{pinv.last_err_trained}} at {{pinv.last_iter}})."),
        ("code", "d[(d.metric == 'nystrom_out_rel_fro') & (d.spec == 'landmarks=64')].pivot_table(index=['source', "
                 "'variant'], columns='step', values='value', aggfunc='median').round(3)"),
        ("md", "## Does an unconverged pseudo-inverse help?\n\n"
               "Yes, on these inputs: Nyström's output error on Gaussian inputs is lowest at "
               "{{pinv.best_iter_gaussian}} iterations and rises to the SVD pseudo-inverse's error as the iteration "
               "converges. The early iterations act as a spectral filter — the paper's default sits near the optimum, "
               "for a reason its Lemma does not give."),
    ],
    "performer.ipynb": [
        ("md", "# Performer's random features\n\n"
               "Performer Fig. 4 (MSE against the number of features) and Fig. 2 (the trig/positive MSE ratio), with "
               "Lemma 2's closed forms."),
        ("code", SETUP),
        ("code", "show(plot.plot_performer_mse(RESULTS, FIGS))\n"
                 "d = plot.load(RESULTS, 'performer_mse')\n"
                 "d[d.metric.isin(['kernel_mse', 'kernel_mse_lemma2_iid', "
                 "'output_mse'])].pivot_table(index=['variant', 'step'], columns='metric', values='value')"),
        ("md", "Trigonometric features follow Lemma 2 closely (sampled MSE {{performer.trig_mse_16}} against Lemma 2's "
               "{{performer.trig_lemma2_16}} at M = 16). The positive estimator's Lemma-2 MSE is astronomically larger "
               "than what any finite sample shows: its variance sits in events too rare to draw, so its typical error "
               "is small while its mean squared error is not. Orthogonal features help trig features most. The ratio "
               "figure reproduces Fig. 2: trig features are hopeless where the kernel is small (antipodal x, y)."),
    ],
    "sparse_vq_regimes.ipynb": [
        ("md", "# Sparse, clustered and mixed methods\n\n"
               "Informer's query selection, Transformer-VQ's codebooks, and Scatterbrain's question of which regime "
               "favours which method."),
        ("code", SETUP),
        ("md", "## ProbSparse\n\n"
               "Lemma 1 holds for every query. Ranking by the sampled M̄ finds only a fraction of the queries that M "
               "(exact) would select; on clustered keys, where every query is sharp, the lazy rows (mean of V) are "
               "wrong and the output error stays near 1."),
        ("code", "show(plot.plot_probsparse(RESULTS, FIGS))"),
        ("md", "On the trained heads M is large and spread (median over queries "
               "{{probsparse.M_median_trained_min}}–{{probsparse.M_median_trained_max}} nats against "
               "{{probsparse.M_median_gaussian}} for Gaussian inputs): the long tail Informer builds on is there, and "
               "M̄ over all keys ranks the top-u queries well (recall {{probsparse.recall_trained_full}}), but the "
               "sampled M̄ at c = 5 recovers only {{probsparse.recall_trained}} of them "
               "({{probsparse.recall_gaussian}} on Gaussian inputs, {{probsparse.recall_clustered}} on clustered "
               "keys)."),
        ("code", "d = plot.load(RESULTS, 'probsparse')\n"
                 "d[d.metric == 'top_u_recall'].pivot_table(index=['source', 'variant'], columns='step', "
                 "values='value', aggfunc='median').round(3)"),
        ("md", "## Transformer-VQ\n\n"
               "Quantizing both Q and K in the mean-field form of the comments under Su 2023's post is much "
               "better than quantizing K alone (64 codes on clustered keys: {{vq.clustered_64_both}} against "
               "{{vq.clustered_64_hard}}); "
               "Performer read as a soft VQ is far worse at equal size ({{vq.clustered_64_performer}})."),
        ("code", "show(plot.plot_vq(RESULTS, FIGS))\n"
                 "d = plot.load(RESULTS, 'vq')\n"
                 "d[d.metric == 'out_rel_fro'].pivot_table(index=['source', 'step'], columns='variant', "
                 "values='value').round(3)"),
        ("md", "## Regimes\n\n"
               "As the temperature raises the entropy, the ideal low-rank approximation improves by orders of "
               "magnitude, but the practical methods do not follow it on the generated inputs. On the trained heads "
               "(one point per head) the regimes Scatterbrain describes do appear: sparse methods win on the sharp "
               "heads (on the sharpest, {{regimes.sharp_entropy}} nats: local window {{regimes.sharp_local}} against "
               "rank 64's {{regimes.sharp_svd}}), the rank-64 approximation on the broad ones (broadest, "
               "{{regimes.broad_entropy}} nats: {{regimes.broad_svd}} against local {{regimes.broad_local}}); "
               "Scatterbrain's Performer part makes it worse than its band alone on {{regimes.scatterbrain_worse}} of "
               "{{regimes.heads}} heads."),
        ("code", "show(plot.plot_regimes(RESULTS, FIGS))\n"
                 "d = plot.load(RESULTS, 'regimes')\n"
                 "t = d[d.source == 'trained']\n"
                 "x = t[t.metric == 'out_rel_fro'].pivot_table(index=['layer', 'head'], columns='method', "
                 "values='value')\n"
                 "x['entropy'] = t[t.metric == 'entropy'].groupby(['layer', 'head'])['value'].mean()\n"
                 "x.sort_values('entropy').round(3)"),
        ("md", "## Scaling\n\nTime and peak memory against n, measured in one run, with log-log slopes."),
        ("code", "show(plot.plot_scaling(RESULTS, FIGS))"),
        ("md", "## One head, directly, with the Python module\n\n"
               "The regimes above on one trained head without files or CSVs: `attnlab.compare` runs methods against "
               "exact attention on numpy arrays (layer 2, head 0 of the exported trained model when `data/attention` "
               "exists — a sharp, near-diagonal head — else a generated clustered problem). `attnlab report` does this "
               "for every head with budgets, costs and a recommendation (`results/report/`)."),
        ("code", MODULE_CELL),
    ],
    "dropin.ipynb": [
        ("md", "# From the head to the model: drop-in fidelity\n\n"
               "Every other notebook judges a method one head at a time, by ‖O − Õ‖_F/‖O‖_F. Here each efficient "
               "family is swapped into the two trained transformers (masked-LM and causal; float64, no fine-tuning) by "
               "`tools/dropin.py`: all layers at once, one layer at a time, one head at a time (the others exact), on "
               "{{dropin.windows}} held-out windows of 512 bytes. The question: does the per-head criterion predict "
               "what the model loses?"),
        ("code", SETUP + "\n"
                         "from figures.dropin import load_dropin, correlations, PREDICTORS\n"
                         "df = load_dropin(RESULTS)"),
        ("md", "## All layers swapped\n\n"
               "Exact losses {{dropin.mlm.exact_loss}} (masked-LM) and {{dropin.causal.exact_loss}} (causal) "
               "nats/byte. Least lost: {{dropin.mlm.best}} (masked-LM), {{dropin.causal.best}} (causal)."),
        ("code", "show(plot.plot_dropin(RESULTS, FIGS)[:1])\n"
                 "a = df[df.scope == 'all']\n"
                 "a.pivot_table(index=['model', 'family'], columns='budget', values='dloss').round(3)"),
        ("code", "a.pivot_table(index=['model', 'family'], columns='budget', values=['kl', 'top1']).round(3)"),
        ("md", "## One layer at a time\n\n"
               "The loss increase when only one layer's heads are swapped (the other layers exact): on these models "
               "the first layer costs most for most families and the second least."),
        ("code", "df[df.scope == 'layer'].pivot_table(index=['model', 'family'], columns='layer', "
                 "values='dloss').round(4)"),
        ("md", "## One head at a time\n\n"
               "A few heads carry the loss whatever the method; of the one-head swaps with a head error above 0.3, "
               "{{dropin.mlm.harmless_share}} (masked-LM) and {{dropin.causal.harmless_share}} (causal) change the "
               "loss by less than two standard errors."),
        ("code", "show(plot.plot_dropin(RESULTS, FIGS)[1:3])"),
        ("md", "## Does the per-head criterion predict the model's loss?\n\n"
               "Spearman's ρ between each head-level quantity and the one-head swap's loss increase, per family and "
               "over all families (95% interval: a cluster bootstrap over heads, since one head appears under every "
               "family). Over all one-head swaps, the output error reaches {{dropin.mlm.rho_head_err}} on the "
               "masked-LM model and {{dropin.causal.rho_head_err}} on the causal one; the sensitivity-weighted error "
               "‖∂L/∂O‖_F·‖Õ − O‖_F, from one backward pass of the exact model, reaches {{dropin.mlm.rho_grad_bound}} "
               "and {{dropin.causal.rho_grad_bound}}."),
        ("code", "show(plot.plot_dropin(RESULTS, FIGS)[3:])\n"
                 "c = correlations(df)\n"
                 "c.pivot_table(index=['model', 'family'], columns='predictor', values='rho').round(2)"),
        ("md", "## The report's choices on the model\n\n"
               "`tools/model_report.py` applies the report's per-head recommendations together and, under a "
               "model-level loss target, chooses per head greedily on measured losses; both are checked on held-out "
               "windows other than the ones the choice was made on. Masked-LM: the per-head target swaps "
               "{{mix.mlm.per_head.heads}} heads (loss {{mix.mlm.per_head.dloss}}); the {{mix.mlm.target}}-nat target "
               "swaps {{mix.mlm.loss_target.heads}} (loss {{mix.mlm.loss_target.dloss}}, attention "
               "{{mix.mlm.loss_target.speedup}}× faster)."),
        ("code", "for sub in ('report', 'report_causal'):\n"
                 "    p = os.path.join(RESULTS, sub, 'model_check.csv')\n"
                 "    if os.path.exists(p):\n"
                 "        display(pd.read_csv(p))"),
    ],
}
