// Internal: the attention core's pass from scores to weights and back, fused and parallel over
// rows. The forward is one pass over the scores: scale, add the bias, apply the mask (asked row
// by row from RowMasks, never materialised) and the softmax. The backward is one pass too: the
// two upstream gradients of the weights are added on the fly.
#pragma once

#include "layers/attention_mask.hpp"

namespace tapegrad::detail {

// weights = masked_softmax(scale * scores + bias, masks) over the last dim. scores: [..., Q, K]
// of the weights' shape, any strides (it may be `weights` itself: rows are rewritten in
// place); bias: undefined or broadcastable to it; weights: contiguous, written whole.
void attention_softmax_forward(const Tensor& scores, double scale, const Tensor& bias, const RowMasks& masks,
                               const Tensor& weights);

// dS = factor * A * (dA - rowsum(A * dA)) with dA = grad_a + grad_b (either may be undefined,
// both broadcast to A's shape, any strides), and dS exactly 0 wherever A is 0 (masked keys,
// empty rows), whatever dA holds there. A contiguous; returns a fresh contiguous dS.
Tensor attention_softmax_backward(const Tensor& weights, const Tensor& grad_a, const Tensor& grad_b, const RowMasks& masks,
                                  double factor);

}  // namespace tapegrad::detail
