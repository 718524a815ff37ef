// Internal: multihead_attention's projections, each one tape node (multihead_attention_projections.cpp).
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// Steps 1-2: x [B, L, C] w [C, H*W] (+ b [H*W]), returned as [B, H, L, W], a view of the
// [B, L, H*W] product. Follows the matmul precision.
Tensor project_heads(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, std::int64_t heads);
// Step 6: o [B, H, Q, Dv] with its heads concatenated, times w [H*Dv, Cout] (+ b [Cout]): [B, Q, Cout].
Tensor merge_heads_project(const char* op, const Tensor& o, const Tensor& w, const Tensor& b);

}  // namespace tapegrad::detail
