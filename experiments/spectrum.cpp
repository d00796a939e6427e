// `spectrum` — the low-rank claim (Wang et al. 2020, Linformer, Fig. 1): singular values of the attention matrix P at
// n = 512 — normalized cumulative sums, and their value at index 128 (the figure's heatmap) — for generated
// sources at several temperatures, for a trained and an initialised transformer (sources `trained`, `initialized`:
// one point per layer, head and held-out sequence, at the model's own length and scale), for a real pretrained one
// (`pretrained`: all-MiniLM-L6-v2, every one of its 6 x 12 heads at n = 512, exported by tools/pretrained.py: the
// figure redrawn on a BERT-family model trained by someone else) and for the user's own
// Q, K (.npy, (n, d) or (h, n, d): one point per head); and the top-k singular values at large n, matrix-free (never
// forming P), by the block Krylov solver — or by Spectra's Lanczos too (`--solvers block,lanczos`), timed in the
// same run, with each solver's residuals, products and peak memory.
#include "attnlab/io/npy.hpp"
#include "attnlab/components/spectrum.hpp"
#include "common.hpp"
#include "attnlab/analysis/cost.hpp"
#include "model_data.hpp"

#include <fmt/format.h>

namespace attnlab::experiments {
namespace {

class SpectrumExperiment final : public Experiment {
 public:
  void declare(Options& o) override {
    const auto files = [this] { return model_.files.given(); };
    o.add("--n", n_, "sequence length of the dense spectra");
    o.add("--d", d_, "head dimension").positive().at_most(kMaxHeadDim, "a head dimension");
    o.add("--sources", sources_, "gaussian, clustered, lowrank, trained, initialized, pretrained")
        .preset({"gaussian", "clustered", "lowrank", "trained", "initialized", "pretrained"})
        .in_point_ids();
    o.add("--temperatures", temps_, "logit temperatures of the generated sources")
        .preset({0.25, 0.5, 1.0, 2.0})
        .in_point_ids();
    o.add("--large-n", large_n_, "lengths of the matrix-free top-k spectra").preset({2048}, {4096, 16384});
    o.add("--top", top_, "k of the matrix-free spectra");
    o.add("--solvers", solvers_, "matrix-free solvers: block (block Krylov), lanczos (Spectra on PᵀP)");
    o.add("--tol", tol_, "residual tolerance of the matrix-free solvers, relative to σ_1");
    o.add("--seeds", seeds_, "number of seeds")
        .preset(1, 3)
        .positive()
        .at_most(kMaxSeeds, "a grid point each")
        .in_point_ids();
    model_.declare(o);  // also --q, --k (the user's files; --v is not needed here)
    o.add("--causal", causal_, "causal mask for the files (true/false)").recorded_if(files);
    o.add("--dense-limit", dense_limit_, "files: largest length with a dense (every value) spectrum; "
                                         "the matrix-free top k is computed at any length")
        .recorded_if(files);
  }
  void check() const override {
    for (const std::string& s : solvers_) {
      const SpectrumSolver solver = parse_spectrum_solver(s);
      require(solver == SpectrumSolver::Block || solver == SpectrumSolver::Lanczos,
              "spectrum: --solvers takes block and lanczos, not '{}'", s);
    }
    require(tol_ > 0 && tol_ < 1, "spectrum: --tol must be in (0, 1), got {}", tol_);
  }
  // The dense spectra time nothing: side by side; the top-k points time their solver and its memory: alone.
  bool points_side_by_side() const override { return true; }
  std::vector<Point> grid() override {
    std::vector<Point> pts;
    for (const auto& src : sources_) {
      if (src == "files") continue;  // the user's --q/--k: below, dense up to --dense-limit and top k at any length
      if (ModelData::is_model_source(src)) {
        const auto [data, heads] = model_.open(src);
        for (const ModelHead& h : heads)
          pts.push_back({"dense " + data->point_id(h),
                         [=, data = data] { return dense_model(*data, h); }});
        continue;
      }
      for (double t : temps_)
        for (Index s = 0; s < seeds_; ++s) {
          pts.push_back({fmt::format("dense source={} T={} n={} d={} seed={}", src, t, n_, d_, s),
                         [=] { return dense_generated(src, t, std::uint64_t(s)); }});
          for (Index n : large_n_)
            for (const std::string& solver : solvers_)
              pts.push_back({fmt::format("topk source={} T={} n={} d={} k={} seed={} solver={} tol={}", src, t, n,
                                         d_, top_, s, solver, tol_),
                             [=] { return topk_generated(src, t, n, std::uint64_t(s), solver); }, /*alone=*/true});
        }
    }
    if (model_.files.given()) {
      files_ = UserFiles::read(model_.files, "spectrum", false);
      for (Index h = 0; h < files_->q.heads(); ++h)
        pts.push_back({fmt::format("files q={} k={} head={} causal={}", model_.files.q, model_.files.k, h, causal_),
                       [=] { return dense_files(h); }, /*alone=*/true});  // its top k timed
    }
    return pts;
  }

 private:
  void spectrum_rows(std::vector<Row>& rows, const Row& key, const VectorX<double>& sv) const {
    const double total = sv.sum();
    double cum = 0;
    for (Index i = 0; i < sv.size(); ++i) {
      cum += sv(i);
      Row r = key;
      r.step = i;
      r.metric = "singular_value";
      r.value = sv(i);
      rows.push_back(r);
      r.metric = "cumulative";  // Σ_{l ≤ i} σ_l / Σ σ_l, Linformer Fig. 1's y axis
      r.value = cum / total;
      rows.push_back(r);
    }
    if (sv.size() > 128) {
      Row r = key;
      r.metric = "cumulative_at_128";
      r.value = sv.head(128).sum() / total;
      rows.push_back(r);
    }
    Row r = key;
    r.metric = "stable_rank";  // ‖P‖_F² / ‖P‖₂²
    r.value = sv.squaredNorm() / (sv(0) * sv(0));
    rows.push_back(r);
  }
  Qkv<double> generated(const std::string& src, double t, Index n, std::uint64_t seed) const {
    return experiments::generated(src, n, d_, seed, t, /*d_v=*/1);
  }
  Row key(const std::string& src, double t, Index n, std::uint64_t seed) const {
    Row k;
    k.source = src;
    k.method = "exact";
    k.variant = fmt::format("T={}", t);
    k.n = n;
    k.d = d_;
    k.seed = seed;
    return k;
  }
  std::vector<Row> dense_generated(const std::string& src, double t, std::uint64_t seed) const {
    const Qkv<double> p = generated(src, t, n_, seed);
    std::vector<Row> rows;
    spectrum_rows(rows, key(src, t, n_, seed), singular_values<double>(exact_matrix<double>(p.q, p.k, {})));
    return rows;
  }
  /// The top k at large n, matrix-free, with what it cost: time and peak memory above the inputs (the operator,
  /// its row log-sum-exp and the solver's basis), products with P or Pᵀ, and each value's residual ‖Pᵀu − σv‖/σ_1.
  std::vector<Row> topk_rows(Row r, const MatrixR<double>& q, const MatrixR<double>& k, const AttentionOptions& ao,
                             const std::string& solver, std::uint64_t seed) const {
    TopSingularOptions o;
    o.solver = parse_spectrum_solver(solver);
    o.tol = tol_;
    o.seed = seed;
    TopSingular top;
    // One timed call (the solver runs long enough for a warm-up not to matter); its memory on a separate call.
    CostOptions co;
    co.warmup = 0;
    co.repeats = 1;
    const Cost cost = measure([&] {
      const ExactOperator<double> op(q, k, ao);
      top = top_singular(op, std::min<Index>(top_, std::min(q.rows(), k.rows())), o);
    }, co);
    require(!cost.refused, "spectrum: the {} solver failed at n = {}", solver, k.rows());
    std::vector<Row> rows;
    r.spec = solver;
    for (Index i = 0; i < top.values.size(); ++i) {
      r.step = i;
      r.metric = "top_singular_value";
      r.value = top.values(i);
      rows.push_back(r);
      r.metric = "residual";  // ‖Pᵀu_i − σ_i v_i‖ / σ_1: the backward error of the triplet
      r.value = top.residuals(i) / top.values(0);
      rows.push_back(r);
    }
    r.step = -1;
    for (const auto& [metric, value] : {std::pair<const char*, double>{"products", double(top.products)},
                                        {"vectors", double(top.vectors)},
                                        {"time_s", cost.min_s},
                                        {"peak_memory_bytes", double(cost.peak_bytes)}}) {
      r.metric = metric;
      r.value = value;
      rows.push_back(r);
    }
    return rows;
  }
  std::vector<Row> topk_generated(const std::string& src, double t, Index n, std::uint64_t seed,
                                  const std::string& solver) const {
    const Qkv<double> p = generated(src, t, n, seed);
    return topk_rows(key(src, t, n, seed), p.q, p.k, {}, solver, seed);
  }
  /// A model head at its own length; causal when the model is. For sequence 0 also how far attnlab's P is from the
  /// model's own softmax (a check of the export and of the scale convention: float32 round-off, ~1e-7).
  std::vector<Row> dense_model(const ModelData& data, const ModelHead& h) const {
    const Qkv<double> p = data.load(h);
    AttentionOptions o;
    o.causal = !data.bidirectional();
    const MatrixR<double> P = exact_matrix<double>(p.q, p.k, o);
    Row r = head_row(data, h);  // sequence, layer, head
    if (r.source == "trained_causal") r.source = data.model();  // "trained", as in schema 1 (pretrained: its name)
    r.method = "exact";
    r.n = p.q.rows();
    r.d = p.q.cols();
    r.seed = std::uint64_t(h.seq);  // as in every experiment: a head's seed is its sequence index
    std::vector<Row> rows;
    spectrum_rows(rows, r, singular_values<double>(P));
    const MatrixR<double> model_p = h.seq == 0 ? data.model_attention(h.layer, h.head) : MatrixR<double>();
    if (model_p.size() > 0) {
      r.metric = "max_abs_diff_vs_model";
      r.value = (P - model_p).cwiseAbs().maxCoeff();
      rows.push_back(r);
    }
    // Row entropy (nats), the quantity the regimes experiment sweeps: where this head sits between sharp and diffuse.
    r.metric = "mean_row_entropy";
    r.value = entropy_sum(P) / double(P.rows());
    rows.push_back(r);
    return rows;
  }
  /// The user's head: every singular value (dense) up to --dense-limit keys, and the top k matrix-free by each
  /// solver at any length.
  std::vector<Row> dense_files(Index h) const {
    const MatrixR<double> q = files_->q.head_as<double>(h), k = files_->k.head_as<double>(h);
    AttentionOptions o;
    o.causal = causal_;
    Row r;
    r.source = "files";
    r.method = "exact";
    r.head = h;
    r.n = q.rows();
    r.d = q.cols();
    std::vector<Row> rows;
    if (std::max(q.rows(), k.rows()) <= dense_limit_)
      spectrum_rows(rows, r, singular_values<double>(exact_matrix<double>(q, k, o)));
    for (const std::string& solver : solvers_) {
      const std::vector<Row> top = topk_rows(r, q, k, o, solver, 0);
      rows.insert(rows.end(), top.begin(), top.end());
    }
    return rows;
  }

  Index n_ = 512, d_ = 64, top_ = 32, seeds_ = 1, dense_limit_ = 4096;
  std::vector<std::string> sources_, solvers_ = {"block"};
  double tol_ = 1e-9;
  std::vector<double> temps_;
  std::vector<Index> large_n_;
  bool causal_ = false;
  ModelOptions model_;
  std::shared_ptr<const UserFiles> files_;
};

}  // namespace

std::unique_ptr<Experiment> make_spectrum_experiment() { return std::make_unique<SpectrumExperiment>(); }

}  // namespace attnlab::experiments
