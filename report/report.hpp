// `attnlab report` / attnlab.report(): "which approximation for my model?" answered head by head. For every head of
// the given layers: the attention's entropy, its singular-value spectrum (cumulative energy, stable rank), every
// efficient method's output error against its measured cost at several budgets (the families of error_vs_budget),
// the Pareto frontier, and the recommendation: the cheapest method and budget whose output error stays under the
// target and that is faster than exact attention, or "keep exact". Across heads: layer × head maps of the
// recommendation and of its speed-up. Writes DIR/index.html (figures inline as SVG), DIR/report.csv (tidy) and
// DIR/summary.md.
#pragma once

#include "attnlab/core/precision.hpp"
#include "attnlab/core/types.hpp"
#include "attnlab/io/model_export.hpp"

#include <string>
#include <vector>

namespace attnlab::report {

struct HeadData {
  MatrixR<double> q, k, v;
};

/// Where a layer's heads come from: what the report states about its input and checks --causal against.
struct Origin {
  std::string input;     ///< in messages: the export's directory, the .npy files ("": arrays given directly)
  MaskStatement mask;    ///< what the capture says about the model's mask (nothing: bare files, arrays)
  Index seq = -1;        ///< the captured sequence the heads are of (-1: not known to be one of several)
  Index sequences = 0;   ///< how many sequences the capture holds
  std::string another;   ///< how to report another sequence ("use --seq S for another"), "" if none
};

struct Layer {
  std::string name;  // "L0", or "input" for arrays given directly
  std::vector<HeadData> heads;
  Origin origin;     ///< load_model_export(), files_origin(); default: arrays given directly, nothing said
};

struct Options {
  std::string out = "attnlab_report";
  double target = 0.05;               ///< output error ‖O − Õ‖_F/‖O‖_F a recommendation must stay under
  std::vector<std::string> families;  ///< error_vs_budget's family labels; empty: every deployable one
  Index repeats = 5;                  ///< timing: timed calls after a warm-up (float32; cost harness, attnlab/cost.hpp)
  /// Costs at this sequence length (0: each head's own). Errors stay measured on the heads themselves; the cost
  /// inputs are the head's own Q, K, V rows repeated cyclically to this length, so that data-dependent work
  /// (buckets, clusters) sees the head's distribution. Speed-ups grow with n: cost where the model will run.
  Index cost_n = 0;
  /// Timing noise assumed at least this large (relative): candidates whose times are within the noise of the
  /// fastest are treated as equally fast, and a method must beat exact attention by more than the noise.
  double noise = 0.10;
  bool causal = false;                ///< causal mask (only the methods that honour it)
  Index dense_limit = 2048;           ///< full spectrum up to this n; above it the top `top` values, matrix-free
  Index top = 64;
  bool progress = true;               ///< a line per head on stderr
  int threads = 0;                    ///< OpenMP threads for the whole report (0: the default, OMP_NUM_THREADS or all)
  std::string title = "attnlab report";
  /// The format the user runs (issue "Reduced precision"): under bf16 / fp16 every method's output error is that of
  /// its emulated run in the format (core/precision.hpp, this policy) against exact float64 attention — rounding and
  /// approximation together — so that the recommendation is for that format; a method that fails there (non-finite
  /// entries, all-zero rows) or is not emulated is no candidate. Costs stay float32 on this CPU (stated).
  Storage storage = Storage::native;
  Policy policy = Policy::eager;
  /// Costs measured on the user's device (issue "Costs on the machine the user runs"; costs.hpp): a table of
  /// per-method, per-length times (tools/bench_gpu.py's, or the user's own). Given, the report times nothing: every
  /// cost and speed-up is the table's, at the cost length (interpolated in log n between its measured lengths), and
  /// every sentence that quotes one names the table's device; a method the table does not hold at that length has no
  /// cost and is no candidate (said). Empty: timed on this machine (float32, its threads and kernels, stated).
  std::string costs;
  /// The table's format to take ("": the precision's when bf16 / fp16, else the table's only one, else fp32).
  std::string costs_dtype;
  /// A faster exact attention on this CPU (costs.hpp's ExactPeer; tools/bench_exact_peer.py's table, measured here at
  /// the report's thread count): costs are still timed here, but each head's exact time is divided by attnlab's
  /// exact / the peer's ratio where it is above 1, so every speed-up and the keep-exact rule are against the fastest
  /// exact attention measured on this CPU, named. Not with `costs` (that table has its own exact attention).
  std::string exact_peer;
};

struct Summary {
  std::string index_html, csv, summary_md;
  Index heads = 0, keep_exact = 0;
  std::vector<std::string> notes;  ///< input_notes(): what the report states about its input
};

/// A point the recommendation chooses among: a method family at one budget, its output error, and its timing at the
/// cost length — the fastest call and the relative noise (the report's noise floor, or the calls' spread if larger).
struct Candidate {
  std::string family;
  Index budget = 0;
  double error = 0, seconds = 0, noise = 0;
};

/// The recommendation rule. Candidates: those under `target`. Their times within the timing noise of the fastest
/// (by the larger of the two points' noise: a rerun can swap them) count as equally fast; of those the lowest error
/// wins, then the simpler family (fewer kinds of work), then the smaller budget. `pick`: its index in `c` (-1:
/// nothing under the target); `beats_exact`: it is faster than exact attention beyond both timings' noise — only
/// then is it recommended, otherwise the head keeps exact.
struct Recommendation {
  int pick = -1;
  bool beats_exact = false;
};
Recommendation recommend(const std::vector<Candidate>& c, double target, double exact_seconds, double exact_noise);

/// The one rule for the causal mask of captured attention — --model-dir's export, the user's .npy files and the
/// Python module's arrays alike: when the capture says whether its model is causal (an export's meta.json, a file's
/// sidecar: attnlab::mask_statement()), `causal` must agree, else Error saying which to pass: a causal model's heads
/// never saw the future, which the non-causal methods would show them; a bidirectional model's heads attend to later
/// keys, which a causal mask would hide. When nothing says, `causal` is used as given. Returns the sentence the
/// report states about the mask (for bare files without `causal`: "attention treated as bidirectional
/// (non-causal): pass --causal if the model is causal").
std::string causal_rule(const Origin& origin, bool causal);

/// What the report states about its input, one sentence each: which sequence of a capture of several it reports
/// ("sequence 0 of 3 (use --seq S for another)"), and how it treats the attention (causal_rule(), which throws on a
/// contradiction). The command prints them; write_report() puts them in summary.md, index.html, report.csv.config.
std::vector<std::string> input_notes(const std::vector<Layer>& layers, bool causal);

/// The origin of the user's .npy files: their sidecars' statement (attnlab::mask_statement(); Error when two
/// disagree) and, for files named as an export's (seq{s}_layer{l}_q.npy), the sequence and how many lie beside it.
Origin files_origin(const std::string& q, const std::string& k, const std::string& v);

/// Reads a model export (the layout: attnlab/io/model_export.hpp): DIR is the export (holding meta.json; model
/// "trained", or "captured" for attnlab.torch.capture's) or one model's directory under it (DIR/../meta.json).
/// `layers`: "all" or a comma list of indices; `seq`: the sequence. causal_rule() applies before any head is read:
/// a causal model's export is refused unless `causal`, a bidirectional one if `causal`. Every layer's origin says
/// which sequence of how many.
std::vector<Layer> load_model_export(const std::string& dir, const std::string& layers, Index seq, bool causal);

Summary write_report(const std::vector<Layer>& layers, const Options& opts);

}  // namespace attnlab::report
