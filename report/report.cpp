// The per-model report (see report.hpp). Errors in float64 against exact attention; cost as a user runs it, by the
// library's cost harness (attnlab/cost.hpp): float32 compute() + output() in steady state (a warm-up, then `repeats`
// timed calls; minimum and median), at the head's length or at `cost_n`, with exact streaming attention timed the
// same way. The recommendation treats times within the timing noise as equal: among the methods under the target
// that are as fast as the fastest (within the noise), the most accurate, then the simplest.
#include "report.hpp"

#include "costs.hpp"

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/analysis/metrics.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/components/spectrum.hpp"
#include "attnlab/io/tidy_csv.hpp"
#include "attnlab/analysis/budget_families.hpp"
#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/analysis/cost.hpp"
#include "attnlab/io/model_export.hpp"
#include "svg.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <tuple>
#include <utility>

namespace attnlab::report {
namespace {

namespace fs = std::filesystem;
using attnlab::BudgetFamily;

struct Point {
  std::string family, spec;
  Index budget = 0;
  double error = 0, p_error = NAN, seconds = NAN, seconds_median = NAN, speedup = NAN;
  /// Under a reduced storage: the float64 output error (error is then the format's), and why a point failed there.
  double error_fp64 = NAN;
  std::string failure;
  bool pareto = false;
  /// Relative timing noise of this point: the spread of its calls, at least the report's noise floor.
  double noise = 0;
};

struct HeadResult {
  std::string layer;
  Index head = 0, n = 0, d = 0;
  double entropy = 0, entropy_max = 0, fro2 = 0, exact_seconds = 0, exact_seconds_median = 0;  // fro2 = ‖P‖_F²
  double exact_noise = 0;
  /// The exact time speed-ups are over: exact_seconds, or with --exact-peer the peer's where it is faster (its
  /// ratio to attnlab's exact at cost_n, peer_ratio > 1, applied to exact_seconds).
  double baseline_seconds = 0, peer_ratio = NAN;
  double exact_rounding = NAN;  // under a reduced storage: exact attention's own error in the format
  Index cost_n = 0;  // the length the costs were measured at
  Index r90 = -1, r99 = -1;  // ranks holding 90% / 99% of ‖P‖_F² (-1: beyond the values computed)
  std::vector<double> sigma;
  bool sigma_complete = false;
  std::vector<Point> points;
  /// The Eckart–Young floor per rank r: ‖P − P_r‖_F/‖P‖_F of P's best rank-r approximation, from its singular
  /// values — no P̃ of rank ≤ r is closer to P (the rank-limited methods: Nyström, Linformer, Performer, VQ).
  std::vector<std::pair<Index, double>> floor;
  /// The output error of that best rank-r P applied to V (the svd family): a reference, not a floor for outputs
  /// (the best approximation of O is not the best of P; sparse methods are not rank-limited).
  std::vector<std::pair<Index, double>> svd_out;
  const Point* best = nullptr;  // the recommendation; null: keep exact
  const Point* fit = nullptr;   // the fastest point under the target, faster than exact or not
  std::string why;             // when keeping exact
};

/// How much machinery a family adds to attention (lower: simpler), for ties within the timing noise: its declared
/// rank (core/spec.hpp's Study::simplicity, with its method's budget parameter). Unknown families come last.
int simplicity(const std::string& family) {
  static const std::vector<BudgetFamily> all = budget_families();
  const auto it = std::find_if(all.begin(), all.end(), [&](const BudgetFamily& f) { return f.label == family; });
  return it == all.end() ? Study::kLast : it->simplicity;
}

/// ‖P‖_F² / σ₁²: how many singular values P's energy is spread over.
double stable_rank(const HeadResult& h) { return h.fro2 / (h.sigma[0] * h.sigma[0]); }

std::vector<BudgetFamily> chosen_families(const Options& o) {
  std::vector<BudgetFamily> out;
  const auto all = budget_families();
  for (const auto& f : all) {
    const bool asked = o.families.empty()
                           ? f.deployable
                           : std::find(o.families.begin(), o.families.end(), f.label) != o.families.end();
    if (!asked) continue;
    const std::string name = f.spec.substr(0, f.spec.find(':'));
    if (o.causal && !find_method(name).causal) continue;
    // Under a causal mask a form that looks ahead (vq's codebook fitted on the window's own keys, later ones
    // included) would be judged on what a deployed causal model cannot see: never a causal verdict. Said, skipped.
    if (o.causal) {
      const std::string ahead = make_method<double>(f.spec)->lookahead();
      if (!ahead.empty()) {
        fmt::print(stderr, "report: family {} skipped under --causal: {} — a look-ahead (a causal model holds a "
                           "codebook fitted on other windows: vq:codebook=FILE.npy)\n", f.label, ahead);
        continue;
      }
    }
    out.push_back(f);
  }
  for (const auto& label : o.families)
    if (std::none_of(all.begin(), all.end(), [&](const BudgetFamily& f) { return f.label == label; })) {
      std::string names;
      for (const auto& f : all) names += (names.empty() ? "" : ", ") + f.label;
      throw Error(fmt::format("report: unknown family '{}'; valid: {}", label, names));
    }
  require(!out.empty(), "report: no method family left to evaluate (a causal mask keeps only causal methods)");
  return out;
}

/// The exact attention a head's speed-ups are over: attnlab's, or the peer where --exact-peer says it is faster at
/// the head's cost length.
std::string baseline_name(const HeadResult& r, const ExactPeer* peer) {
  if (!peer) return "attnlab's exact";
  if (r.baseline_seconds < r.exact_seconds)
    return fmt::format("{} ({}; {:.2f}× faster than attnlab's exact here)", peer->peer, peer->detail, r.peer_ratio);
  return fmt::format("attnlab's exact ({} takes {:.2f}× its time here{})", peer->peer, 1 / r.peer_ratio,
                     r.peer_ratio > 1 ? ": within the timing noise, equal" : "");
}

HeadResult analyse(const std::string& layer, Index head, const HeadData& h, const std::vector<BudgetFamily>& families,
                   const Options& o, const CostTable* costs, const ExactPeer* peer) {
  HeadResult r;
  r.layer = layer;
  r.head = head;
  r.n = h.q.rows();
  r.d = h.q.cols();
  AttentionOptions aopts;
  aopts.causal = o.causal;
  const Reference<double> ref(h.q, h.k, h.v, aopts);  // exact attention: what every method is evaluated against
  const ExactOperator<double>& exact = ref.op();

  const RowStats rs = row_stats(exact, 256);
  r.entropy = rs.mean_entropy;
  r.fro2 = rs.fro2;
  r.entropy_max = std::log(double(h.k.rows()));

  // Spectrum: every value up to dense_limit, else the top ones matrix-free.
  if (std::max(r.n, h.k.rows()) <= o.dense_limit) {
    const VectorX<double> s = singular_values<double>(exact_matrix<double>(h.q, h.k, aopts));
    r.sigma.assign(s.data(), s.data() + s.size());
    r.sigma_complete = true;
  } else {
    const TopSingular t = top_singular<double>(exact, std::min<Index>(o.top, std::min(r.n, h.k.rows())));
    r.sigma.assign(t.values.data(), t.values.data() + t.values.size());
  }
  double acc = 0;
  for (std::size_t i = 0; i < r.sigma.size(); ++i) {
    acc += r.sigma[i] * r.sigma[i];
    if (r.r90 < 0 && acc >= 0.90 * r.fro2) r.r90 = Index(i + 1);
    if (r.r99 < 0 && acc >= 0.99 * r.fro2) r.r99 = Index(i + 1);
  }

  // Cost inputs: the head itself, or its rows repeated cyclically to cost_n (see Options::cost_n).
  r.cost_n = o.cost_n > 0 ? o.cost_n : r.n;
  const auto at_cost_length = [&](const MatrixR<double>& x) {
    MatrixR<float> y(r.cost_n, x.cols());
    for (Index i = 0; i < r.cost_n; ++i) y.row(i) = x.row(i % x.rows()).cast<float>();
    return y;
  };
  const MatrixR<float> qf = at_cost_length(h.q), kf = at_cost_length(h.k), vf = at_cost_length(h.v);
  CostOptions co;
  co.repeats = int(o.repeats);
  co.memory = false;
  const auto noise_of = [&](const Cost& c) { return std::max(o.noise, c.spread()); };
  if (costs) {  // the user's device: the table's exact attention at the cost length (checked before any work)
    r.exact_seconds = r.exact_seconds_median = costs->seconds(make_method<float>("exact", 0)->spec(), r.cost_n);
    r.exact_noise = o.noise;
  } else {
    const Cost c = measure_method<float>("exact", qf, kf, vf, 0, aopts, co);
    require(!c.refused, "report: exact attention at n = {}: {}", r.cost_n, c.reason);
    r.exact_seconds = c.min_s;
    r.exact_seconds_median = c.median_s;
    r.exact_noise = noise_of(c);
  }
  r.baseline_seconds = r.exact_seconds;
  if (peer) {  // the ratio at cost_n was checked before any work; within the timing noise the two count as equal
    r.peer_ratio = peer->ratio_at(r.cost_n);
    if (r.peer_ratio > 1 + o.noise) r.baseline_seconds = r.exact_seconds / r.peer_ratio;
  }
  const bool matrix = r.n <= o.dense_limit;
  const Index n_min = std::min(r.n, h.k.rows());
  // Under a reduced storage: the method run in the format on the head's own float32 values, against exact float64.
  const bool reduced = o.storage != Storage::native;
  const MatrixR<float> hq = h.q.cast<float>(), hk = h.k.cast<float>(), hv = h.v.cast<float>();
  const double ref_norm = ref.output().norm();
  const auto in_format = [&](const std::string& spec, std::string& failure) {
    AttentionOptions fo = aopts;
    fo.storage = o.storage;
    fo.policy = o.policy;
    try {
      auto m = make_method<float>(spec, 0);
      m->compute(hq, hk, fo);
      const MatrixR<float> out = m->output(hv);
      const OutputCheck c = m->output_check();
      if (c.nonfinite || c.zero_rows) {
        failure = fmt::format("fails in {} {}: {} non-finite entries, {} all-zero rows", storage_name(o.storage),
                              policy_name(o.policy), c.nonfinite, c.zero_rows);
        return std::numeric_limits<double>::infinity();
      }
      return (out.cast<double>() - ref.output()).norm() / ref_norm;
    } catch (const Error& e) {
      failure = e.what();
      return std::numeric_limits<double>::infinity();
    }
  };
  if (reduced) {
    std::string none;
    r.exact_rounding = in_format("exact", none);
  }
  for (const auto& f : budget_families())
    if (f.label == "svd")  // errors only (the SVD is an analysis baseline, not a deployable method)
      for (Index b : f.budgets) {
        if (b > n_min) continue;
        // ‖P − P_b‖²_F = Σ_{i>b} σ_i²: summed over the tail when every value is known, else ‖P‖²_F − Σ_{i≤b} σ_i².
        double tail = 0, all = 0;
        for (std::size_t i = 0; i < r.sigma.size(); ++i) {
          all += r.sigma[i] * r.sigma[i];
          if (Index(i) >= b) tail += r.sigma[i] * r.sigma[i];
        }
        if (!r.sigma_complete) {
          if (Index(r.sigma.size()) < b) continue;  // beyond the values computed
          tail = std::max(0.0, r.fro2 - (all - tail));
          all = r.fro2;
        }
        r.floor.emplace_back(b, std::sqrt(tail / all));
        // The floor holds for a causal P too (its singular values); the rank-b SVD method itself has no causal
        // form (it factors the materialized P without the mask), so a causal report has no SVD output line.
        if (aopts.causal) continue;
        auto m = make_method<double>(f.spec_at(b), 0);
        EvaluateOptions errors_only;
        errors_only.matrix_errors = false;
        r.svd_out.emplace_back(b, *evaluate<double>(*m, ref, errors_only).value("out_rel_fro"));
      }
  for (const auto& f : families)
    for (Index b : f.budgets) {
      throw_if_cancelled();
      // A budget as large as the head is no approximation there (k = n keys, n landmarks): its error would be
      // measured exact while its cost is taken at cost_n, where the same budget does approximate. Skipped then.
      if (b > n_min || (r.cost_n > r.n && b >= n_min)) continue;
      Point p;
      p.family = f.label;
      p.budget = b;
      auto m = make_method<double>(f.spec_at(b), 0);
      EvaluateOptions eo;
      eo.matrix_errors = matrix;
      eo.spectral = false;
      const Evaluation e = evaluate<double>(*m, ref, eo);
      p.spec = e.spec;
      p.error = *e.value("out_rel_fro");
      if (reduced) {
        p.error_fp64 = p.error;
        p.error = in_format(p.spec, p.failure);
      }
      if (matrix) p.p_error = *e.value("P_rel_fro");
      if (costs) {
        p.seconds = p.seconds_median = costs->seconds(p.spec, r.cost_n);  // NaN: not in the table at this length
        p.speedup = speedup(r.baseline_seconds, p.seconds);
        p.noise = o.noise;
      } else if (b <= std::min(r.cost_n, r.n)) {
        const Cost c = measure_method<float>(p.spec, qf, kf, vf, 0, aopts, co);
        if (!c.refused) {
          p.seconds = c.min_s;
          p.seconds_median = c.median_s;
          p.speedup = speedup(r.baseline_seconds, c.min_s);
          p.noise = noise_of(c);
        }
      }
      r.points.push_back(p);
    }
  // Pareto frontier in (time, error): no other point is both faster and more accurate.
  std::vector<Point*> by_time;
  for (auto& p : r.points)
    if (std::isfinite(p.seconds)) by_time.push_back(&p);
  std::sort(by_time.begin(), by_time.end(), [](const Point* a, const Point* b) {
    return a->seconds != b->seconds ? a->seconds < b->seconds : a->error < b->error;
  });
  double best_err = INFINITY;
  for (Point* p : by_time)
    if (p->error < best_err) {
      p->pareto = true;
      best_err = p->error;
    }
  // Recommendation (recommend(): the rule, in one place).
  std::vector<Candidate> cands;
  for (const Point* p : by_time) cands.push_back({p->family, p->budget, p->error, p->seconds, p->noise});
  const Recommendation rec = recommend(cands, o.target, r.baseline_seconds, r.exact_noise);
  if (rec.pick >= 0) {
    const Point* pick = by_time[std::size_t(rec.pick)];
    r.fit = pick;
    if (rec.beats_exact) r.best = pick;
    else
      r.why = fmt::format("{} {} meets the target ({:.3g}) but is not faster than exact beyond the timing noise "
                          "({:.3g} ms against {:.3g} ms at n = {} on {})",
                          pick->family, pick->budget, pick->error, pick->seconds * 1e3, r.baseline_seconds * 1e3,
                          r.cost_n, costs  ? costs->device
                                    : peer ? fmt::format("this CPU; exact: {}", baseline_name(r, peer))
                                           : "this CPU");
  }
  if (!r.best && r.why.empty()) {
    const auto it = std::min_element(r.points.begin(), r.points.end(),
                                     [](const Point& a, const Point& b) { return a.error < b.error; });
    r.why = it == r.points.end() ? "no method ran"
                                 : fmt::format("no method stays under {:.3g} (best: {} {} at {:.3g})", o.target,
                                               it->family, it->budget, it->error);
  }
  return r;
}

std::string fmt_rank(Index r, bool complete) { return r > 0 ? std::to_string(r) : complete ? "–" : "> computed"; }

/// The floor at ranks 16 and 64, "0.12 / 0.031" ("–" where the rank exceeds n).
std::string fmt_floor(const HeadResult& h) {
  const auto at = [&](Index rank) {
    for (const auto& [r, e] : h.floor)
      if (r == rank) return fmt::format("{:.2g}", e);
    return std::string("–");
  };
  return at(16) + " / " + at(64);
}

std::string recommendation(const HeadResult& h) {
  return h.best ? h.best->spec : std::string("keep exact");
}

/// Colour of a family on every figure (by its position in error_vs_budget's list).
std::string family_colour(const std::string& label) {
  const auto all = budget_families();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].label == label) return svg::colour(i);
  return "#000";
}

std::string head_plot(const HeadResult& h, const std::vector<BudgetFamily>& families, double target,
                      const std::string& device) {
  svg::Plot p(fmt::format("{} head {}: output error against time", h.layer, h.head),
              {fmt::format("time per call (s, {}, n = {})", device, h.cost_n), true}, {"‖O − Õ‖_F / ‖O‖_F", true},
              420, 300);
  for (const auto& f : families) {
    svg::Series s;
    s.label = f.label;
    s.colour = family_colour(f.label);
    for (const auto& pt : h.points)
      if (pt.family == f.label && std::isfinite(pt.seconds))
        s.points.emplace_back(pt.seconds, std::max(pt.error, 1e-17));
    std::sort(s.points.begin(), s.points.end());
    p.add(s);
  }
  svg::Series front;
  front.label = "Pareto frontier";
  front.colour = "#000";
  front.markers = false;
  front.dashed = true;
  front.width = 1;
  for (const auto& pt : h.points)
    if (pt.pareto) front.points.emplace_back(pt.seconds, std::max(pt.error, 1e-17));
  std::sort(front.points.begin(), front.points.end());
  p.add(front);
  p.hline(target, fmt::format("target {:g}", target));
  for (const auto& [rank, err] : h.svd_out)
    if (rank == 64) p.hline(std::max(err, 1e-17), "rank-64 SVD of P, on V");
  p.vline(h.exact_seconds, "exact");
  return p.render();
}

/// A sequential palette for the heads of a layer (dark to light blue-grey), apart from the families' qualitative
/// colours so that a head is never mistaken for a method.
std::string head_colour(std::size_t i) {
  static const char* p[] = {"#08306b", "#2171b5", "#6baed6", "#9e9ac8", "#54278f", "#969696", "#252525", "#bdbdbd"};
  return p[i % (sizeof(p) / sizeof(p[0]))];
}

/// The layer's cumulative spectra, with its own legend (HTML, above the plot) naming each head's colour.
std::string spectrum_plot(const std::vector<const HeadResult*>& heads, const std::string& layer) {
  svg::Plot p(fmt::format("{}: cumulative spectrum of P", layer), {"rank r", true},
              {"share of ‖P‖²_F in the top r singular values", false, 0, 1}, 420, 300);
  std::vector<std::pair<std::string, std::string>> legend;
  for (std::size_t i = 0; i < heads.size(); ++i) {
    const HeadResult& h = *heads[i];
    svg::Series s;
    s.label = fmt::format("head {}", h.head);
    s.colour = head_colour(i);
    s.markers = false;
    double acc = 0;
    for (std::size_t r = 0; r < h.sigma.size(); ++r) {
      acc += h.sigma[r] * h.sigma[r];
      s.points.emplace_back(double(r + 1), acc / h.fro2);
    }
    p.add(s);
    legend.emplace_back(s.label, s.colour);
  }
  return "<div>" + svg::Plot::legend(legend) + p.render() + "</div>";
}

std::string speedup_colour(double s) {
  // White at 1×, deepening green to ≥ 100× (log scale).
  const double t = std::clamp(std::log10(std::max(s, 1.0)) / 2.0, 0.0, 1.0);
  const int g = int(255 - 120 * t), rb = int(255 - 200 * t);
  return fmt::format("#{:02x}{:02x}{:02x}", rb, g, rb);
}

}  // namespace

Recommendation recommend(const std::vector<Candidate>& c, double target, double exact_seconds, double exact_noise) {
  // A candidate: under the target, with a timing.
  const auto candidate = [&](const Candidate& p) { return p.error <= target && std::isfinite(p.seconds); };
  // The fastest candidate (ties: the lower error).
  int fastest = -1;
  for (int i = 0; i < int(c.size()); ++i) {
    const Candidate& p = c[std::size_t(i)];
    if (!candidate(p)) continue;
    if (fastest < 0 || std::make_pair(p.seconds, p.error) <
                           std::make_pair(c[std::size_t(fastest)].seconds, c[std::size_t(fastest)].error))
      fastest = i;
  }
  Recommendation r;
  if (fastest < 0) return r;
  const Candidate& f = c[std::size_t(fastest)];
  const auto key = [&](int i) {
    const Candidate& p = c[std::size_t(i)];
    return std::make_tuple(p.error, simplicity(p.family), p.budget);
  };
  r.pick = fastest;
  for (int i = 0; i < int(c.size()); ++i) {
    const Candidate& p = c[std::size_t(i)];
    if (!candidate(p)) continue;
    // Within the noise of the fastest by either point's noise: a slower point with a noisier timing can be within
    // it when a faster, steadier one is not, so every candidate is checked (an early exit in time order skipped
    // such points: the sanitized suite's slow, noisy timings showed it).
    if (p.seconds > f.seconds * (1 + std::max(f.noise, p.noise))) continue;
    if (key(i) < key(r.pick)) r.pick = i;
  }
  const Candidate& pick = c[std::size_t(r.pick)];
  r.beats_exact = pick.seconds * (1 + std::max(pick.noise, exact_noise)) < exact_seconds;
  return r;
}

std::string causal_rule(const Origin& origin, bool causal) {
  const MaskStatement& m = origin.mask;
  if (!m.causal)
    return causal ? "attention treated as causal (--causal)"
                  : "attention treated as bidirectional (non-causal): pass --causal if the model is causal";
  const std::string input = origin.input.empty() ? "the input" : origin.input;
  require(causal || !*m.causal,
          "report: the attention in {} is a causal model's (as {} says); add --causal (causal=True): the "
          "non-causal methods would let every position see the future", input, m.said_by);
  require(!causal || *m.causal,
          "report: the attention in {} is a bidirectional model's (as {} says); drop --causal "
          "(causal=False): a causal mask would hide the later keys its heads attend to", input, m.said_by);
  return fmt::format("attention {}, as {} says", causal ? "causal" : "bidirectional (non-causal)", m.said_by);
}

std::vector<std::string> input_notes(const std::vector<Layer>& layers, bool causal) {
  std::vector<std::string> out;
  const auto add = [&](std::string s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  };
  for (const auto& l : layers)
    if (l.origin.seq >= 0)
      add(fmt::format("sequence {} of {}{}", l.origin.seq, l.origin.sequences,
                      l.origin.another.empty() ? "" : " (" + l.origin.another + ")"));
  for (const auto& l : layers) add(causal_rule(l.origin, causal));
  return out;
}

Origin files_origin(const std::string& q, const std::string& k, const std::string& v) {
  Origin o;
  o.input = fmt::format("{}, {}, {}", q, k, v);
  for (const std::string& file : {q, k, v}) {
    const MaskStatement s = mask_statement(file);
    if (!s.causal) continue;
    if (!o.mask.causal) o.mask = s;
    else if (*s.causal != *o.mask.causal)
      throw Error(fmt::format("report: {} says the model is {}, {} that it is {}: which is it?", o.mask.said_by,
                              *o.mask.causal ? "causal" : "bidirectional", s.said_by,
                              *s.causal ? "causal" : "bidirectional"));
  }
  // Files of one sequence of a capture (seq{s}_layer{l}_q.npy): which, and how many lie beside them.
  const fs::path file(q), dir = file.parent_path();
  std::smatch m;
  const std::string name = file.filename().string();
  if (std::regex_match(name, m, std::regex("seq(\\d+)_layer(\\d+)_q\\.npy"))) {
    const std::string layer = m[2];
    o.seq = std::stol(m[1]);
    Index n = 0;
    while (fs::exists(dir / fmt::format("seq{}_layer{}_q.npy", n, layer))) ++n;
    o.sequences = std::max(n, o.seq + 1);
    const std::string part = dir.filename().string();  // an export's part: --model-dir reads it
    const bool in_export = (part == "captured" || part == "trained" || part == "initialized") &&
                           fs::exists(dir.parent_path() / "meta.json");
    if (o.sequences > 1)
      o.another = in_export ? fmt::format("use --model-dir {} --layers {} --seq S for another", dir.string(), layer)
                            : fmt::format("give seq{{S}}_layer{}_{{q,k,v}}.npy for another", layer);
  }
  return o;
}

std::vector<Layer> load_model_export(const std::string& dir_in, const std::string& layers, Index seq, bool causal) {
  fs::path dir(dir_in), model = "trained";
  // attnlab.torch.capture's export has captured/ where tools/trained_attention.py's has trained/.
  if (fs::exists(dir / "meta.json") && !fs::exists(dir / "trained") && fs::exists(dir / "captured")) model = "captured";
  if (!fs::exists(dir / "meta.json")) {
    require(fs::exists(dir.parent_path() / "meta.json"),
            "report: {0} is not a model export (no meta.json in it or its parent); {1}; make one for your "
            "model with attnlab.torch.capture(model).save({0}), the project's with "
            "tools/trained_attention.py --out {0}", dir_in, ModelData::layout(dir_in, "captured"));
    model = dir.filename();
    dir = dir.parent_path();
  }
  const ModelData data(dir.string(), model.string(), "",
                       fmt::format("attnlab.torch.capture(model).save({0}) writes one for your model ({0}/captured/), "
                                   "tools/trained_attention.py --out {0} the project's ({0}/trained/)", dir.string()));
  Origin origin;
  origin.input = dir_in;
  origin.mask = data.mask();
  origin.seq = seq;
  origin.sequences = data.sequences();
  if (data.sequences() > 1) origin.another = "use --seq S for another";
  causal_rule(origin, causal);  // before any head is read
  require(seq >= 0 && seq < data.sequences(),
          "report: sequence {} out of range (the export has {})", seq, data.sequences());
  std::vector<Index> which;
  if (layers == "all") {
    for (Index l = 0; l < data.layers(); ++l) which.push_back(l);
  } else {
    std::stringstream ss(layers);
    std::string item;
    while (std::getline(ss, item, ',')) {
      Index l = -1;
      try {
        std::size_t used = 0;
        l = std::stol(item, &used);
        if (used != item.size()) l = -1;
      } catch (const std::exception&) {
      }
      require(l >= 0 && l < data.layers(),
              "report: layer '{}' is not in 0..{} (or 'all')", item, data.layers() - 1);
      which.push_back(l);
    }
  }
  std::vector<Layer> out;
  for (Index l : which) {
    Layer layer;
    layer.name = fmt::format("L{}", l);
    layer.origin = origin;
    for (Index h = 0; h < data.heads(); ++h) {
      const Qkv<double> p = data.load({seq, l, h});
      layer.heads.push_back({p.q, p.k, p.v});
    }
    out.push_back(std::move(layer));
  }
  return out;
}

Summary write_report(const std::vector<Layer>& layers, const Options& o) {
  require(o.target > 0 && std::isfinite(o.target), "report: target must be > 0, got {}", o.target);
  require(o.repeats >= 1, "report: repeats must be ≥ 1");
  require(o.cost_n >= 0, "report: cost length must be ≥ 0 (0: each head's own), got {}", o.cost_n);
  require(o.noise >= 0 && std::isfinite(o.noise), "report: noise must be ≥ 0, got {}", o.noise);
  require(!layers.empty() && !layers.front().heads.empty(), "report: no heads given");
  for (const auto& l : layers)
    for (const auto& h : l.heads)
      require(h.q.cols() == h.k.cols() && h.k.rows() == h.v.rows() && h.q.rows() >= 1,
              "report: {}: Q, K, V shapes disagree", l.name);
  const auto families = chosen_families(o);
  const std::vector<std::string> notes = input_notes(layers, o.causal);  // the causal rule: refused before any work
  // Costs from the user's device: read and checked before any work (its exact attention at every cost length).
  std::optional<CostTable> costs;
  if (!o.costs.empty()) {
    const std::string dtype = !o.costs_dtype.empty() ? o.costs_dtype
                              : o.storage != Storage::native ? storage_name(o.storage) : "";
    costs = read_costs(o.costs, dtype, layers.front().heads.front().q.cols(), o.causal);
    for (const auto& l : layers)
      for (const auto& h : l.heads) {
        const Index n = o.cost_n > 0 ? o.cost_n : h.q.rows();
        require(std::isfinite(costs->seconds(make_method<float>("exact", 0)->spec(), n)),
                "report --costs {}: exact attention is not measured at n = {} there (nor between two lengths "
                "around it): give --cost-n within the table's lengths", o.costs, n);
      }
  } else {
    require(o.costs_dtype.empty(), "report: --costs-dtype needs --costs");
  }
  // A faster exact attention on this CPU: its ratio at every cost length, checked before any work.
  std::optional<ExactPeer> peer;
  if (!o.exact_peer.empty()) {
    require(o.costs.empty(), "report: --exact-peer is for costs timed here; a --costs table has its own exact "
            "attention");
    require(!o.causal, "report --exact-peer: the table measured non-causal exact attention; a causal report's "
            "baseline is attnlab's causal exact");
    // This command's kernels, as the table's detail records a build's (cost_context() less its thread count).
    std::string kernels = cost_context();
    kernels = kernels.substr(kernels.find(' ') + 1);
    peer = read_exact_peer(o.exact_peer, o.threads > 0 ? o.threads : omp_get_max_threads(), cpu_name(), kernels,
                           layers.front().heads.front().q.cols());
    for (const auto& l : layers)
      for (const auto& h : l.heads) {
        const Index n = o.cost_n > 0 ? o.cost_n : h.q.rows();
        require(std::isfinite(peer->ratio_at(n)), "report --exact-peer {}: no ratio at n = {} (measured at n = "
                "{} … {}): give --cost-n within them, or measure that length", o.exact_peer, n,
                peer->ratio.front().first, peer->ratio.back().first);
      }
  }
  const std::string input_note = notes.empty() ? "" : fmt::format("Input: {}.", fmt::join(notes, "; "));
  require(o.threads >= 0, "report: threads must be ≥ 0, got {}", o.threads);
  // Costs timed here on more threads than this machine has cores would measure the scheduler, not the methods: the
  // costs for a larger machine are that machine's (tools/bench_gpu.py or tools/bench_threads.py there, then --costs).
  require(o.threads <= omp_get_num_procs() || !o.costs.empty(),
          "report: --threads {} exceeds this machine's {} cores: costs timed here would measure oversubscription; "
          "measure on the machine you mean (tools/bench_gpu.py --device cpu there) and pass its table with --costs",
          o.threads, omp_get_num_procs());
  fs::create_directories(o.out);
  // The thread count for this report only: restored on return, also when an error or Ctrl-C ends it.
  struct Threads {
    int saved = omp_get_max_threads();
    explicit Threads(int n) {
      if (n > 0) omp_set_num_threads(n);
    }
    ~Threads() { omp_set_num_threads(saved); }
  } threads_guard(o.threads);

  std::vector<HeadResult> results;
  Index total = 0, done = 0;
  for (const auto& l : layers) total += Index(l.heads.size());
  for (const auto& l : layers)
    for (std::size_t h = 0; h < l.heads.size(); ++h) {
      results.push_back(analyse(l.name, Index(h), l.heads[h], families, o, costs ? &*costs : nullptr,
                                peer ? &*peer : nullptr));
      ++done;
      if (o.progress)
        fmt::print(stderr, "report: [{}/{}] {} head {}: {} \n", done, total, l.name, h, recommendation(results.back()));
    }

  Summary sum;
  sum.heads = Index(results.size());
  sum.notes = notes;
  // report.csv: tidy, one value per row.
  sum.csv = (fs::path(o.out) / "report.csv").string();
  {
    TidyCsvWriter csv(sum.csv, {"experiment", "layer", "head", "n", "d", "family", "spec", "budget"});
    for (const auto& h : results) {
      const auto keys = [&](const std::string& fam, const std::string& spec, Index b) {
        return std::vector<std::string>{"report", h.layer, std::to_string(h.head), std::to_string(h.n),
                                        std::to_string(h.d), fam, spec, b ? std::to_string(b) : ""};
      };
      const auto hk = keys("", "exact", 0);
      csv.write(hk, "entropy", h.entropy);
      csv.write(hk, "entropy_max", h.entropy_max);
      csv.write(hk, "stable_rank", stable_rank(h));
      if (h.r90 > 0) csv.write(hk, "rank_90", double(h.r90));
      if (h.r99 > 0) csv.write(hk, "rank_99", double(h.r99));
      csv.write(hk, "time_s", h.exact_seconds);
      csv.write(hk, "time_median_s", h.exact_seconds_median);
      if (peer) {  // the exact time the speed-ups are over, and the peer's ratio behind it
        csv.write(hk, "baseline_time_s", h.baseline_seconds);
        csv.write(hk, "exact_peer_ratio", h.peer_ratio);
      }
      csv.write(hk, "cost_n", double(h.cost_n));
      if (o.storage != Storage::native) {
        if (std::isfinite(h.exact_rounding)) csv.write(hk, "out_rel_fro", h.exact_rounding);
        else csv.write(hk, "failed_in_format", 1.0);
      }
      for (const auto& [rank, err] : h.floor) csv.write(keys("svd", "svd", rank), "eckart_young_floor", err);
      for (const auto& [rank, err] : h.svd_out) csv.write(keys("svd", "svd", rank), "svd_out_rel_fro", err);
      for (std::size_t i = 0; i < h.sigma.size(); ++i)
        csv.write(keys("", "exact", Index(i + 1)), "singular_value", h.sigma[i]);
      for (const auto& p : h.points) {
        const auto k = keys(p.family, p.spec, p.budget);
        csv.write(k, "out_rel_fro", p.error);
        if (std::isfinite(p.error_fp64)) csv.write(k, "out_rel_fro_fp64", p.error_fp64);
        if (!p.failure.empty()) csv.write(k, "failed_in_format", 1.0);
        if (std::isfinite(p.p_error)) csv.write(k, "P_rel_fro", p.p_error);
        if (std::isfinite(p.seconds)) {
          csv.write(k, "time_s", p.seconds);
          csv.write(k, "time_median_s", p.seconds_median);
          csv.write(k, "speedup_vs_exact", p.speedup);
        }
        csv.write(k, "pareto", p.pareto ? 1.0 : 0.0);
        csv.write(k, "recommended", &p == h.best ? 1.0 : 0.0);
      }
    }
  }
  std::ofstream(sum.csv + ".config") << fmt::format(
      "report of {} heads; target {}; repeats {}; cost length {}; noise {}; causal {}; precision {} {}; costs {}; "
      "families {}\n"
      "input: {}\ncode_version: {}\n",
      results.size(), o.target, o.repeats, results[0].cost_n, o.noise, o.causal, storage_name(o.storage),
      o.storage == Storage::native ? "" : policy_name(o.policy),
      costs ? "measured on " + costs->where() : "timed on " + cost_device(), [&] {
        std::string s;
        for (const auto& f : families) s += (s.empty() ? "" : ",") + f.label;
        return s;
      }(), fmt::join(notes, "; "), code_version());

  // summary.md
  for (const auto& h : results) sum.keep_exact += h.best ? 0 : 1;
  std::map<std::string, int> by_family;
  for (const auto& h : results) ++by_family[h.best ? h.best->family : "keep exact"];
  const Index cost_n = results[0].cost_n;
  const std::string cost_where =
      cost_n == results[0].n ? fmt::format("at the heads' own length n = {}", cost_n)
                             : fmt::format("at n = {} (each head's rows repeated to that length; errors on the heads "
                                           "themselves at n = {})", cost_n, results[0].n);
  // The device every cost and speed-up holds for, in the sentence that quotes them (issue "Costs on the machine the
  // user runs"): the costs table's, or this CPU's with its threads and kernels.
  std::string cost_sentence;
  if (costs) {
    Index uncosted = 0, points = 0;
    for (const auto& h : results)
      for (const auto& p : h.points) {
        ++points;
        uncosted += !std::isfinite(p.seconds);
      }
    cost_sentence = fmt::format(
        "cost {}: per call as measured on {} — the table's times, interpolated in log n between its lengths, against "
        "the table's exact attention on that device; nothing timed on this machine; {} of {} method × budget points "
        "have no cost in the table at that length (no candidates)",
        cost_where, costs->where(), uncosted, points);
  } else if (peer) {
    cost_sentence = fmt::format(
        "cost {}: float32 compute + output in steady state (a warm-up, then the fastest of {} calls) on {}, against "
        "the fastest exact attention measured on this CPU: {} — the ratio of the two measured in one run at {} "
        "threads ({}; at n = {}, interpolated in log n between measured lengths), applied to attnlab's exact timed "
        "here; speed-ups for this CPU and thread count, not a GPU's",
        cost_where, o.repeats, cost_device(), baseline_name(results[0], &*peer), peer->threads, peer->file, cost_n);
  } else {
    cost_sentence = fmt::format(
        "cost {}: float32 compute + output in steady state (a warm-up, then the fastest of {} calls) on {}, against "
        "attnlab's exact streaming attention timed the same way — speed-ups for this CPU and thread count, not a "
        "GPU's nor another library's exact attention (`--costs FILE` takes costs measured on your device; "
        "`--exact-peer FILE` PyTorch's fused exact attention measured on this CPU)",
        cost_where, o.repeats, cost_device());
  }
  const std::string on_device = costs ? costs->device + (costs->dtype.empty() ? "" : ", " + costs->dtype) : "";
  const std::string over =
      peer && results[0].baseline_seconds < results[0].exact_seconds ? " over " + peer->peer : "";
  const std::string speedup_on = costs ? "speed-up on " + on_device
                                       : fmt::format("speed-up{} on this CPU, {} threads", over,
                                                     omp_get_max_threads());
  std::string md = fmt::format("# {}\n\n{} heads (n = {}, d = {}); target output error ‖O − Õ‖_F/‖O‖_F ≤ {:g}; "
                               "{}; times within the timing noise (≥ {:.0f}%) count as equal.\n\n",
                               o.title, results.size(), results[0].n, results[0].d, o.target, cost_sentence,
                               o.noise * 100);
  if (!input_note.empty()) md += input_note + "\n\n";
  if (o.storage != Storage::native) {
    std::vector<double> ex;
    std::map<std::string, int> failed;
    for (const auto& h : results) {
      ex.push_back(h.exact_rounding);
      if (!std::isfinite(h.exact_rounding)) ++failed["exact (heads)"];
      for (const auto& p : h.points)
        if (!p.failure.empty()) ++failed[p.family];
    }
    std::sort(ex.begin(), ex.end());
    std::string fails;
    for (const auto& [f, c] : failed) fails += fmt::format("{}{} × {}", fails.empty() ? "" : ", ", c, f);
    md += fmt::format(
        "Precision: errors in emulated {0} storage, {1} policy (attnlab's CPU emulation: the tensors each method "
        "stores rounded to {0}, sums in float32; `attnlab methods NAME` says which): each method's output against "
        "exact float64 attention, rounding and approximation together, so the recommendation is for {0}. Exact "
        "attention itself in {0} ({1}) is off by {2:.2g} (median over the heads). Failed or not emulated in {0} "
        "(no candidates; method × budget × head points): {3}. {4}\n\n",
        storage_name(o.storage), policy_name(o.policy), ex[ex.size() / 2], fails.empty() ? "none" : fails,
        costs ? fmt::format("Costs are the table's ({}).", on_device)
              : fmt::format("Costs are float32 on this CPU, not {} arithmetic.", storage_name(o.storage)));
  }
  md += "Recommendations: ";
  for (const auto& [f, c] : by_family) md += fmt::format("{} × {}; ", c, f);
  md += "\n\n| layer | head | entropy (nats) | stable rank | rank for 90% | Eckart–Young floor (rank 16 / 64) | "
        "recommendation | error | " + speedup_on + " | best under the target (error, speed-up) |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& h : results)
    md += fmt::format("| {} | {} | {:.2f} / {:.2f} | {:.1f} | {} | {} | {} | {} | {} | {} |\n", h.layer, h.head,
                      h.entropy, h.entropy_max, stable_rank(h), fmt_rank(h.r90, h.sigma_complete), fmt_floor(h),
                      recommendation(h),
                      h.best ? fmt::format("{:.3g}", h.best->error) : "–",
                      h.best ? fmt::format("{:.1f}×", h.best->speedup) : "1×",
                      h.fit ? fmt::format("{} {} ({:.3g}, {:.2f}×)", h.fit->family, h.fit->budget, h.fit->error,
                                          h.fit->speedup)
                            : "none");
  sum.summary_md = (fs::path(o.out) / "summary.md").string();
  std::ofstream(sum.summary_md) << md;

  // index.html: maps, table, then per layer the spectra and per head error against cost.
  std::vector<std::string> row_labels;
  Index max_heads = 0;
  for (const auto& l : layers) {
    row_labels.push_back(l.name);
    max_heads = std::max(max_heads, Index(l.heads.size()));
  }
  std::vector<std::string> col_labels;
  for (Index h = 0; h < max_heads; ++h) col_labels.push_back(fmt::format("head {}", h));
  std::vector<std::vector<std::pair<std::string, std::string>>> rec_cells(layers.size()), speed_cells(layers.size());
  {
    std::size_t i = 0;
    for (std::size_t l = 0; l < layers.size(); ++l)
      for (std::size_t h = 0; h < layers[l].heads.size(); ++h, ++i) {
        const HeadResult& r = results[i];
        const std::string fam = r.best ? r.best->family : "";
        rec_cells[l].emplace_back(r.best ? family_colour(fam) + "55" : "#eeeeee",
                                  r.best ? fmt::format("{} {}", fam, r.best->budget) : "keep exact");
        speed_cells[l].emplace_back(speedup_colour(r.best ? r.best->speedup : 1.0),
                                    r.best ? fmt::format("{:.1f}× ({:.2g})", r.best->speedup, r.best->error) : "1×");
      }
  }
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title>\n<style>"
      "body{{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}}"
      "table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 7px;text-align:right}}"
      "th{{background:#f3f3f3}}td.l{{text-align:left}}.figs{{display:flex;flex-wrap:wrap;gap:8px}}"
      ".legend span{{margin-right:12px;font-size:12px;white-space:nowrap}}.legend i{{display:inline-block;width:10px;"
      "height:10px;margin-right:4px}}.note{{color:#555;font-size:13px}}</style></head><body>\n<h1>{0}</h1>\n",
      svg::escape(o.title));
  html += fmt::format(
      "<p>{} heads, n = {}, d = {}. For each head: every efficient method at several budgets, its output error "
      "‖O − Õ‖<sub>F</sub>/‖O‖<sub>F</sub> against exact attention (float64), and its cost ({}{}). "
      "<b>Recommendation</b>: among the methods under the target error {:g}, those as fast as the fastest "
      "within the timing noise (≥ {:.0f}%, or the calls' own spread), the most accurate, then the simplest — if it "
      "beats exact attention by more than the noise; otherwise <i>keep exact</i>. The <b>Eckart–Young floor</b> is "
      "‖P − P<sub>r</sub>‖<sub>F</sub>/‖P‖<sub>F</sub> of P's best rank-r approximation: no attention matrix of rank "
      "≤ r (Nyström, Linformer, Performer, VQ at budget r) comes closer; report.csv gives each method's own "
      "P_rel_fro beside it. Speed-ups grow with n for the sub-quadratic methods.</p>\n<p>{}</p>\n",
      results.size(), results[0].n, results[0].d, svg::escape(cost_sentence), "", o.target, o.noise * 100,
      svg::escape(md.substr(md.find("Recommendations"), md.find("\n\n|") - md.find("Recommendations"))));
  if (!input_note.empty()) html += fmt::format("<p class=\"note\">{}</p>\n", svg::escape(input_note));
  html += "<div class=\"figs\">" +
          svg::heat_map("Recommended method (family, budget)", row_labels, col_labels, rec_cells) +
          svg::heat_map("Its " + speedup_on + " (its output error)", row_labels, col_labels, speed_cells) + "</div>\n";
  html += "<h2>Heads</h2>\n<table><tr><th>layer</th><th>head</th><th>entropy / max (nats)</th><th>stable rank</th>"
          "<th>rank for 90% / 99% of ‖P‖²<sub>F</sub></th><th>Eckart–Young floor (rank 16 / 64)</th><th>exact (ms)</th>"
          "<th>recommendation</th><th>error</th><th>" + svg::escape(speedup_on) + "</th>"
          "<th class=\"l\">best under the target (faster than exact or not)</th>"
          "<th class=\"l\">note</th></tr>\n";
  for (const auto& h : results)
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.2f} / {:.2f}</td><td>{:.1f}</td><td>{} / {}</td><td>{}</td>"
                        "<td>{:.3f}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td>"
                        "<td class=\"l note\">{}</td></tr>\n",
                        h.layer, h.head, h.entropy, h.entropy_max, stable_rank(h), fmt_rank(h.r90, h.sigma_complete),
                        fmt_rank(h.r99, h.sigma_complete), fmt_floor(h), h.exact_seconds * 1e3,
                        svg::escape(recommendation(h)),
                        h.best ? fmt::format("{:.3g}", h.best->error) : "–",
                        h.best ? fmt::format("{:.1f}×", h.best->speedup) : "1×",
                        h.fit ? svg::escape(fmt::format("{} {} ({:.3g}, {:.2f}×)", h.fit->family, h.fit->budget,
                                                        h.fit->error, h.fit->speedup))
                              : "none",
                        svg::escape(h.why));
  html += "</table>\n";
  std::vector<std::pair<std::string, std::string>> legend;
  for (const auto& f : families) legend.emplace_back(f.label, family_colour(f.label));
  legend.emplace_back("Pareto frontier (dashed)", "#000");
  std::size_t i = 0;
  for (const auto& l : layers) {
    std::vector<const HeadResult*> lh;
    for (std::size_t h = 0; h < l.heads.size(); ++h) lh.push_back(&results[i + h]);
    html += fmt::format("<h2>{}</h2>\n", svg::escape(l.name)) + svg::Plot::legend(legend) + "<div class=\"figs\">" +
            spectrum_plot(lh, l.name);
    for (const HeadResult* h : lh)
      html += head_plot(*h, families, o.target, costs ? on_device : "float32, this CPU");
    html += "</div>\n";
    i += l.heads.size();
  }
  html += fmt::format("<p class=\"note\">attnlab {}; data in report.csv (tidy: one value per row), summary in "
                      "summary.md.</p>\n</body></html>\n",
                      code_version());
  sum.index_html = (fs::path(o.out) / "index.html").string();
  std::ofstream(sum.index_html) << html;
  return sum;
}

}  // namespace attnlab::report
