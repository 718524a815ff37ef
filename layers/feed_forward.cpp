// The feed-forward network: linear, GELU (or ReLU), linear, dropout; its backward is its ops'.
#include "tapegrad/layers/feed_forward.hpp"

#include "layers/layer_support.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad {
namespace {

// Validates the config and returns the hidden width (0 means 4 * dim).
std::int64_t hidden_of(const FeedForwardConfig& c) {
  detail::check_field("FeedForward", "dim", c.dim);
  detail::check_field("FeedForward", "hidden", c.hidden, 0);
  detail::check_float_dtype("FeedForward", c.dtype);
  if (c.hidden == 0 && c.dim > INT64_MAX / 4)
    detail::fail<ValueError>("FeedForward: the default hidden width 4 * config.dim = 4 * {} overflows; give config.hidden", c.dim);
  return c.hidden == 0 ? 4 * c.dim : c.hidden;
}

}  // namespace

FeedForward::FeedForward(const FeedForwardConfig& c)
    : up({.in = c.dim, .out = hidden_of(c), .bias = c.bias, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 0)}),
      down({.in = up.config().out, .out = c.dim, .bias = c.bias, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 1)}),
      drop(c.dropout, detail::child_seed(c.seed, 2)),
      activation_(c.activation) {}

Tensor FeedForward::forward(const Tensor& x) const {
  const Tensor h = up.forward(x);
  return drop.forward(down.forward(activation_ == Activation::gelu ? gelu(h) : relu(h)));
}

void FeedForward::visit(ModuleVisitor& v) {
  v.module("up", up);
  v.module("down", down);
  v.module("drop", drop);
}

}  // namespace tapegrad
