// Tensor factories: filled, ranges, copies of caller buffers, nested literals.
#include <cmath>
#include <cstring>

#include "autodiff/check.hpp"
#include "ops/kernel.hpp"

namespace tapegrad {
using detail::fail;
using detail::new_tensor;
using detail::shape_str;

Tensor empty(const Shape& shape, DType dtype) { return new_tensor(shape, dtype); }

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = new_tensor(shape, dtype);
  detail::visit_any(dtype, [&]<class T>(detail::Tag<T>) {
    T* p = static_cast<T*>(t.raw_data());
    const T v = static_cast<T>(value);
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = v;
  });
  return t;
}
Tensor zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }
Tensor scalar(double value, DType dtype) { return full({}, value, dtype); }

Tensor arange(double start, double end, double step, DType dtype) {
  if (step == 0.0 || !std::isfinite(step) || !std::isfinite(start) || !std::isfinite(end))
    fail<ValueError>("arange: expected finite start, end and a nonzero step, got start={} end={} step={}",
                     start, end, step);
  const auto n = static_cast<std::int64_t>(std::max(0.0, std::ceil((end - start) / step)));
  Tensor t = new_tensor({n}, dtype);
  detail::visit_any(dtype, [&]<class T>(detail::Tag<T>) {
    T* p = static_cast<T*>(t.raw_data());
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
  return t;
}
Tensor arange(std::int64_t end, DType dtype) { return arange(0.0, static_cast<double>(end), 1.0, dtype); }

namespace {

template <class T> Tensor copy_buffer(std::span<const T> values, const Shape& shape) {
  if (static_cast<std::int64_t>(values.size()) != detail::shape_numel(shape))
    fail<ShapeError>("from_vector: argument 'values' has {} elements but shape {} needs {}",
                     values.size(), shape_str(shape), detail::shape_numel(shape));
  Tensor t = new_tensor(shape, dtype_of<T>());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

// Flattens a nested initializer list, checking it is rectangular.
template <class L> void flatten_into(const L& list, std::size_t depth, Shape& shape,
                                     std::vector<double>& out) {
  const auto n = static_cast<std::int64_t>(list.size());
  if (shape.size() <= depth) shape.push_back(n);
  else if (shape[depth] != n)
    fail<ShapeError>("tensor: nested literal is ragged: level {} has lengths {} and {}", depth,
                     shape[depth], n);
  for (const auto& item : list) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(item)>>) out.push_back(static_cast<double>(item));
    else flatten_into(item, depth + 1, shape, out);
  }
}

template <class L> Tensor from_literal(const L& list, DType dtype) {
  Shape shape;
  std::vector<double> flat;
  flatten_into(list, 0, shape, flat);
  // An empty inner list leaves deeper dims unrecorded; they are size 0.
  Tensor t = new_tensor(shape, dtype);
  detail::visit_any(dtype, [&]<class T>(detail::Tag<T>) {
    T* p = static_cast<T*>(t.raw_data());
    for (std::size_t i = 0; i < flat.size(); ++i) p[i] = static_cast<T>(flat[i]);
  });
  return t;
}

}  // namespace

Tensor from_vector(std::span<const float> v, const Shape& s) { return copy_buffer(v, s); }
Tensor from_vector(std::span<const double> v, const Shape& s) { return copy_buffer(v, s); }
Tensor from_vector(std::span<const std::int64_t> v, const Shape& s) { return copy_buffer(v, s); }
Tensor from_bools(const std::vector<bool>& values, const Shape& shape) {
  if (static_cast<std::int64_t>(values.size()) != detail::shape_numel(shape))
    fail<ShapeError>("from_bools: argument 'values' has {} elements but shape {} needs {}",
                     values.size(), shape_str(shape), detail::shape_numel(shape));
  Tensor t = new_tensor(shape, DType::bool_);
  bool* p = static_cast<bool*>(t.raw_data());
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

Tensor tensor(Init1 v, DType d) { return from_literal(v, d); }
Tensor tensor(Init2 v, DType d) { return from_literal(v, d); }
Tensor tensor(Init3 v, DType d) { return from_literal(v, d); }
Tensor tensor(Init4 v, DType d) { return from_literal(v, d); }
Tensor mask(Bool1 v) { return from_literal(v, DType::bool_); }
Tensor mask(Bool2 v) { return from_literal(v, DType::bool_); }
Tensor mask(Bool3 v) { return from_literal(v, DType::bool_); }

}  // namespace tapegrad
