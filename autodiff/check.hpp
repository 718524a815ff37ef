// Internal: formatting and throwing the errors of error.hpp.
#pragma once

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
// Normalises a possibly negative dim against rank (rank + 1 when inserting).
std::int64_t wrap_dim(const char* op, const char* name, std::int64_t dim, std::int64_t rank);

}  // namespace tapegrad::detail
