// The position-wise feed-forward network of a transformer block.
#pragma once

#include <cstdint>

#include "tapegrad/layers/dropout.hpp"
#include "tapegrad/layers/linear.hpp"
#include "tapegrad/layers/module.hpp"

namespace tapegrad {

enum class Activation { gelu, relu };

struct FeedForwardConfig {
  std::int64_t dim = 0;     // required, >= 1
  std::int64_t hidden = 0;  // 0 means 4 * dim
  Activation activation = Activation::gelu;
  double dropout = 0.0;  // applied to the output
  bool bias = true;
  DType dtype = float32;
  std::uint64_t seed = 0;
};

// y = dropout(act(x W1 + b1) W2 + b2), x [..., dim] -> [..., dim]
class FeedForward : public Module {
 public:
  explicit FeedForward(const FeedForwardConfig& config);
  Tensor forward(const Tensor& x) const;
  void visit(ModuleVisitor& v) override;
  Linear up, down;
  Dropout drop;

 private:
  Activation activation_;
};

}  // namespace tapegrad
