// Learned and sinusoidal positions. Adding a slice of the table is add's and slice's backward:
// the table's gradient is the upstream gradient summed over the batch, in the rows used.
#include "tapegrad/layers/positions.hpp"

#include <cmath>
#include <vector>

#include "layers/layer_support.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {

const PositionsConfig& checked(const char* layer, const PositionsConfig& c) {
  detail::check_field(layer, "max_len", c.max_len);
  detail::check_field(layer, "dim", c.dim);
  detail::check_float_dtype(layer, c.dtype);
  detail::checked_product(layer, "max_len", c.max_len, "dim", c.dim);
  detail::check_config_shape(layer, "the table [config.max_len, config.dim]", {c.max_len, c.dim}, c.dtype);
  return c;
}

Tensor add_rows(const char* op, const Tensor& x, const Tensor& table, const PositionsConfig& c, std::int64_t offset) {
  detail::check_floating(op, "x", x);
  if (x.dim() != 3 || x.size(2) != c.dim)
    detail::fail<ShapeError>("{}: argument 'x' must be [B, T, {}] (config.dim), got shape {}", op, c.dim, detail::shape_str(x.shape()));
  if (x.dtype() != c.dtype)
    detail::fail<DTypeError>("{}: argument 'x' is {} but the table is {} (config.dtype)", op, x.dtype(), c.dtype);
  if (offset < 0 || offset > c.max_len || x.size(1) > c.max_len - offset)
    // The message names offset and T, not offset + T - 1: for an offset near INT64_MAX that sum overflows.
    detail::fail<ShapeError>("{}: the T = {} positions from offset {} must lie in [0, {}) (config.max_len)", op, x.size(1), offset,
                             c.max_len);
  return x + slice(table, 0, offset, offset + x.size(1));
}

}  // namespace

LearnedPositions::LearnedPositions(const PositionsConfig& config) : config_(checked("LearnedPositions", config)) {
  table = (randn({config_.max_len, config_.dim}, config_.seed, config_.dtype) * 0.02).detach().set_requires_grad();
}

Tensor LearnedPositions::forward(const Tensor& x, std::int64_t offset) const {
  return add_rows("LearnedPositions::forward", x, table, config_, offset);
}

SinusoidalPositions::SinusoidalPositions(const PositionsConfig& config) : config_(checked("SinusoidalPositions", config)) {
  std::vector<double> values(static_cast<std::size_t>(config_.max_len * config_.dim));
  for (std::int64_t p = 0; p < config_.max_len; ++p)
    for (std::int64_t i = 0; i < config_.dim; ++i) {
      const double angle = static_cast<double>(p) / std::pow(10000.0, static_cast<double>(i - i % 2) / static_cast<double>(config_.dim));
      values[static_cast<std::size_t>(p * config_.dim + i)] = i % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  table = from_vector(values, {config_.max_len, config_.dim}).to(config_.dtype);
}

Tensor SinusoidalPositions::forward(const Tensor& x, std::int64_t offset) const {
  return add_rows("SinusoidalPositions::forward", x, table, config_, offset);
}

}  // namespace tapegrad
