// The feed-forward network: linear, GELU (or ReLU), linear, dropout, or the SwiGLU form with a
// gating linear; its backward is its ops'.
#include "tapegrad/layers/feed_forward.hpp"

#include "layers/layer_support.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad {
namespace {

// Validates the config and returns the hidden width (0: 4 * dim, or swiglu's 8 * dim / 3 rounded
// up to a multiple of multiple_of).
std::int64_t hidden_of(const FeedForwardConfig& c) {
  detail::check_field("FeedForward", "dim", c.dim);
  detail::check_field("FeedForward", "hidden", c.hidden, 0);
  detail::check_field("FeedForward", "multiple_of", c.multiple_of);
  detail::check_float_dtype("FeedForward", c.dtype);
  detail::check_activation("FeedForward", c.activation);
  if (c.hidden != 0) return c.hidden;
  const bool gated = c.activation == Activation::swiglu;
  if (c.dim > (gated ? (INT64_MAX - c.multiple_of) / 8 : INT64_MAX / 4))
    detail::fail<ValueError>("FeedForward: the default hidden width {} with config.dim = {} overflows; give config.hidden",
                             gated ? "8 * config.dim / 3" : "4 * config.dim", c.dim);
  if (!gated) return 4 * c.dim;
  const std::int64_t h = 8 * c.dim / 3;
  return (h + c.multiple_of - 1) / c.multiple_of * c.multiple_of;
}

std::optional<Linear> gate_of(const FeedForwardConfig& c, std::int64_t hidden) {
  if (c.activation != Activation::swiglu) return std::nullopt;
  return Linear({.in = c.dim, .out = hidden, .bias = c.bias, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 3)});
}

}  // namespace

FeedForward::FeedForward(const FeedForwardConfig& c)
    : up({.in = c.dim, .out = hidden_of(c), .bias = c.bias, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 0)}),
      down({.in = up.config().out, .out = c.dim, .bias = c.bias, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 1)}),
      drop(c.dropout, detail::child_seed(c.seed, 2)),
      gate(gate_of(c, up.config().out)),
      activation_(c.activation) {}

Tensor FeedForward::forward(const Tensor& x) const {
  const Tensor h = up.forward(x);
  if (activation_ == Activation::swiglu) return drop.forward(down.forward(silu(gate->forward(x)) * h));
  return drop.forward(down.forward(activation_ == Activation::gelu ? gelu(h) : relu(h)));
}

void FeedForward::visit(ModuleVisitor& v) {
  v.module("up", up);
  if (gate) v.module("gate", *gate);
  v.module("down", down);
  v.module("drop", drop);
}

}  // namespace tapegrad
