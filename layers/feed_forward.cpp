// Dropout and the feed-forward network; their backward passes are those of the ops they use.
#include "tapegrad/layers/feed_forward.hpp"

#include <cmath>

#include "layers/layer_support.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/dropout.hpp"

namespace tapegrad {
namespace {

// Validates the config and returns the hidden width (0 means 4 * dim).
std::int64_t hidden_of(const FeedForwardConfig& c) {
  detail::check_field("FeedForward", "dim", c.dim);
  detail::check_field("FeedForward", "hidden", c.hidden, 0);
  detail::check_float_dtype("FeedForward", c.dtype);
  return c.hidden == 0 ? detail::checked_product("FeedForward", "dim", c.dim, "4 (the default hidden width)", 4) : c.hidden;
}

}  // namespace

Dropout::Dropout(double p, std::uint64_t seed) : p_(p), gen_(seed) {
  if (!(p >= 0 && p < 1)) detail::fail<ValueError>("Dropout: p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p_, gen_, is_training()); }

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
