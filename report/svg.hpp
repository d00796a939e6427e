// Small SVG charts for the report (inline in its HTML: no plotting library, no image files): line/scatter plots
// with linear or log axes, and labelled heat maps. Just enough for the report's three figure kinds.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace attnlab::svg {

/// Colour i of a qualitative palette (Tableau 10, then greys).
inline std::string colour(std::size_t i) {
  static const char* p[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                            "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#17becf", "#7f7f7f"};
  return p[i % (sizeof(p) / sizeof(p[0]))];
}

inline std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

struct Series {
  std::string label, colour;
  std::vector<std::pair<double, double>> points;
  bool line = true, markers = true, dashed = false;
  double width = 1.5;
};

struct Axis {
  std::string label;
  bool log = false;
  double lo = NAN, hi = NAN;  // NaN: from the data
};

class Plot {
 public:
  Plot(std::string title, Axis x, Axis y, int width = 420, int height = 300)
      : title_(std::move(title)), x_(std::move(x)), y_(std::move(y)), w_(width), h_(height) {}
  void add(Series s) { series_.push_back(std::move(s)); }
  void hline(double y, const std::string& label) { hlines_.emplace_back(y, label); }
  void vline(double x, const std::string& label) { vlines_.emplace_back(x, label); }

  std::string render() const {
    double xlo = x_.lo, xhi = x_.hi, ylo = y_.lo, yhi = y_.hi;
    const auto grow = [](double& lo, double& hi, double v, bool log) {
      if (!std::isfinite(v) || (log && v <= 0)) return;
      lo = std::isnan(lo) ? v : std::min(lo, v);
      hi = std::isnan(hi) ? v : std::max(hi, v);
    };
    double dxlo = NAN, dxhi = NAN, dylo = NAN, dyhi = NAN;
    for (const auto& s : series_)
      for (const auto& [x, y] : s.points) {
        grow(dxlo, dxhi, x, x_.log);
        grow(dylo, dyhi, y, y_.log);
      }
    for (const auto& [y, l] : hlines_) grow(dylo, dyhi, y, y_.log);
    for (const auto& [x, l] : vlines_) grow(dxlo, dxhi, x, x_.log);
    if (std::isnan(xlo)) xlo = dxlo;
    if (std::isnan(xhi)) xhi = dxhi;
    if (std::isnan(ylo)) ylo = dylo;
    if (std::isnan(yhi)) yhi = dyhi;
    if (std::isnan(xlo)) xlo = 0, xhi = 1;
    if (std::isnan(ylo)) ylo = 0, yhi = 1;
    pad(xlo, xhi, x_.log);
    pad(ylo, yhi, y_.log);
    const double L = 58, R = 10, T = 24, B = 40, pw = w_ - L - R, ph = h_ - T - B;
    const auto tx = [&](double v) {
      return L + pw * (fwd(v, x_.log) - fwd(xlo, x_.log)) / (fwd(xhi, x_.log) - fwd(xlo, x_.log));
    };
    const auto ty = [&](double v) {
      return T + ph * (1 - (fwd(v, y_.log) - fwd(ylo, y_.log)) / (fwd(yhi, y_.log) - fwd(ylo, y_.log)));
    };
    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        w_, h_, w_, h_);
    o += fmt::format("<text x=\"{}\" y=\"15\" font-size=\"12\" font-weight=\"bold\">{}</text>\n", L, escape(title_));
    // Ticks: decades on log axes, 5 steps on linear ones.
    for (double v : ticks(xlo, xhi, x_.log)) {
      const double px = tx(v);
      o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e5e5e5\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
                       px, T, T + ph, T + ph + 14, label(v, x_.log));
    }
    for (double v : ticks(ylo, yhi, y_.log)) {
      const double py = ty(v);
      o += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#e5e5e5\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       py, L, L + pw, L - 4, py + 4, label(v, y_.log));
    }
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", L, T, pw,
                     ph);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, h_ - 6,
                     escape(x_.label));
    o += fmt::format("<text transform=\"translate(12,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", T + ph / 2,
                     escape(y_.label));
    const auto inside = [&](double x, double y) {
      return std::isfinite(x) && std::isfinite(y) && (!x_.log || x > 0) && (!y_.log || y > 0);
    };
    for (const auto& [y, l] : hlines_)
      if (inside(xlo, y))
        o += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#c00\" "
                         "stroke-dasharray=\"4 3\"/>"
                         "<text x=\"{}\" y=\"{:.1f}\" fill=\"#c00\" text-anchor=\"end\">{}</text>\n",
                         L, ty(y), L + pw, ty(y), L + pw - 2, ty(y) - 3, escape(l));
    for (const auto& [x, l] : vlines_)
      if (inside(x, ylo))
        o += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#444\" "
                         "stroke-dasharray=\"2 3\"/>"
                         "<text x=\"{:.1f}\" y=\"{}\" fill=\"#444\">{}</text>\n",
                         tx(x), T, tx(x), T + ph, tx(x) + 3, T + 11, escape(l));
    for (const auto& s : series_) {
      std::string pts;
      for (const auto& [x, y] : s.points)
        if (inside(x, y)) pts += fmt::format("{:.1f},{:.1f} ", tx(x), ty(y));
      if (s.line && !pts.empty())
        o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{}/>\n", pts, s.colour,
                         s.width, s.dashed ? " stroke-dasharray=\"5 3\"" : "");
      if (s.markers)
        for (const auto& [x, y] : s.points)
          if (inside(x, y))
            o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.6\" fill=\"{}\">"
                             "<title>{}: ({:.3g}, {:.3g})</title></circle>\n",
                             tx(x), ty(y), s.colour, escape(s.label), x, y);
    }
    o += "</svg>\n";
    return o;
  }

  /// The legend as HTML (beside the plots, shared by several).
  static std::string legend(const std::vector<std::pair<std::string, std::string>>& entries) {
    std::string o = "<div class=\"legend\">";
    for (const auto& [label, c] : entries)
      o += fmt::format("<span><i style=\"background:{}\"></i>{}</span> ", c, escape(label));
    return o + "</div>\n";
  }

 private:
  static double fwd(double v, bool log) { return log ? std::log10(v) : v; }
  static void pad(double& lo, double& hi, bool log) {
    if (log) {
      lo = std::pow(10, std::floor(std::log10(lo) + 1e-9));
      hi = std::pow(10, std::ceil(std::log10(hi) - 1e-9));
      if (hi <= lo) hi = lo * 10;
    } else {
      if (hi <= lo) hi = lo + 1;
      const double m = 0.04 * (hi - lo);
      lo -= m;
      hi += m;
    }
  }
  static std::vector<double> ticks(double lo, double hi, bool log) {
    std::vector<double> t;
    if (log) {
      const int a = int(std::round(std::log10(lo))), b = int(std::round(std::log10(hi)));
      const int step = std::max(1, (b - a) / 6);
      for (int e = a; e <= b; e += step) t.push_back(std::pow(10.0, e));
    } else {
      const double raw = (hi - lo) / 5, mag = std::pow(10, std::floor(std::log10(raw)));
      const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
      for (double v = std::ceil(lo / step) * step; v <= hi + 1e-12; v += step) t.push_back(v);
    }
    return t;
  }
  static std::string label(double v, bool log) {
    if (log) return fmt::format("1e{}", int(std::round(std::log10(v))));
    return fmt::format("{:g}", std::abs(v) < 1e-12 ? 0.0 : v);
  }

  std::string title_;
  Axis x_, y_;
  int w_, h_;
  std::vector<Series> series_;
  std::vector<std::pair<double, std::string>> hlines_, vlines_;
};

/// A rows × cols grid of cells, each with a fill colour and a short text (the layer × head maps).
inline std::string heat_map(const std::string& title, const std::vector<std::string>& row_labels,
                            const std::vector<std::string>& col_labels,
                            const std::vector<std::vector<std::pair<std::string, std::string>>>& cells,
                            int cell_w = 112, int cell_h = 34) {
  const int L = 44, T = 40;
  const int w = L + cell_w * int(col_labels.size()) + 8, h = T + cell_h * int(row_labels.size()) + 8;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"15\" font-size=\"12\" font-weight=\"bold\">{}</text>\n",
      w, h, L, escape(title));
  for (std::size_t c = 0; c < col_labels.size(); ++c)
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + cell_w * int(c) + cell_w / 2,
                     T - 6, escape(col_labels[c]));
  for (std::size_t r = 0; r < row_labels.size(); ++r) {
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 6,
                     T + cell_h * int(r) + cell_h / 2 + 4, escape(row_labels[r]));
    for (std::size_t c = 0; c < col_labels.size() && c < cells[r].size(); ++c) {
      const auto& [fill, text] = cells[r][c];
      const int x = L + cell_w * int(c), y = T + cell_h * int(r);
      o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"white\"/>"
                       "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       x, y, cell_w, cell_h, fill, x + cell_w / 2, y + cell_h / 2 + 4, escape(text));
    }
  }
  return o + "</svg>\n";
}

}  // namespace attnlab::svg
