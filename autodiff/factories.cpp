// Tensor factories: filled, ranges, copies of caller buffers, nested literals.
#include <algorithm>
#include <cmath>

#include "autodiff/check.hpp"
#include "autodiff/loops.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad {
using detail::fail;
using detail::new_tensor;
using detail::shape_str;

namespace {

constexpr const char* kShapeArg = "argument 'shape'";

Tensor filled(const char* op, const Shape& shape, double value, DType dtype) {
  Tensor t = new_tensor(shape, dtype, op, kShapeArg);
  detail::visit_any(dtype, [&]<class T>(detail::Tag<T>) {
    T* p = static_cast<T*>(detail::mutable_data(t));
    const T v = detail::convert<T>(value);
    // Split over the threads when large: a dense gradient starts as zeros (an embedding's is
    // vocabulary x width).
    detail::parallel_for(t.numel(), 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) p[i] = v;
    });
  });
  return t;
}

Tensor filled_like(const char* op, const Tensor& t, double value) {
  detail::check_defined(op, "t", t);
  return filled(op, t.shape(), value, t.dtype());
}

}  // namespace

Tensor empty(const Shape& shape, DType dtype) { return new_tensor(shape, dtype, "empty", kShapeArg); }
Tensor full(const Shape& shape, double value, DType dtype) { return filled("full", shape, value, dtype); }
Tensor zeros(const Shape& shape, DType dtype) { return filled("zeros", shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return filled("ones", shape, 1.0, dtype); }
Tensor zeros_like(const Tensor& t) { return filled_like("zeros_like", t, 0.0); }
Tensor ones_like(const Tensor& t) { return filled_like("ones_like", t, 1.0); }
Tensor scalar(double value, DType dtype) { return filled("scalar", {}, value, dtype); }

Tensor arange(double start, double end, double step, DType dtype) {
  if (step == 0.0 || !std::isfinite(step) || !std::isfinite(start) || !std::isfinite(end))
    fail<ValueError>("arange: expected finite start, end and a nonzero step, got start={} end={} step={}",
                     start, end, step);
  // An int64 arange of fractional start or step would truncate every value to a different
  // sequence than the one asked for (arange(0, 1, 0.25) to zeros): refused, not guessed.
  if (dtype == DType::int64 && (start != std::trunc(start) || step != std::trunc(step)))
    fail<ValueError>("arange: an int64 arange needs a whole start and step, got start={} end={} step={}; ask for dtype float32 "
                     "or float64 for fractional values",
                     start, end, step);
  // (end - start) may overflow to inf; the bound also keeps the conversion to int64 defined.
  const double count = std::max(0.0, std::ceil((end - start) / step));
  if (!(count <= static_cast<double>(detail::kMaxBytes)))
    fail<ShapeError>("arange: start={} end={} step={} would make {} elements, more than can be addressed", start,
                     end, step, count);
  const auto n = static_cast<std::int64_t>(count);
  Tensor t = new_tensor({n}, dtype, "arange");
  detail::visit_any(dtype, [&]<class T>(detail::Tag<T>) {
    T* p = static_cast<T*>(detail::mutable_data(t));
    for (std::int64_t i = 0; i < n; ++i) p[i] = detail::convert<T>(start + static_cast<double>(i) * step);
  });
  return t;
}
Tensor arange(std::int64_t end, DType dtype) { return arange(0.0, static_cast<double>(end), 1.0, dtype); }

namespace {

// A tensor of `shape` holding a copy of `values` (std::copy: a memmove for a span).
template <class T, class Values> Tensor copy_buffer(const char* op, const Values& values, const Shape& shape) {
  const std::int64_t n = detail::check_shape(op, kShapeArg, shape, dtype_of<T>());
  if (static_cast<std::int64_t>(values.size()) != n)
    fail<ShapeError>("{}: argument 'values' has {} elements but shape {} needs {}", op, values.size(), shape_str(shape), n);
  Tensor t = new_tensor(shape, dtype_of<T>(), op, kShapeArg);
  std::copy(values.begin(), values.end(), static_cast<T*>(detail::mutable_data(t)));
  return t;
}

// Flattens a nested literal, checking it is rectangular.
void flatten_into(const char* op, const Literal& lit, std::size_t depth, Shape& shape, std::vector<double>& out) {
  if (!lit.is_list()) {
    if (depth != shape.size())
      fail<ShapeError>("{}: nested literal is ragged: a number at depth {} where others are at depth {}", op, depth, shape.size());
    out.push_back(lit.value());
    return;
  }
  const auto n = static_cast<std::int64_t>(lit.items().size());
  if (out.empty() && shape.size() == depth) shape.push_back(n);
  else if (shape.size() <= depth || shape[depth] != n)
    fail<ShapeError>("{}: nested literal is ragged: level {} has lengths {} and {}", op, depth,
                     shape.size() > depth ? shape[depth] : 0, n);
  for (const auto& item : lit.items()) flatten_into(op, item, depth + 1, shape, out);
}

Tensor from_literal(const char* op, const Literal& lit, DType dtype) {
  Shape shape;
  std::vector<double> flat;
  flatten_into(op, lit, 0, shape, flat);
  if (static_cast<std::int64_t>(flat.size()) != detail::shape_numel(shape))
    fail<ShapeError>("{}: nested literal is ragged: shape {} but {} numbers", op, shape_str(shape), flat.size());
  Tensor t = new_tensor(shape, dtype, op, "literal shape");
  detail::visit_any(dtype, [&]<class T>(detail::Tag<T>) {
    T* p = static_cast<T*>(detail::mutable_data(t));
    for (std::size_t i = 0; i < flat.size(); ++i) p[i] = detail::convert<T>(flat[i]);
  });
  return t;
}

}  // namespace

Tensor from_vector(std::span<const float> v, const Shape& s) { return copy_buffer<float>("from_vector", v, s); }
Tensor from_vector(std::span<const double> v, const Shape& s) { return copy_buffer<double>("from_vector", v, s); }
Tensor from_vector(std::span<const std::int64_t> v, const Shape& s) {
  return copy_buffer<std::int64_t>("from_vector", v, s);
}
Tensor from_bools(const std::vector<bool>& v, const Shape& s) { return copy_buffer<bool>("from_bools", v, s); }

Tensor tensor(const Literal& values, DType dtype) { return from_literal("tensor", values, dtype); }
Tensor mask(const Literal& values) { return from_literal("mask", values, DType::bool_); }

}  // namespace tapegrad
