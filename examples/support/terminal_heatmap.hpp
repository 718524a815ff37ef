// Matrices as coloured cells in a terminal (24-bit ANSI backgrounds), side by side, with a
// legend. Masked cells are a dot on grey, never a number, so they cannot be mistaken for zeros.
// Without colour the same layout prints the numbers alone.
#pragma once

#include <string>
#include <vector>

namespace tapegrad_examples {

struct TextHeatmap {
  std::string title;
  long rows = 0, cols = 0;
  std::vector<double> values;          // row-major, rows * cols
  std::vector<bool> masked;            // empty, or rows * cols
  bool diverging = false;              // blue-white-red around 0; otherwise white to dark blue
  double scale = 1;                    // |value| at full colour (the legend's end)
  std::vector<std::string> row_notes;  // empty, or one per row, printed after the last map
  std::string legend;                  // the map's name in the legend (the title when empty)
};

// Prints the maps next to each other (they must have the same number of rows), row i labelled
// q<i> and column j labelled k<j>, then (with `legend`) one legend line per distinct colour scale.
void print_text_heatmaps(const std::vector<TextHeatmap>& maps, bool colour, bool legend = true);

}  // namespace tapegrad_examples
