// Rotary position embeddings (RoPE, Su et al. 2021): pairs of channels rotated by an angle that
// grows with the position, so that a query-key product depends on their positions' difference.
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Which channels form the rotated pairs (r = rotary_dim):
//   half_split:  (i, i + r/2), as GPT-NeoX and Llama;
//   interleaved: (2i, 2i + 1), as GPT-J.
enum class RotaryLayout { half_split, interleaved };

struct RotaryOptions {
  double base = 10000.0;          // finite, > 0
  std::int64_t rotary_dim = 0;    // r: the first r channels rotate, the rest pass through; 0 means all D
  RotaryLayout layout = RotaryLayout::half_split;
};

// x [..., L, D] (floating, rank >= 2), positions int64 [L]: row l of every leading index sits at
// position positions[l] (absolute: a decode step passes its offset). Pair i of row l turns by
//   theta = positions[l] * base^(-2i / r),   i = 0 .. r/2 - 1,
//   (a, b) -> (a cos theta - b sin theta, a sin theta + b cos theta),
// cos and sin computed in double and rounded to x's dtype once; the products and sums run in
// x's dtype. r must be even and <= D. Positions may be negative (a turn the other way); |p|
// must be at most 2^53, where every integer is still a double. Backward: dx = R^T g, the same
// rotation by -theta (recorded as an op itself, so it differentiates to every order).
Tensor rotary(const Tensor& x, const Tensor& positions, const RotaryOptions& options = {});

}  // namespace tapegrad
