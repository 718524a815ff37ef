// Position information added to token embeddings: learned (a trained table) or sinusoidal (a
// fixed table, Vaswani et al. 2017). forward(x, offset) adds rows offset .. offset + T - 1 of
// the table to x [B, T, dim]; a decoder passes the KV cache's length as the offset.
#pragma once

#include <cstdint>

#include "tapegrad/layers/module.hpp"

namespace tapegrad {

struct PositionsConfig {
  std::int64_t max_len = 0;  // required, >= 1: positions 0 .. max_len - 1
  std::int64_t dim = 0;      // required, >= 1
  DType dtype = float32;
  std::uint64_t seed = 0;  // learned positions only
};

// table ~ N(0, 0.02^2), a parameter (GPT-2's initialisation).
class LearnedPositions : public Module {
 public:
  explicit LearnedPositions(const PositionsConfig& config);
  Tensor forward(const Tensor& x, std::int64_t offset = 0) const;
  void visit(ModuleVisitor& v) override { v.parameter("table", table); }
  Tensor table;  // [max_len, dim]

 private:
  PositionsConfig config_;
};

// table[p, 2i] = sin(p / 10000^(2i/dim)), table[p, 2i+1] = cos(p / 10000^(2i/dim)); no parameters.
class SinusoidalPositions : public Module {
 public:
  explicit SinusoidalPositions(const PositionsConfig& config);
  Tensor forward(const Tensor& x, std::int64_t offset = 0) const;
  void visit(ModuleVisitor&) override {}
  Tensor table;  // [max_len, dim], constant

 private:
  PositionsConfig config_;
};

}  // namespace tapegrad
