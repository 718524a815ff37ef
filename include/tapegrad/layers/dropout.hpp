// Dropout as a layer: the dropout op with a generator of its own and the module's mode.
#pragma once

#include <cstdint>

#include "tapegrad/layers/module.hpp"

namespace tapegrad {

// Zeroes each element with probability p and scales the rest by 1/(1-p) in training mode; the
// identity in evaluation mode. Draws from its own generator, seeded at construction, so two runs
// with the same seeds drop the same elements.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0, std::uint64_t seed = 0);
  Tensor forward(const Tensor& x) const;
  void visit(ModuleVisitor& v) override { v.generator("generator", gen_); }
  double p() const noexcept { return p_; }

 private:
  double p_;
  mutable Generator gen_;  // forward advances it: the one state a forward changes
};

}  // namespace tapegrad
