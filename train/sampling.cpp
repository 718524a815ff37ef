// Greedy, temperature, top-k and top-p sampling over a model's logits (see sampling.hpp).
#include "tapegrad/train/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "autodiff/check.hpp"

namespace tapegrad {
namespace {
using detail::fail;

// The token of one row. The candidates are walked most likely first, ties by the lowest id, so
// a draw is the same whatever the sort's implementation.
std::int64_t pick(std::span<const double> row, const SampleOptions& o, Generator& gen) {
  if (o.temperature == 0) return std::max_element(row.begin(), row.end()) - row.begin();
  std::vector<std::int64_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return row[a] > row[b]; });
  // Top-k, ties at the k-th kept: the sorted prefix of logits >= the k-th largest.
  std::size_t kept = order.size();
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < kept) {
    const double kth = row[order[o.top_k - 1]];
    kept = static_cast<std::size_t>(std::partition_point(order.begin(), order.end(), [&](auto i) { return row[i] >= kth; }) - order.begin());
  }
  const double top = row[order[0]];
  std::vector<double> weight;
  double z = 0;
  for (std::size_t i = 0; i < kept; ++i) {
    const double w = std::exp((row[order[i]] - top) / o.temperature);
    if (w == 0) break;  // -inf, or too unlikely to be represented: never drawn
    weight.push_back(w);
    z += w;
  }
  // Top-p: the tokens before which the more likely ones hold less than top_p of the mass.
  if (o.top_p < 1) {
    double before = 0;
    std::size_t n = 0;
    while (n < weight.size() && before < o.top_p * z) before += weight[n++];
    weight.resize(n);
    z = before;
  }
  double u = gen.uniform() * z;
  for (std::size_t i = 0; i < weight.size(); ++i)
    if ((u -= weight[i]) < 0) return order[i];
  return order[weight.size() - 1];  // u landed on the rounding error at the end
}

}  // namespace

void check_sample_options(const char* fn, const SampleOptions& o) {
  if (fn == nullptr) fn = "check_sample_options";
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    fail<ValueError>("{}: options.temperature must be finite and >= 0 (0: greedy), got {}", fn, o.temperature);
  if (o.top_k < 0) fail<ValueError>("{}: options.top_k must be >= 0 (0: off), got {}", fn, o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1)) fail<ValueError>("{}: options.top_p must be in (0, 1] (1: off), got {}", fn, o.top_p);
}

Tensor sample(const Tensor& logits, const SampleOptions& options, Generator& gen) {
  const char* fn = "sample";
  detail::check_floating(fn, "logits", logits);
  if (logits.dim() != 1 && logits.dim() != 2)
    fail<ShapeError>("{}: argument 'logits' must be [V] or [B, V], got shape {}", fn, detail::shape_str(logits.shape()));
  const std::int64_t vocab = logits.size(-1), rows = logits.dim() == 2 ? logits.size(0) : 1;
  if (vocab < 1) fail<ShapeError>("{}: argument 'logits' must hold at least one token (V >= 1), got shape {}", fn, detail::shape_str(logits.shape()));
  check_sample_options(fn, options);
  const std::vector<double> values = logits.to_vector<double>();
  std::vector<std::int64_t> ids(static_cast<std::size_t>(rows));
  for (std::int64_t b = 0; b < rows; ++b) {
    const std::span<const double> row(values.data() + b * vocab, static_cast<std::size_t>(vocab));
    for (std::int64_t v = 0; v < vocab; ++v)
      if (std::isnan(row[v]) || row[v] == INFINITY)
        fail<ValueError>("{}: argument 'logits' holds {} at row {}, token {}; logits must be finite or -inf", fn, row[v], b, v);
    if (std::none_of(row.begin(), row.end(), [](double x) { return std::isfinite(x); }))
      fail<ValueError>("{}: row {} of argument 'logits' is -inf everywhere; a row needs a finite logit to draw from", fn, b);
    ids[b] = pick(row, options, gen);
  }
  return from_vector(ids, logits.dim() == 2 ? Shape{rows} : Shape{});
}

}  // namespace tapegrad
