// PLplot drawing for the examples. PLplot keeps global state per stream, so each figure is one
// plinit() ... plend() on a fresh stream.
#include "plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include <plplot.h>

namespace tapegrad_examples {
namespace {

// Opens a PNG stream of `width` x `height` pixels with `columns` sub-pages.
void begin(const std::string& path, int width, int height, int columns) {
  if (FILE* f = std::fopen(path.c_str(), "wb")) std::fclose(f);
  else throw std::runtime_error("plot: cannot write " + path);
  plsdev("pngcairo");
  plsfnam(path.c_str());
  plsetopt("geometry", (std::to_string(width) + "x" + std::to_string(height)).c_str());
  plscolbg(255, 255, 255);  // white background, black ink
  plstar(columns, 1);
  // Distinct dark line colours (PLplot's default map starts with red, yellow, green...).
  const int palette[][3] = {{0, 0, 0}, {31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {148, 103, 189}, {255, 127, 14}, {140, 86, 75}};
  for (int i = 0; i < 7; ++i) plscol0(i == 0 ? 15 : i, palette[i][0], palette[i][1], palette[i][2]);
}

void end() { plend(); }

std::pair<double, double> finite_range(const std::vector<double>& v) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double x : v)
    if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!(lo <= hi)) return {0, 1};
  if (lo == hi) return {lo - 0.5, hi + 0.5};
  return {lo, hi};
}

}  // namespace

Heatmap causal_attention_map(std::string title, std::vector<double> weights, long t) {
  Heatmap map{std::move(title), "key position", "query position", "weight", t, t, std::move(weights), {}, false};
  for (long i = 0; i < t; ++i)
    for (long j = 0; j < t; ++j) map.masked.push_back(j > i);
  return map;
}

void plot_lines(const std::string& path, const LinePlot& p) {
  begin(path, 900, 600, 1);
  std::vector<std::vector<double>> ys;
  std::vector<double> all_x, all_y;
  for (const auto& s : p.series) {
    std::vector<double> y = s.y;
    if (p.log_y)
      for (auto& v : y) v = v > 0 ? std::log10(v) : std::numeric_limits<double>::quiet_NaN();
    all_x.insert(all_x.end(), s.x.begin(), s.x.end());
    all_y.insert(all_y.end(), y.begin(), y.end());
    ys.push_back(std::move(y));
  }
  const auto [x0, x1] = finite_range(all_x);
  const auto [y0, y1] = finite_range(all_y);
  plcol0(15);
  plenv(x0, x1, y0, y1, 0, p.log_y ? 20 : 2);  // 20: logarithmic y axis labels, 2: a grid
  pllab(p.x_label.c_str(), p.y_label.c_str(), p.title.c_str());
  std::vector<PLINT> colours, styles;
  std::vector<const char*> texts;
  for (std::size_t i = 0; i < p.series.size(); ++i) {
    const PLINT colour = static_cast<PLINT>(1 + i % 6);
    plcol0(colour);
    plwidth(2.0);
    plline(static_cast<PLINT>(p.series[i].x.size()), p.series[i].x.data(), ys[i].data());
    colours.push_back(colour);
    styles.push_back(1);
    texts.push_back(p.series[i].label.c_str());
  }
  if (p.series.size() > 1) {
    std::vector<PLINT> opts(p.series.size(), PL_LEGEND_LINE);
    std::vector<PLFLT> widths(p.series.size(), 2.0);
    std::vector<PLINT> zero(p.series.size(), 0);
    std::vector<PLFLT> scales(p.series.size(), 1.0);
    std::vector<const char*> no_symbols(p.series.size(), "");
    PLFLT w = 0, h = 0;
    plcol0(15);
    pllegend(&w, &h, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX, PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_INSIDE, 0.02,
             0.02, 0.1, 0, 15, 1, 0, 0, static_cast<PLINT>(opts.size()), opts.data(), 1.0, 1.0, 2.0, 1.0, colours.data(),
             texts.data(), zero.data(), zero.data(), scales.data(), widths.data(), colours.data(), styles.data(), widths.data(),
             zero.data(), scales.data(), zero.data(), no_symbols.data());
  }
  end();
}

void plot_heatmaps(const std::string& path, const std::string& title, const std::vector<Heatmap>& panels) {
  // One page; panels on a grid of up to 3 columns, placed by hand so the title has its own band.
  const int n = static_cast<int>(std::max<std::size_t>(panels.size(), 1));
  const int columns = n == 4 ? 2 : std::min(n, 3), rows = (n + columns - 1) / columns;
  const double band = title.empty() ? 0.0 : 0.5 / (rows * 5.0 + 0.5);  // the title's share of the height
  begin(path, 560 * columns, 520 * rows + (title.empty() ? 0 : 50), 1);
  pladv(0);
  plschr(0, rows > 1 || columns > 2 ? 0.7 : 1.0);  // PLplot sizes text by the page: keep it in proportion
  const PLFLT text = rows > 1 || columns > 2 ? 0.7 : 1.0;
  for (int p = 0; p < static_cast<int>(panels.size()); ++p) {
    const Heatmap& h = panels[static_cast<std::size_t>(p)];
    if (static_cast<long>(h.values.size()) != h.rows * h.cols) throw std::runtime_error("plot_heatmaps: values do not fill rows x cols");
    auto [lo, hi] = finite_range(h.values);
    if (h.diverging) hi = std::max(std::abs(lo), std::abs(hi)), lo = -hi;
    // cmap1: white -> dark blue, or blue -> white -> red around 0.
    if (h.diverging) {
      PLFLT pos[] = {0, 0.5, 1}, r[] = {0.1, 1, 0.8}, g[] = {0.3, 1, 0.1}, b[] = {0.8, 1, 0.1};
      plscmap1l(1, 3, pos, r, g, b, nullptr);
    } else {
      PLFLT pos[] = {0, 1}, r[] = {1, 0.05}, g[] = {1, 0.2}, b[] = {1, 0.55};
      plscmap1l(1, 2, pos, r, g, b, nullptr);
    }
    // This panel's cell of the page, in normalised page coordinates.
    const double cw = 1.0 / columns, ch = (1.0 - band) / rows;
    const double x0 = (p % columns) * cw, y1 = 1.0 - band - (p / columns) * ch;
    plvpor(x0 + 0.17 * cw, x0 + 0.75 * cw, y1 - 0.82 * ch, y1 - 0.12 * ch);
    plwind(0, static_cast<PLFLT>(h.cols), static_cast<PLFLT>(h.rows), 0);  // row 0 on top
    for (long i = 0; i < h.rows; ++i)
      for (long j = 0; j < h.cols; ++j) {
        const std::size_t k = static_cast<std::size_t>(i * h.cols + j);
        const bool masked = !h.masked.empty() && h.masked[k];
        PLFLT xs[] = {PLFLT(j), PLFLT(j + 1), PLFLT(j + 1), PLFLT(j)}, ys[] = {PLFLT(i), PLFLT(i), PLFLT(i + 1), PLFLT(i + 1)};
        if (masked) {
          plscol0(14, 170, 170, 170);
          plcol0(14);
        } else {
          plcol1(hi > lo ? std::clamp((h.values[k] - lo) / (hi - lo), 0.0, 1.0) : 0.5);
        }
        plfill(4, xs, ys);
      }
    plcol0(15);
    // Index labels at the cells' centres (every n-th when there are many).
    plbox("bc", 0, 0, "bc", 0, 0);
    plschr(0, 0.8 * text);
    const long x_every = std::max(1L, (h.cols + 9) / 10), y_every = std::max(1L, (h.rows + 9) / 10);
    for (long j = 0; j < h.cols; j += x_every)
      plmtex("b", 1.2, (j + 0.5) / static_cast<double>(h.cols), 0.5, std::to_string(j).c_str());
    for (long i = 0; i < h.rows; i += y_every)
      plmtex("lv", 0.8, 1.0 - (i + 0.5) / static_cast<double>(h.rows), 1.0, std::to_string(i).c_str());
    plschr(0, text);
    plmtex("b", 3.0, 0.5, 0.5, h.x_label.c_str());
    plmtex("l", 3.5, 0.5, 0.5, h.y_label.c_str());
    plmtex("t", 1.2, 0.5, 0.5, h.title.c_str());
    // Colour bar: a column of the colour map with its value axis.
    plvpor(x0 + 0.79 * cw, x0 + 0.83 * cw, y1 - 0.82 * ch, y1 - 0.12 * ch);
    plwind(0, 1, lo, hi);
    const int steps = 64;
    for (int s = 0; s < steps; ++s) {
      const PLFLT a = lo + (hi - lo) * s / steps, b = lo + (hi - lo) * (s + 1) / steps;
      PLFLT xs[] = {0, 1, 1, 0}, ys[] = {a, a, b, b};
      plcol1((s + 0.5) / steps);
      plfill(4, xs, ys);
    }
    plcol0(15);
    plbox("bc", 0, 0, "bcmstv", 0, 0);
    plmtex("r", 4.5, 0.5, 0.5, h.value_label.c_str());
  }
  if (!title.empty()) {
    plvpor(0, 1, 1 - band, 1);
    plwind(0, 1, 0, 1);
    plcol0(15);
    plptex(0.5, 0.4, 1, 0, 0.5, title.c_str());
  }
  end();
}

}  // namespace tapegrad_examples
