// Internal: the one check of an AttentionMasking (include/tapegrad/ops/attention.hpp) against the
// scores it masks, which builds the call's RowMasks.
#pragma once

#include <string>
#include <string_view>

#include "kernels/attention_mask.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad::detail {

// What the caller calls the masking's fields: `prefix` goes in front of each ("options.masking."),
// and `mask` is the name of the pair mask there (multihead_attention's MhaMasks call it
// attention_mask).
struct MaskNames {
  std::string_view prefix = "masking.";
  std::string_view mask = "mask";
  std::string of(std::string_view field) const { return std::string(prefix) + std::string(field); }
};

// t (a mask or a bias) broadcasts to the scores' shape, else a ShapeError naming `name`.
void check_on_scores(const char* op, const std::string& name, const Tensor& t, const Shape& scores);
// t's part on the keys from key_start on (dim -1); undefined, a scalar or a size-1 key dim (which
// broadcasts) stays as it is.
Tensor keys_from(const Tensor& t, std::int64_t key_start);

// Validates `m` for scores of `scores_shape` ([..., H, Q, K], B = dim 0) and activations of
// `dtype`, one wording per rule, and returns its rows. Errors name `op` and the fields as `names`
// says: ValueError for the window and the slopes' values and offset, DTypeError for a mask that
// is not bool or slopes of another dtype, ShapeError for shapes. With key_start > 0 (a KV cache
// that dropped its oldest keys) the rows cover keys key_start .. K - 1 only, numbered from 0, at
// the same positions: what the masks say of the keys before key_start is never read.
RowMasks masking_rows(const char* op, const AttentionMasking& m, const Shape& scores_shape, DType dtype, const MaskNames& names = {},
                      std::int64_t key_start = 0);

}  // namespace tapegrad::detail
