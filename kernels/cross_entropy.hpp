// Internal: cross_entropy's row kernels (cross_entropy.cpp), which the cross_entropy op calls.
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// The targets' rule: a row whose class id is ignore_index adds no loss and gets no gradient;
// eps = label_smoothing spreads that much of the target over all C classes.
struct TargetRule {
  std::int64_t ignore_index = 0;
  double label_smoothing = 0;
};

// Per row, what the forward computed: the maximum m and log Z = log sum_c exp(s_c - m), so that
// the backward's p_c = exp((s_c - m) - log Z) subtracts the large terms first.
struct RowLse {
  double m = 0, log_z = 0;
};

// For each row r of logits [..., C] (any strides) and its class ids[r] (targets: int64, contiguous,
// the logits' shape without C): loss[r] = (1 - eps)(lse - s_t) + eps mean_c(lse - s_c), 0 where
// ignored, and lse[r]. Records nothing.
void cross_entropy_rows(const Tensor& logits, const Tensor& targets, const TargetRule& rule, double* loss, RowLse* lse);

// A fresh contiguous dlogits = (p - q) w_r per counted row, p = softmax(s) from lse, q the
// smoothed one-hot of its class, w_r = w[r] (per_row) or w[0]; exact zeros on ignored rows.
// Records nothing.
Tensor cross_entropy_rows_backward(const Tensor& logits, const Tensor& targets, const TargetRule& rule, const RowLse* lse,
                                   const double* w, bool per_row);

}  // namespace tapegrad::detail
