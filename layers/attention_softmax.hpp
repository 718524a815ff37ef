// Internal: the attention core's pass from scores to weights and back, fused and parallel over
// rows. The forward is one pass over the scores: scale, add the bias, apply the mask (asked row
// by row from RowMasks, never materialised) and the softmax. The backward is one pass too: the
// two upstream gradients of the weights are added on the fly.
#pragma once

#include <cstdint>

#include "layers/attention_mask.hpp"

namespace tapegrad::detail {

// weights = masked_softmax(scale * scores + bias, masks) over the last dim. scores: [..., Q, K]
// of the weights' shape, any strides (it may be `weights` itself: rows are rewritten in
// place); bias: undefined or broadcastable to it; weights: contiguous, written whole. With
// `rounded` (float32 only), each row is also written there rounded to bfloat16
// (round_bf16_weights) while it is still in cache: the products by the weights read that copy.
void attention_softmax_forward(const Tensor& scores, double scale, const Tensor& bias, const RowMasks& masks,
                               const Tensor& weights, std::uint16_t* rounded = nullptr);

// dS = factor * A * (dA - rowsum(A * dA)) with dA = grad_a + grad_b (either may be undefined,
// both broadcast to A's shape, any strides), and dS exactly 0 wherever A is 0 (masked keys,
// empty rows), whatever dA holds there. A contiguous; returns a fresh contiguous dS, and with
// `rounded` (float32 only) writes its rows rounded to bfloat16 there too; then with keep_float
// false only there (a pass of [..., Q, K] float32 writes saved), and returns an undefined tensor.
Tensor attention_softmax_backward(const Tensor& weights, const Tensor& grad_a, const Tensor& grad_b, const RowMasks& masks,
                                  double factor, std::uint16_t* rounded = nullptr, bool keep_float = true);

}  // namespace tapegrad::detail
