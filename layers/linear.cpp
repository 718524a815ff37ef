// Linear: y = x W + b, the linear() op (one node: dW = x^T dy summed over the leading dims,
// db = dy summed over them, dx = dy W^T).
#include "tapegrad/layers/linear.hpp"

#include <cmath>

#include "layers/layer_support.hpp"
#include "tapegrad/ops/linear.hpp"

namespace tapegrad {
namespace {

const LinearConfig& checked(const LinearConfig& c) {
  detail::check_field("Linear", "in", c.in);
  detail::check_field("Linear", "out", c.out);
  detail::check_float_dtype("Linear", c.dtype);
  detail::checked_product("Linear", "in", c.in, "out", c.out);
  return c;
}

}  // namespace

Linear::Linear(const LinearConfig& config) : config_(checked(config)) {
  Generator gen(config_.seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(config_.in));
  weight = rand({config_.in, config_.out}, gen, config_.dtype, -bound, bound).set_requires_grad();
  if (config_.bias) bias = rand({config_.out}, gen, config_.dtype, -bound, bound).set_requires_grad();
}

Tensor Linear::forward(const Tensor& x) const {
  detail::check_layer_input("Linear::forward", x, "in", config_.in, config_.dtype);
  return linear(x, weight, bias);
}

void Linear::visit(ModuleVisitor& v) {
  v.parameter("weight", weight);
  if (bias.defined()) v.parameter("bias", bias);
}

}  // namespace tapegrad
