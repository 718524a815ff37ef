// Linear: y = x W + b, with W stored [in, out] (the same orientation as attention's w_q).
#pragma once

#include <cstdint>

#include "tapegrad/layers/module.hpp"

namespace tapegrad {

struct LinearConfig {
  std::int64_t in = 0;   // required, >= 1
  std::int64_t out = 0;  // required, >= 1
  bool bias = true;
  DType dtype = float32;
  std::uint64_t seed = 0;
};

class Linear : public Module {
 public:
  // weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) from Generator(seed) (PyTorch's default for
  // nn.Linear), weight first. Both require grad.
  explicit Linear(const LinearConfig& config);
  // x [..., in] -> [..., out]
  Tensor forward(const Tensor& x) const;
  void visit(ModuleVisitor& v) override;
  const LinearConfig& config() const noexcept { return config_; }

  Tensor weight;  // [in, out]
  Tensor bias;    // [out], undefined without bias

 private:
  LinearConfig config_;
};

}  // namespace tapegrad
