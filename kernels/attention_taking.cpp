// RowMasks::taking: which queries and keys of multihead_attention take part at all, read from the
// call's rows (kernels/attention_mask.hpp).
#include <algorithm>

#include "kernels/attention_mask.hpp"

namespace tapegrad::detail {

// Rows numbered head-major (b H + h) Q + i. Without a pair mask the heads share their rows, so
// head 0's are read: a row's allowed keys are the key mask's in [begin, end) (the causal end, the
// window's begin), the row is active when the first allowed key from its begin is below its end,
// and the keys used are the allowed ones that some active row's [begin, end) covers (with a
// window and a query mask those intervals may leave gaps). With a pair mask each row is read.
std::pair<Tensor, Tensor> RowMasks::taking(std::int64_t heads, bool per_head) const {
  if (empty_) return {};
  const std::int64_t batch = shape_[0], q = q_, k = k_;
  Tensor active_t = new_tensor({batch, q}, DType::bool_, "multihead_attention"), used_t = new_tensor({batch, k}, DType::bool_, "multihead_attention");
  bool* active = static_cast<bool*>(mutable_data(active_t));
  bool* used = static_cast<bool*>(mutable_data(used_t));
  std::fill(active, active + batch * q, false);
  std::fill(used, used + batch * k, false);
  const auto nk = static_cast<std::size_t>(k);
  std::vector<std::int64_t> next(nk + 1);   // next[j]: the first key >= j the key mask allows (k: none)
  std::vector<std::int64_t> cover(nk + 1);  // +1 where an active row's [begin, end) opens, -1 where it closes
  const std::int64_t read = per_head ? heads : 1;
  for (std::int64_t b = 0; b < batch; ++b) {
    const bool* keys = row(b * heads * q).keys;  // the batch's key mask row, or null
    next[nk] = k;
    for (std::size_t j = nk; j-- > 0;) next[j] = keys == nullptr || keys[j] ? static_cast<std::int64_t>(j) : next[j + 1];
    std::fill(cover.begin(), cover.end(), 0);
    for (std::int64_t r = b * heads * q; r < (b * heads + read) * q; ++r) {
      const RowMask m = row(r);
      bool* act = active + b * q + r % q;
      if (m.pairs == nullptr) {
        if (next[static_cast<std::size_t>(m.begin)] < m.end) {
          *act = true;
          ++cover[static_cast<std::size_t>(m.begin)];
          --cover[static_cast<std::size_t>(m.end)];
        }
        continue;
      }
      for (std::int64_t j = m.begin; j < m.end; ++j)
        if (m(j)) *act = used[b * k + j] = true;
    }
    std::int64_t open = 0;  // active rows covering key j
    for (std::size_t j = 0; j < nk; ++j)
      if ((open += cover[j]) > 0 && next[j] == static_cast<std::int64_t>(j)) used[b * k + static_cast<std::int64_t>(j)] = true;
  }
  auto all = [](const bool* p, std::int64_t n) { return std::all_of(p, p + n, [](bool x) { return x; }); };
  return {all(active, batch * q) ? Tensor() : active_t, all(used, batch * k) ? Tensor() : used_t};
}

}  // namespace tapegrad::detail
