// Internal: the rows of a [..., K] tensor, and the one way a row kernel runs over them (rows
// spread over the threads; float32 rows on a function built for each CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "autodiff/loops.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad::detail {

// Where each row of a tensor read as `shape` ([..., Q, K], broadcasting) starts, and the stride
// along K. Rows of a contiguous tensor of that shape start every K elements; other layouts
// unravel the row number over [..., Q].
struct RowPointers {
  const std::byte* base = nullptr;
  Shape shape;
  Dims8 strides;
  std::int64_t k = 0, stride = 0;
  bool packed = false;
  std::int64_t first = 0;  // packed: the row that base holds (a buffer of a block of rows)

  RowPointers(const Tensor& t, const Shape& shape_) : shape(shape_), k(shape_.back()) {
    if (!t.defined()) return;
    base = static_cast<const std::byte*>(t.raw_data());
    packed = t.shape() == shape && t.is_contiguous();
    strides = broadcast_strides(t, shape);
    stride = strides[shape.size() - 1];
  }
  // Rows first, first + 1, ... of `shape`, packed at `rows` (row stride K).
  template <class T> static RowPointers block(const T* rows, const Shape& shape_, std::int64_t first_row) {
    RowPointers p(Tensor(), shape_);
    p.base = reinterpret_cast<const std::byte*>(rows);
    p.packed = true;
    p.stride = 1;
    p.first = first_row;
    return p;
  }
  template <class T> const T* row(std::int64_t r) const noexcept {
    if (base == nullptr) return nullptr;
    if (packed) return reinterpret_cast<const T*>(base) + (r - first) * k;
    std::int64_t offset = 0;
    for (std::size_t d = shape.size() - 1; d-- > 0;) {
      offset += (r % shape[d]) * strides[d];
      r /= shape[d];
    }
    return reinterpret_cast<const T*>(base) + offset;
  }
};

// A row of K elements costs about this many units per element (an exp, a few passes): the grain
// parallel_for splits the rows by.
inline constexpr std::int64_t kRowCost = 8;

// The rows of t ([..., K]) in ranges [begin, stop) over the threads: f32(begin, stop) when t is
// float32 (a TAPEGRAD_CPU_CLONES function, built for each CPU), f64(begin, stop) when float64.
// Each row goes to one range whole, so a row's result cannot depend on the thread count.
template <class F32, class F64>
void for_each_row(const Tensor& t, const char* op, const F32& f32, const F64& f64) {
  const std::int64_t k = t.shape().back(), rows = k == 0 ? 0 : t.numel() / k;
  visit_float(t.dtype(), op, [&]<class T>(Tag<T>) {
    parallel_for(rows, k * kRowCost, [&](std::int64_t begin, std::int64_t stop) {
      if constexpr (std::is_same_v<T, float>) f32(begin, stop);
      else f64(begin, stop);
    });
  });
}

}  // namespace tapegrad::detail
