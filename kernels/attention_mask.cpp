#include "kernels/attention_mask.hpp"

#include <algorithm>

namespace tapegrad::detail {

RowMasks::RowMasks(MaskParts m, const Shape& scores_shape)
    : shape_(scores_shape), causal_(m.causal), offset_(m.causal_offset), window_(m.window) {
  const std::size_t rank = shape_.size();
  q_ = shape_[rank - 2];
  k_ = shape_[rank - 1];
  rows_per_batch_ = 1;
  for (std::size_t d = 1; d + 2 < rank; ++d) rows_per_batch_ *= shape_[d];  // the dims between B and Q
  keys_ = !m.key_mask.defined() || m.key_mask.is_contiguous() ? m.key_mask : copy_of(m.key_mask);
  queries_ = !m.query_mask.defined() || m.query_mask.is_contiguous() ? m.query_mask : copy_of(m.query_mask);
  if (m.allowed.defined()) {
    allowed_ = m.allowed;
    allowed_strides_ = broadcast_strides(allowed_, shape_);
  }
  empty_ = !allowed_.defined() && !keys_.defined() && !queries_.defined() && !causal_;
  if (m.slopes.defined()) {
    slopes_tensor_ = m.slopes;
    const Tensor c = m.slopes.detach().to(DType::float64).contiguous();
    slopes_.assign(c.data<double>(), c.data<double>() + c.numel());
  }
}

std::vector<Tensor> RowMasks::saved_with(std::vector<Tensor> saved, bool ends_only) const {
  for (const Tensor* t : {&queries_, &keys_, &allowed_})
    if (t->defined() && (t == &queries_ || !ends_only)) saved.push_back(*t);
  return saved;
}

std::vector<Tensor> RowMasks::tensors() const {
  std::vector<Tensor> out;
  for (const Tensor* t : {&allowed_, &keys_, &queries_, &slopes_tensor_})
    if (t->defined()) out.push_back(*t);
  return out;
}

RowMask RowMasks::row(std::int64_t r) const noexcept {
  const std::int64_t i = q_ > 0 ? r % q_ : 0;
  const std::int64_t b = rows_per_batch_ * q_ > 0 ? r / (rows_per_batch_ * q_) : 0;
  RowMask out;
  // j <= i + offset, written so that extreme offsets cannot overflow.
  out.end = !causal_ ? k_ : offset_ >= k_ - i ? k_ : offset_ < -i ? 0 : i + offset_ + 1;
  if (queries_.defined() && !static_cast<const bool*>(queries_.raw_data())[b * q_ + i]) out.end = 0;
  if (window_ > 0) {
    // j > i + offset - window: the first key is i + offset - (window - 1), exactly for any int64
    // offset and window. Below INT64_MIN it stays below 0 after adding i; past INT64_MAX, past K.
    std::int64_t first = 0;
    if (__builtin_sub_overflow(offset_, window_ - 1, &first)) out.begin = 0;
    else if (__builtin_add_overflow(first, i, &first)) out.begin = out.end;
    else out.begin = std::clamp<std::int64_t>(first, 0, out.end);
  }
  if (!slopes_.empty()) {
    out.alibi = true;
    out.slope = slopes_[static_cast<std::size_t>((r / std::max<std::int64_t>(q_, 1)) % static_cast<std::int64_t>(slopes_.size()))];
    out.position = i + offset_;  // |offset| <= 2^52 with ALiBi, and i < 2^48: exact
  }
  if (keys_.defined()) out.keys = static_cast<const bool*>(keys_.raw_data()) + b * k_;
  if (allowed_.defined()) {
    // Row r's offset in `allowed`: unravel r over [..., Q] against the broadcast strides.
    std::int64_t offset = 0, rest = r;
    for (std::size_t d = shape_.size() - 1; d-- > 0;) {
      offset += (rest % shape_[d]) * allowed_strides_[d];
      rest /= shape_[d];
    }
    out.pairs = static_cast<const bool*>(allowed_.raw_data()) + offset;
    out.pairs_stride = allowed_strides_[shape_.size() - 1];
  }
  return out;
}

Tensor RowMasks::materialise(const Shape& shape) const {
  Tensor m = new_tensor(shape, DType::bool_, "attention");
  bool* p = static_cast<bool*>(mutable_data(m));
  const std::int64_t rows = k_ == 0 ? 0 : shape_numel(shape) / k_;
  for (std::int64_t r = 0; r < rows; ++r) {
    const RowMask row = this->row(r);
    for (std::int64_t j = 0; j < k_; ++j) p[r * k_ + j] = row(j);
  }
  return m;
}

}  // namespace tapegrad::detail
