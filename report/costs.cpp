// Costs measured elsewhere (costs.hpp).
#include "costs.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/io/tidy_csv.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

namespace attnlab::report {

double CostTable::seconds(const std::string& spec, Index n) const {
  const auto it = by_spec.find(spec);
  if (it == by_spec.end() || it->second.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto& pts = it->second;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (pts[i].first == n) return pts[i].second;
    if (i + 1 < pts.size() && pts[i].first < n && n < pts[i + 1].first) {
      // Time is a power of n between neighbouring lengths: interpolated in log n, log t.
      const double x0 = std::log(double(pts[i].first)), x1 = std::log(double(pts[i + 1].first));
      const double y0 = std::log(pts[i].second), y1 = std::log(pts[i + 1].second);
      return std::exp(y0 + (y1 - y0) * (std::log(double(n)) - x0) / (x1 - x0));
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::string CostTable::where() const {
  return fmt::format("{}, {}{}, forward ({}{})", device, dtype.empty() ? "format not stated" : dtype,
                     d > 0 ? fmt::format(", d = {}", d) : "", file,
                     left_out.empty() ? "" : fmt::format("; rows of {} left out: not attnlab methods",
                                                         fmt::join(left_out, ", ")));
}

CostTable read_costs(const std::string& file, const std::string& dtype, Index d, bool causal) {
  std::istringstream in(read_text_file(file));
  std::string line;
  require(bool(std::getline(in, line)), "report --costs {}: the file is empty", file);
  const std::vector<std::string> header = split_csv_line(line);
  const auto col = [&](const char* name) {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : int(it - header.begin());
  };
  for (const char* need : {"method", "budget", "n", "ms"})
    require(col(need) >= 0, "report --costs {}: no column '{}' (it needs method, budget, n, ms; tools/bench_gpu.py "
            "writes such a table)", file, need);
  const int cm = col("method"), cb = col("budget"), cn = col("n"), cms = col("ms"), cd = col("d"), ct = col("dtype"),
            cp = col("pass"), cc = col("causal"), cs = col("status"), cdn = col("device_name"), cdv = col("device"),
            ch = col("heads");
  struct Row {
    std::string spec, dtype, device, heads;
    Index n, d;
    double seconds;
  };
  std::vector<Row> rows;
  std::set<std::string> dtypes;
  Index line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r") continue;
    const std::vector<std::string> f = split_csv_line(line);
    const auto get = [&](int c) { return c >= 0 && c < int(f.size()) ? f[std::size_t(c)] : std::string(); };
    if (cp >= 0 && get(cp) != "fwd") continue;
    if (cc >= 0) {
      const std::string m = get(cc);
      const bool row_causal = m == "True" || m == "true" || m == "1";
      if (row_causal != causal) continue;
    }
    if (cs >= 0 && get(cs) != "ok") continue;
    Row r;
    const std::string method = get(cm), budget = get(cb);
    r.spec = budget.empty() ? method : method + ":" + budget;
    r.dtype = ct >= 0 ? get(ct) : "";
    r.device = cdn >= 0 && !get(cdn).empty() ? get(cdn) : cdv >= 0 ? get(cdv) : "";
    r.heads = ch >= 0 ? get(ch) : "";
    try {
      std::size_t used = 0;
      const std::string ns = get(cn), ms = get(cms), ds = get(cd);
      r.n = Index(std::stoll(ns, &used));
      require(used == ns.size() && r.n > 0, "");
      r.seconds = std::stod(ms, &used) * 1e-3;
      require(used == ms.size() && r.seconds > 0 && std::isfinite(r.seconds), "");
      r.d = cd >= 0 ? Index(std::stoll(ds)) : 0;
    } catch (const std::exception&) {
      throw Error(fmt::format("report --costs {}: line {}: n, ms (and d) must be positive numbers", file, line_no));
    }
    dtypes.insert(r.dtype);
    rows.push_back(std::move(r));
  }
  CostTable t;
  t.file = file;
  if (ct < 0) {  // no format stated: every row is taken
    t.dtype = "";
  } else if (!dtype.empty()) {
    t.dtype = dtype;
  } else if (dtypes.size() == 1) {
    t.dtype = *dtypes.begin();
  } else {
    require(dtypes.count("fp32") > 0, "report --costs {}: rows in several formats ({}): choose one with "
            "--costs-dtype", file, fmt::join(dtypes, ", "));
    t.dtype = "fp32";
  }
  std::set<Index> ds;
  std::set<std::string> devices, heads;
  for (const Row& r : rows)
    if (r.dtype == t.dtype) ds.insert(r.d);
  require(!ds.empty(), "report --costs {}: no forward rows in {} for the {} mask (formats in the file: {})", file,
          t.dtype.empty() ? "the file" : t.dtype, causal ? "causal" : "non-causal", fmt::join(dtypes, ", "));
  if (cd >= 0) {
    require(ds.count(d) > 0, "report --costs {}: no rows at the heads' dimension d = {} (the file has d = {})", file,
            d, fmt::join(ds, ", "));
    t.d = d;
  }
  std::set<std::string> unknown;
  for (const Row& r : rows) {
    if (r.dtype != t.dtype || (cd >= 0 && r.d != d)) continue;
    const std::string name = r.spec.substr(0, r.spec.find(':'));
    if (!std::any_of(registered_methods().begin(), registered_methods().end(),
                     [&](const MethodDescriptor& m) { return m.name == name; })) {
      unknown.insert(name);  // a peer's row (bench_gpu.py's exact_eager): not a method attnlab can recommend
      continue;
    }
    std::string canonical;
    try {
      canonical = make_method<float>(r.spec, 0)->spec();
    } catch (const Error& e) {
      throw Error(fmt::format("report --costs {}: method '{}': {}", file, r.spec, e.what()));
    }
    t.by_spec[canonical].emplace_back(r.n, r.seconds);
    devices.insert(r.device);
    heads.insert(r.heads);
  }
  t.left_out.assign(unknown.begin(), unknown.end());
  // One device and one batch shape: a file joining two runs would mix their hardware under one speed-up.
  require(devices.size() <= 1, "report --costs {}: rows from several devices ({}): give one device's rows", file,
          fmt::join(devices, ", "));
  require(heads.size() <= 1, "report --costs {}: rows measured with several head counts ({}): give one's rows",
          file, fmt::join(heads, ", "));
  for (auto& [spec, pts] : t.by_spec) {
    std::sort(pts.begin(), pts.end());
    // A length measured twice (repeated runs): the faster, as the report's own timing takes the fastest call.
    std::vector<std::pair<Index, double>> one;
    for (const auto& p : pts)
      if (one.empty() || one.back().first != p.first) one.push_back(p);
      else one.back().second = std::min(one.back().second, p.second);
    pts = std::move(one);
  }
  t.device = devices.empty() || devices.begin()->empty() ? "unnamed device" : *devices.begin();
  require(t.by_spec.count(make_method<float>("exact", 0)->spec()) > 0,
          "report --costs {}: no exact attention rows (method exact) in {}: the speed-ups are against it", file,
          t.dtype);
  return t;
}

double ExactPeer::ratio_at(Index n) const {
  for (std::size_t i = 0; i < ratio.size(); ++i) {
    if (ratio[i].first == n) return ratio[i].second;
    if (i + 1 < ratio.size() && ratio[i].first < n && n < ratio[i + 1].first) {
      const double x0 = std::log(double(ratio[i].first)), x1 = std::log(double(ratio[i + 1].first));
      const double w = (std::log(double(n)) - x0) / (x1 - x0);
      return std::exp((1 - w) * std::log(ratio[i].second) + w * std::log(ratio[i + 1].second));
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

ExactPeer read_exact_peer(const std::string& file, Index threads, const std::string& cpu, const std::string& kernels,
                          Index d) {
  std::istringstream in(read_text_file(file));
  std::string line;
  require(bool(std::getline(in, line)), "report --exact-peer {}: the file is empty", file);
  const std::vector<std::string> header = split_csv_line(line);
  const auto col = [&](const char* name) {
    const auto it = std::find(header.begin(), header.end(), name);
    require(it != header.end(), "report --exact-peer {}: no column '{}' (tools/bench_exact_peer.py writes the "
            "table: impl, build, dtype, n, d, threads, time_s, device, detail)", file, name);
    return std::size_t(it - header.begin());
  };
  const std::size_t ci = col("impl"), cdt = col("dtype"), cn = col("n"), cd = col("d"), ct = col("threads"),
                    cs = col("time_s"), cdv = col("device"), cde = col("detail");
  std::map<Index, double> mine, peer;
  std::set<Index> counts, dims;
  std::set<std::string> devices, peers, builds;
  ExactPeer p;
  p.file = file;
  p.threads = threads;
  Index line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r") continue;
    const std::vector<std::string> f = split_csv_line(line);
    require(f.size() == header.size(), "report --exact-peer {}: line {} has {} fields, the header {}", file, line_no,
            f.size(), header.size());
    Index n = 0, t = 0, dd = 0;
    double s = 0;
    try {
      std::size_t a = 0, b = 0, c = 0, e = 0;
      n = Index(std::stoll(f[cn], &a));
      t = Index(std::stoll(f[ct], &b));
      s = std::stod(f[cs], &c);
      dd = Index(std::stoll(f[cd], &e));
      require(a == f[cn].size() && b == f[ct].size() && c == f[cs].size() && e == f[cd].size() && n > 0 && t > 0 &&
                  dd > 0 && s > 0 && std::isfinite(s),
              "");
    } catch (const std::exception&) {
      throw Error(fmt::format("report --exact-peer {}: line {}: n, d, threads and time_s must be positive numbers",
                              file, line_no));
    }
    counts.insert(t);
    dims.insert(dd);
    if (t != threads || dd != d) continue;
    devices.insert(f[cdv]);
    if (f[ci] == "attnlab") {
      // This binary's rows: the build whose kernels are the ones this command runs (detail "attnlab LABEL: ...").
      const std::string& detail = f[cde];
      const auto colon = detail.find(": ");
      const std::string k = colon == std::string::npos ? "" : detail.substr(colon + 2);
      builds.insert(k);
      if (k == kernels) mine[n] = s;
    } else if (f[cdt] == "fp32") {
      peer[n] = s;
      peers.insert(f[ci]);
      p.peer = f[ci];
      p.detail = f[cde];
    }
  }
  require(counts.count(threads) > 0, "report --exact-peer {}: no rows at {} threads (it has {}): measure at this "
          "thread count (tools/bench_exact_peer.py --threads)", file, threads, fmt::join(counts, ", "));
  require(dims.count(d) > 0, "report --exact-peer {}: no rows at the heads' dimension d = {} (it has d = {})", file, d,
          fmt::join(dims, ", "));
  require(devices.size() == 1, "report --exact-peer {}: rows of several CPUs ({})", file, fmt::join(devices, "; "));
  p.device = *devices.begin();
  require(p.device == cpu, "report --exact-peer {}: measured on '{}', this CPU is '{}': the ratio of two kernels "
          "is the CPU's own — measure it here (tools/bench_exact_peer.py)", file, p.device, cpu);
  require(peers.size() == 1, "report --exact-peer {}: {} float32 peers at {} threads ({}): one table, one peer", file,
          peers.size(), threads, fmt::join(peers, ", "));
  require(!mine.empty(), "report --exact-peer {}: no attnlab rows with this command's kernels ({}); the table's: {} — "
          "time this build (tools/bench_exact_peer.py --build LABEL=BIN)", file, kernels, fmt::join(builds, "; "));
  for (const auto& [n, s] : mine)
    if (peer.count(n)) p.ratio.emplace_back(n, s / peer.at(n));
  require(!p.ratio.empty(), "report --exact-peer {}: no length measured by both attnlab and {}", file, p.peer);
  return p;
}

}  // namespace attnlab::report
