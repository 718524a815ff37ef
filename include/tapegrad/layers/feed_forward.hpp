// The pieces of a transformer block besides attention: Dropout and the position-wise
// feed-forward network.
#pragma once

#include <cstdint>

#include "tapegrad/layers/linear.hpp"
#include "tapegrad/layers/module.hpp"

namespace tapegrad {

// Zeroes each element with probability p and scales the rest by 1/(1-p) in training mode; the
// identity in evaluation mode. Draws from its own generator, seeded at construction, so two runs
// with the same seeds drop the same elements.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0, std::uint64_t seed = 0);
  Tensor forward(const Tensor& x) const;
  void visit(ModuleVisitor&) override {}
  double p() const noexcept { return p_; }

 private:
  double p_;
  mutable Generator gen_;  // forward advances it: the one state a forward changes
};

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
