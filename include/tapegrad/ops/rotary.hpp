// Rotary position embeddings (RoPE, Su et al. 2021): pairs of channels rotated by an angle that
// grows with the position, so that a query-key product depends on their positions' difference.
#pragma once

#include <cstdint>
#include <string_view>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Which channels form the rotated pairs (r = rotary_dim):
//   half_split:  (i, i + r/2), as GPT-NeoX and Llama;
//   interleaved: (2i, 2i + 1), as GPT-J.
enum class RotaryLayout { half_split, interleaved };

struct RotaryOptions {
  double base = 10000.0;          // finite, >= 1
  std::int64_t rotary_dim = 0;    // r: the first r channels rotate, the rest pass through; 0 means all D
  RotaryLayout layout = RotaryLayout::half_split;
};

// x [..., L, D] (floating, rank >= 2), positions int64 [L]: row l of every leading index sits at
// position positions[l] (absolute: a decode step passes its offset). Pair i of row l turns by
//   theta = positions[l] * base^(-2i / r),   i = 0 .. r/2 - 1,
//   (a, b) -> (a cos theta - b sin theta, a sin theta + b cos theta),
// cos and sin computed in double and rounded to x's dtype once; the products and sums run in
// x's dtype. r must be even and <= D. Positions may be negative (a turn the other way); |p|
// must be at most 2^53, where every integer is still a double. base >= 1 keeps every frequency in
// (0, 1], so every angle is finite and so is every output of a finite row. Backward: dx = R^T g,
// the same rotation by -theta (recorded as an op itself, so it differentiates to every order).
Tensor rotary(const Tensor& x, const Tensor& positions, const RotaryOptions& options = {});

// The one rule for RotaryOptions, shared by rotary() and the configs that hold them: base finite
// and >= 1, rotary_dim even and in [0, width] (0 means width). Returns r, the rotated width.
// Throws ValueError "<who>: <name>.base ..." where `width_name` says what the rows' width is
// called there ("D", "config.head_dim") and `context` ends the message.
std::int64_t check_rotary_options(const RotaryOptions& options, std::int64_t width, std::string_view who = "rotary",
                                  std::string_view name = "options", std::string_view width_name = "D",
                                  std::string_view context = "");

}  // namespace tapegrad
