#include "support/terminal_heatmap.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/core.h>

namespace tapegrad_examples {
namespace {

constexpr int kCell = 7;  // characters per cell

using Rgb = std::array<int, 3>;

Rgb mix(Rgb a, Rgb b, double t) {
  Rgb c{};
  for (int i = 0; i < 3; ++i) c[i] = static_cast<int>(std::lround(a[i] + (b[i] - a[i]) * t));
  return c;
}

// The same colour maps as the PNG heatmaps of plot.cpp.
Rgb colour_of(double v, const TextHeatmap& m) {
  const double t = m.scale > 0 ? std::clamp(v / m.scale, -1.0, 1.0) : 0.0;
  if (!m.diverging) return mix({255, 255, 255}, {13, 51, 140}, std::max(t, 0.0));
  return t < 0 ? mix({255, 255, 255}, {26, 77, 204}, -t) : mix({255, 255, 255}, {204, 26, 26}, t);
}

std::string painted(const std::string& text, Rgb bg, bool colour) {
  if (!colour) return text;
  const bool dark = 0.299 * bg[0] + 0.587 * bg[1] + 0.114 * bg[2] < 140;
  const int ink = dark ? 255 : 0;
  return fmt::format("\x1b[48;2;{};{};{}m\x1b[38;2;{};{};{}m{}\x1b[0m", bg[0], bg[1], bg[2], ink, ink, ink, text);
}

// Exact zeros print as a bare 0, so that they stand apart from small values (shown as 3e-05).
std::string number(double v) {
  if (v == 0) return fmt::format("{:>{}}", "0", kCell);
  const std::string fixed = fmt::format("{:{}.3f}", v, kCell);
  return std::abs(v) < 0.0005 ? fmt::format("{:{}.0e}", v, kCell) : fixed;
}

std::string cell(const TextHeatmap& m, long i, long j, bool colour) {
  const auto e = static_cast<std::size_t>(i * m.cols + j);
  if (!m.masked.empty() && m.masked[e]) return painted("   ·   ", {190, 190, 190}, colour);
  return painted(number(m.values[e]), colour_of(m.values[e], m), colour);
}

}  // namespace

void print_text_heatmaps(const std::vector<TextHeatmap>& maps, bool colour, bool legend) {
  if (maps.empty()) return;
  const long rows = maps.front().rows;
  const std::string gap = "   ";
  std::string line;
  for (const auto& m : maps) line += fmt::format("{:<{}}", m.title, 4 + kCell * m.cols) + gap;
  fmt::print("    {}\n    ", line);
  for (const auto& m : maps) {
    std::string head = "    ";
    for (long j = 0; j < m.cols; ++j) head += fmt::format("{:>{}}", fmt::format("k{}", j), kCell);
    fmt::print("{}{}", head, gap);
  }
  fmt::print("\n");
  for (long i = 0; i < rows; ++i) {
    fmt::print("    ");
    for (const auto& m : maps) {
      std::string text = fmt::format("{:>3} ", fmt::format("q{}", i));
      for (long j = 0; j < m.cols; ++j) text += cell(m, i, j, colour);
      fmt::print("{}{}", text, gap);
    }
    const auto& notes = maps.back().row_notes;
    if (!notes.empty() && !notes[static_cast<std::size_t>(i)].empty()) fmt::print("<- {}", notes[static_cast<std::size_t>(i)]);
    fmt::print("\n");
  }
  if (!legend) return;
  // One legend line per colour scale.
  std::vector<std::pair<const TextHeatmap*, std::string>> scales;
  for (const auto& m : maps) {
    auto same = std::find_if(scales.begin(), scales.end(),
                             [&](const auto& s) { return s.first->diverging == m.diverging && s.first->scale == m.scale; });
    const std::string& name = m.legend.empty() ? m.title : m.legend;
    if (same == scales.end()) scales.emplace_back(&m, name);
    else same->second += ", " + name;
  }
  for (const auto& [m, titles] : scales) {
    const double lo = m->diverging ? -m->scale : 0.0;
    std::string ramp;
    for (int s = 0; s <= 12; ++s) ramp += painted("  ", colour_of(lo + (m->scale - lo) * s / 12.0, *m), colour);
    fmt::print("    legend {}: {:.3g} {} {:.3g}\n", titles, lo, colour ? ramp : std::string("to"), m->scale);
  }
  fmt::print("    {} = masked (not allowed, no number); 0 = exactly zero; 4e-05 = small but not zero\n",
             painted("   ·   ", {190, 190, 190}, colour));
}

}  // namespace tapegrad_examples
