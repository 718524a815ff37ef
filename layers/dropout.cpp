// The Dropout layer: the dropout op, in training mode only.
#include "tapegrad/layers/dropout.hpp"

#include "layers/layer_support.hpp"
#include "tapegrad/ops/dropout.hpp"

namespace tapegrad {

Dropout::Dropout(double p, std::uint64_t seed) : p_(p), gen_(seed) {
  if (!(p >= 0 && p < 1)) detail::fail<ValueError>("Dropout: p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p_, gen_, is_training()); }

}  // namespace tapegrad
