// Internal: formatting and throwing the errors of error.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tapegrad/autodiff/error.hpp"
#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

inline std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

template <class E, class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw E(fmt::format(f, std::forward<Args>(args)...));
}

// "op: argument 'name' is an undefined tensor" when a caller passes a default-constructed Tensor.
void check_defined(const char* op, const char* name, const Tensor& t);
// "Tensor::member: called on an undefined ... tensor", for Tensor's own members. Inline: every
// shape() and dtype() call passes here.
[[noreturn]] void fail_undefined_self(const char* member);
inline void check_self(const char* member, const Tensor& t) {
  if (!t.defined()) [[unlikely]] fail_undefined_self(member);
}
// Requires a floating dtype.
void check_floating(const char* op, const char* name, const Tensor& t);
// Requires both floating with the same dtype (no silent float32/float64 mixing); returns it.
DType check_same_float(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                       const Tensor& b);
void check_dtype(const char* op, const char* name, const Tensor& t, DType expected);
// Requires t to have like's dtype (else a DTypeError) and shape (else a ShapeError):
// "op: argument 'name' must be float64 [2, 3] as 'like_name' is, got float32 [2, 3]".
void check_like(const char* op, const char* name, const Tensor& t, const char* like_name, const Tensor& like);
// Normalises a possibly negative dim against rank (rank + 1 when inserting).
std::int64_t wrap_dim(const char* op, const char* name, std::int64_t dim, std::int64_t rank);

// The invariant every tensor's shape keeps: no size is negative, and the product of its sizes,
// with 0 counted as 1, times the item size is at most kMaxBytes (x86-64's 48-bit address space).
// Zero-size shapes are held to it too: their contiguous strides, and the offsets their views
// compute, multiply the other sizes, so [0, 2^62, 4] would overflow int64 without a single
// element. Under the invariant every product of one tensor's sizes, strides and in-range indices
// fits in int64, so code that only rearranges an existing tensor needs no overflow check; code
// that makes a size from user integers or from several tensors must check (or call this).
inline constexpr std::int64_t kMaxBytes = std::int64_t{1} << 48;
// Checks the invariant and returns the element count. Otherwise throws a ShapeError
// "{op}: {what} [..] ...", so `what` names the argument ("argument 'shape'") or the result.
std::int64_t check_shape(const char* op, const char* what, const Shape& shape, DType dtype);
// For a shape that is iterated over but never allocated (attention's [..., Q, K] pairs on its fused
// path): its sizes, with 0 counted as 1, multiply within int64, or a ShapeError
// "{op}: {what} [..]: more elements than int64 can count".
void check_countable(const char* op, const char* what, const Shape& shape);

// The multi-index of row-major position `flat` in `shape` (messages and gradcheck name elements so).
inline Shape unravel_index(std::int64_t flat, const Shape& shape) {
  Shape at(shape.size());
  for (std::size_t d = shape.size(); d-- > 0; flat /= shape[d]) at[d] = flat % shape[d];
  return at;
}

}  // namespace tapegrad::detail
