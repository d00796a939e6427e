// Costs measured elsewhere, for `attnlab report --costs FILE` (issue "Costs on the machine the user runs"): the report
// recommends for the device the user runs — a GPU in bfloat16 against FlashAttention, a workstation's cores — from a
// table of per-method, per-length times measured there, instead of timing on this machine. The table is what
// tools/bench_gpu.py writes (results/bench/gpu_*.csv) or the user's own with the same columns.
#pragma once

#include "attnlab/core/types.hpp"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace attnlab::report {

/// Per method (its canonical spec) the measured lengths and seconds per call, taken from a costs file's rows at one
/// format, head dimension, pass and mask; and what they were measured on.
struct CostTable {
  std::string file;    ///< the file read
  std::string device;  ///< the device its rows name (device_name, else device; "unnamed device" if neither)
  std::string dtype;   ///< the format of the rows taken
  Index d = 0;         ///< their head dimension (0: the file has no d column)
  std::map<std::string, std::vector<std::pair<Index, double>>> by_spec;  ///< canonical spec → [(n, seconds)], by n
  std::vector<std::string> left_out;  ///< methods in the file attnlab does not know (a peer's exact_eager): skipped
  /// Seconds per call of `spec` (canonical) at length n: the measured value at a measured n, else log–log
  /// interpolation between the two measured lengths around n; NaN outside the measured lengths or for a spec the
  /// table does not hold (the report then has no cost for it, and says so).
  double seconds(const std::string& spec, Index n) const;
  /// "NVIDIA H200, bf16, d = 64, forward (FILE)": the sentence fragment every cost the report quotes carries.
  std::string where() const;
};

/// Reads a costs file. Columns: method, budget (the spec's parameters: "features=256", "" for exact), n, ms (per
/// call; the median of repeats); optional: d, dtype, pass, causal, status, heads, device_name, device — rows of
/// another pass than the forward ("fwd"), of the other mask, or whose status is not "ok" are left out, and so are
/// methods attnlab does not know (named in where()). `dtype`: the format to take ("" picks: the only one in the file,
/// else fp32, else Error listing them; without a dtype column every row); `d`: the heads' dimension (rows at it;
/// Error naming those the file has when none). Error for a missing column, an unreadable number, a spec a method
/// refuses, rows of several devices or head counts (a file joining runs), or a table without exact attention.
CostTable read_costs(const std::string& file, const std::string& dtype, Index d, bool causal);

/// A faster exact attention on this CPU than attnlab's own (issue "Costs on the machine the user runs", item 5), for
/// `attnlab report --exact-peer FILE`: the ratio attnlab's exact time / the peer's (PyTorch's fused
/// scaled_dot_product_attention), float32, at one thread count, as tools/bench_exact_peer.py measures both in one run
/// (results/bench/exact_peer.csv). The report keeps timing attnlab's methods and its exact here and divides the
/// exact time by this ratio where it is above 1, so that every speed-up is over the fastest exact attention measured
/// on this CPU, named.
struct ExactPeer {
  std::string file, device, peer, detail;  ///< the file; its CPU; "PyTorch SDPA"; the peer's version and kernels
  Index threads = 0;
  std::vector<std::pair<Index, double>> ratio;  ///< n → attnlab's time / the peer's, by n
  /// The ratio at length n: measured, or interpolated in log n between the two measured lengths around it; NaN
  /// outside them.
  double ratio_at(Index n) const;
};

/// Reads such a file (columns impl, build, dtype, n, d, threads, time_s, device, detail): the attnlab rows of the
/// build whose kernels (its detail, "attnlab LABEL: products=… isa=…") are `kernels` — this command's, from
/// cost_context() less its thread count — against the one peer's float32 rows, at `threads` and head dimension `d`.
/// Error for a missing column, an unreadable number, no rows at that thread count or dimension (naming those it
/// has), another CPU than `cpu` (a ratio is a property of the CPU it was measured on), no rows of this build's
/// kernels (naming the table's), several peers, or no length measured by both.
ExactPeer read_exact_peer(const std::string& file, Index threads, const std::string& cpu, const std::string& kernels,
                          Index d);

}  // namespace attnlab::report
