// Figures for the examples, drawn with PLplot (Debian's libplplot-dev, PNG through its cairo
// driver): line plots with axes, labels and a legend, and heatmaps with a colour bar.
#pragma once

#include <string>
#include <vector>

namespace tapegrad_examples {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_y = false;  // plot log10(y) (for losses spanning decades); y must be > 0
};

// A matrix as coloured cells, row 0 at the top. Cells with masked[i] true are drawn in grey,
// so a masked cell is never confused with a zero.
struct Heatmap {
  std::string title, x_label, y_label, value_label;
  long rows = 0, cols = 0;
  std::vector<double> values;  // row-major, rows * cols
  std::vector<bool> masked;    // empty, or rows * cols
  bool diverging = false;      // blue-white-red, symmetric around 0 (for gradients)
};

// One head's causal attention weights [t, t] (row-major) as a heatmap, future keys masked.
Heatmap causal_attention_map(std::string title, std::vector<double> weights, long t);

// Writes a PNG; throws std::runtime_error when the file cannot be written.
void plot_lines(const std::string& path, const LinePlot& plot);
// Several heatmaps side by side in one PNG, with an overall title.
void plot_heatmaps(const std::string& path, const std::string& title, const std::vector<Heatmap>& panels);

}  // namespace tapegrad_examples
