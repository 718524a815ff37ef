// The causal prefix-averaging experiment (docs/semantics.md §8), through tapegrad's public
// functions.
//
// Six scalar values, all query and key vectors zero, a causal mask. Every allowed score is equal,
// so query i averages v[0..i]: its output is the prefix mean. Raising every future value
// (j > i) by 1000 must leave output i unchanged: the future leakage is exactly 0.
//
// Exits non-zero unless the leakage is exactly 0 and every mean matches.
#include <cmath>
#include <cstdio>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;
using tg::Tensor;

namespace {

constexpr std::int64_t kN = 6;

// Output of the experiment for values v: causal attention with zero queries and keys.
tg::AttentionResult run(const std::vector<double>& v) {
  const Tensor zeros = tg::zeros({kN, 4}, tg::float64);  // queries and keys, D = 4
  return tg::scaled_dot_product_attention(zeros, zeros, tg::from_vector(v, {kN, 1}), tg::causal_mask(kN, kN));
}

// A weight in [0, 1] as a background colour (white for 0, deep blue for 1) when stdout is a
// terminal; plain numbers otherwise.
std::string cell(double w, bool colour) {
  const std::string number = fmt::format("{:7.4f}", w);
  if (!colour) return number + " ";
  const int level = static_cast<int>(std::lround(255 - 200 * w));
  const int ink = w > 0.45 ? 255 : 0;
  return fmt::format("\x1b[48;2;{};{};255m\x1b[38;2;{};{};{}m{}\x1b[0m ", level, level, ink, ink, ink, number);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  bool force_colour = false;
  CLI::App app{"prefix_average: causal attention computes prefix means, and nothing leaks from the future"};
  app.add_flag("--color", force_colour, "colour the weights even when not writing to a terminal");
  app.add_option("--threads", threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tg::set_num_threads(threads);
  fmt::print("prefix_average: {} thread(s) (--threads N to choose)\n", tg::num_threads());
  const bool colour = isatty(fileno(stdout)) != 0 || force_colour;
  const std::vector<double> v{3, -1, 4, 1, -5, 9};
  auto [out, weights] = run(v);
  const auto w = weights.to_vector<double>();
  const auto y = out.to_vector<double>();

  fmt::print("values v = [{}]\n\nattention weights (row i = query i, column j = key j; causal: j <= i):\n",
             fmt::join(v, ", "));
  for (std::int64_t i = 0; i < kN; ++i) {
    fmt::print("  q{} ", i);
    for (std::int64_t j = 0; j < kN; ++j) fmt::print("{}", cell(w[static_cast<std::size_t>(i * kN + j)], colour));
    fmt::print("\n");
  }

  bool means_ok = true;
  double sum = 0;
  fmt::print("\n  i   output      prefix mean   |difference|\n");
  for (std::int64_t i = 0; i < kN; ++i) {
    sum += v[static_cast<std::size_t>(i)];
    const double expected = sum / static_cast<double>(i + 1);
    const double diff = std::abs(y[static_cast<std::size_t>(i)] - expected);
    means_ok = means_ok && diff <= 1e-12;
    fmt::print("  {}   {:+.9f}  {:+.9f}  {:.1e}\n", i, y[static_cast<std::size_t>(i)], expected, diff);
  }

  // Future leakage: for each i, raise every v[j], j > i, by 1000; output i must not move.
  double leakage = 0;
  for (std::int64_t i = 0; i < kN; ++i) {
    std::vector<double> raised = v;
    for (std::int64_t j = i + 1; j < kN; ++j) raised[static_cast<std::size_t>(j)] += 1000;
    const double moved = std::abs(run(raised).output.to_vector<double>()[static_cast<std::size_t>(i)] - y[static_cast<std::size_t>(i)]);
    leakage = std::max(leakage, moved);
  }
  fmt::print("\nfuture leakage (largest change of output i when every v[j > i] rises by 1000): {}\n", leakage);

  const bool ok = leakage == 0.0 && means_ok;
  fmt::print("{}\n", ok ? "OK: outputs are the prefix means and nothing leaks from the future"
                        : "FAILED: the causal prefix average does not hold");
  return ok ? 0 : 1;
}
