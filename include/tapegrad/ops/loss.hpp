// Training losses with hand-derived backwards.
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// How per-element losses are combined: kept as they are, averaged, or summed.
enum class Reduction { none, mean, sum };

struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;  // targets equal to it add no loss and get no gradient
  double label_smoothing = 0.0;      // eps in [0, 1)
  Reduction reduction = Reduction::mean;
};

// Cross-entropy of logits [..., C] (float32 or float64) against class ids targets [...] (int64,
// logits' shape without its last dim), computed from a stable log-softmax. Per row, with
// log p = log_softmax(logits) and target t:
//   loss = (1 - eps) (-log p_t) + eps mean_c(-log p_c)          (PyTorch's label smoothing)
// Rows whose target is ignore_index have loss 0. mean divides the sum by the number of rows
// that are not ignored; when every row is ignored (or there are none) the mean is 0 with a zero
// gradient (PyTorch gives NaN). none returns the per-row losses, shape [...]. A target outside
// [0, C) that is not ignore_index is a ValueError naming it and its position.
// Backward, per row: dlogits = (softmax(logits) - q) * w with q = (1 - eps) onehot(t) + eps / C
// and w the upstream gradient (divided by the number of rows counted, for mean); ignored rows
// get exact zeros.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {});

// Squared error (pred - target)^2, elementwise, then reduced. pred and target share one floating
// dtype and one shape (no broadcasting: a target of another shape is usually a bug). The mean
// of zero elements is NaN, like mean(). Backward: dpred = 2 (pred - target) g / n (n = the
// element count for mean, 1 otherwise), dtarget = -dpred.
Tensor mse_loss(const Tensor& pred, const Tensor& target, Reduction reduction = Reduction::mean);

}  // namespace tapegrad
