// The position-wise feed-forward network of a transformer block.
#pragma once

#include <cstdint>
#include <optional>

#include "tapegrad/layers/dropout.hpp"
#include "tapegrad/layers/linear.hpp"
#include "tapegrad/layers/module.hpp"

namespace tapegrad {

// swiglu: the gated unit of Llama (Shazeer 2020), silu(x W_gate) * (x W_up), then W_down.
enum class Activation { gelu, relu, swiglu };

struct FeedForwardConfig {
  std::int64_t dim = 0;  // required, >= 1
  // 0 means 4 * dim, or with swiglu 8 * dim / 3 rounded up to a multiple of multiple_of (Llama's
  // rule: three matrices of that width hold about as many weights as two of 4 * dim).
  std::int64_t hidden = 0;
  Activation activation = Activation::gelu;
  double dropout = 0.0;  // applied to the output
  bool bias = true;
  DType dtype = float32;
  std::uint64_t seed = 0;
  // >= 1. Llama rounds to 256 for its dims of 4096 and more; 8 keeps a small model's width
  // within a few percent of 8 * dim / 3 (dim 64: 176 for 170) while every row stays a whole
  // number of 8-float vectors.
  std::int64_t multiple_of = 8;
};

// y = dropout(act(x W1 + b1) W2 + b2), x [..., dim] -> [..., dim]; with swiglu
// y = dropout(down(silu(gate(x)) * up(x))) (Llama's w2(silu(w1 x) * w3 x): gate = w1, up = w3,
// down = w2).
class FeedForward : public Module {
 public:
  explicit FeedForward(const FeedForwardConfig& config);
  Tensor forward(const Tensor& x) const;
  // "up", then "gate" with swiglu, then "down" (each "weight" and, with config.bias, "bias").
  void visit(ModuleVisitor& v) override;
  Linear up, down;
  Dropout drop;
  std::optional<Linear> gate;  // swiglu only

 private:
  Activation activation_;
};

}  // namespace tapegrad
