// Views: new shape/strides/offset over the same storage. Each backward maps the gradient back
// to the input's layout (the inverse view, or a zero tensor with the gradient written into the
// viewed region).
#include <numeric>
#include <optional>

#include "ops/op.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {
using namespace detail;

// x's offset moved `index` (0 <= index <= size) steps along dim d. Within one tensor this fits
// (tensor_impl.hpp); it is checked anyway, as the one offset computed from a caller's integer.
std::int64_t offset_at(const char* op, const Tensor& x, std::size_t d, std::int64_t index) {
  std::int64_t offset = 0;
  if (__builtin_mul_overflow(index, x.strides()[d], &offset) || __builtin_add_overflow(offset, x.offset(), &offset))
    fail<ShapeError>("{}: index {} of dim {} (stride {}) of shape {} is beyond addressable memory", op, index, d,
                     x.strides()[d], shape_str(x.shape()));
  return offset;
}

// Strides that let `shape` view x's elements in row-major order, or nullopt when x's layout
// does not allow it (then reshape copies). Dims of x are grouped into runs that are contiguous
// with each other; each run must be covered exactly by consecutive dims of the new shape.
std::optional<Shape> reshape_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  if (shape_numel(shape) == 0 || old_shape.empty()) return contiguous_strides(shape);
  Shape strides(shape.size(), 1);
  auto view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_stride = old_strides.back(), chunk_numel = 1, view_numel = 1;
  for (auto d = static_cast<std::int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    const auto k = static_cast<std::size_t>(d);
    chunk_numel *= old_shape[k];
    const bool chunk_ends = d == 0 || (old_shape[k - 1] != 1 && old_strides[k - 1] != chunk_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < chunk_numel || shape[static_cast<std::size_t>(view_d)] == 1)) {
      strides[static_cast<std::size_t>(view_d)] = view_numel * chunk_stride;
      view_numel *= shape[static_cast<std::size_t>(view_d)];
      --view_d;
    }
    if (view_numel != chunk_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = old_strides[k - 1];
      chunk_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

Shape infer_shape(const char* op, const Tensor& x, Shape shape) {
  std::int64_t known = 1;
  std::optional<std::size_t> infer;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && !infer) infer = i;
    else if (shape[i] < 0)
      fail<ShapeError>("{}: argument 'shape' {} may hold one -1 and otherwise sizes >= 0 (input shape {})", op,
                       shape_str(shape), shape_str(x.shape()));
    else if (__builtin_mul_overflow(known, shape[i], &known))
      fail<ShapeError>("{}: argument 'shape' {} has more elements than can be addressed", op, shape_str(shape));
  }
  if (infer) {
    if (known == 0 || x.numel() % known != 0)
      fail<ShapeError>("{}: cannot infer the -1 in shape {} for an input of shape {} ({} elements)", op,
                       shape_str(shape), shape_str(x.shape()), x.numel());
    shape[*infer] = x.numel() / known;
  }
  if (check_shape(op, "argument 'shape'", shape, x.dtype()) != x.numel())
    fail<ShapeError>("{}: argument 'shape' {} has {} elements but the input shape {} has {}", op,
                     shape_str(shape), shape_numel(shape), shape_str(x.shape()), x.numel());
  return shape;
}

// A zero tensor of x's shape with g written into the region `region(zeros)` selects: the
// backward of every view that picks a subset of elements. It is recorded as an op of its own
// (`name`), linear in g, whose backward takes the same region of its upstream gradient, so that
// a create_graph pass differentiates it, to any order. dg = region(g')
template <class Region> Tensor scatter_into_zeros(const char* name, const Shape& shape, const Tensor& g, Region region) {
  Tensor z = zeros(shape, g.dtype());
  copy_into(region(z), g);
  record_one(name, g, z, {}, [region](const Tensor& gg) { return region(gg); });
  return z;
}

Tensor reshape_as(const char* op, const Tensor& x, Shape shape) {
  check_defined(op, "x", x);
  shape = infer_shape(op, x, std::move(shape));
  if (shape == x.shape()) return x;
  auto strides = reshape_strides(x.shape(), x.strides(), shape);
  Tensor out = strides ? make_view(x, std::move(shape), std::move(*strides), x.offset(), op)
                       : make_view(copy_of(x), shape, contiguous_strides(shape), 0, op);
  // dx = g reshaped back
  record_one(op, x, out, {}, [xs = x.shape()](const Tensor& g) { return reshape(g, xs); });
  return out;
}

Tensor expand_as(const char* op, const Tensor& x, const Shape& shape) {
  check_defined(op, "x", x);
  if (shape.size() < x.shape().size())
    fail<ShapeError>("{}: argument 'shape' {} has fewer dims than the input shape {}", op, shape_str(shape), shape_str(x.shape()));
  const std::size_t lead = shape.size() - x.shape().size();
  Shape out_shape(shape.size()), strides(shape.size(), 0);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t have = i < lead ? 1 : x.shape()[i - lead];
    const std::int64_t want = shape[i] == -1 && i >= lead ? have : shape[i];
    if (want < 0 || (have != want && have != 1))
      fail<ShapeError>("{}: input shape {} cannot expand to argument 'shape' {} (dim {}: {} -> {})", op,
                       shape_str(x.shape()), shape_str(shape), i, have, shape[i]);
    out_shape[i] = want;
    if (i >= lead && have == want) strides[i] = x.strides()[i - lead];
  }
  if (out_shape == x.shape()) return x;
  Tensor out = make_view(x, std::move(out_shape), std::move(strides), x.offset(), op);
  // dx = g summed over the expanded dims
  record_one(op, x, out, {}, [xs = x.shape()](const Tensor& g) { return sum_to(g, xs); });
  return out;
}

}  // namespace

Tensor reshape(const Tensor& x, Shape shape) { return reshape_as("reshape", x, std::move(shape)); }
Tensor flatten(const Tensor& x) { return reshape_as("flatten", x, {-1}); }

Tensor permute(const Tensor& x, std::vector<std::int64_t> dims) {
  check_defined("permute", "x", x);
  const std::int64_t rank = x.dim();
  if (static_cast<std::int64_t>(dims.size()) != rank)
    fail<ShapeError>("permute: argument 'dims' {} must list each of the {} dims of shape {} once",
                     shape_str(dims), rank, shape_str(x.shape()));
  SmallVec<bool, 8> seen(static_cast<std::size_t>(rank), false);
  Shape shape(dims.size()), strides(dims.size());
  Dims8 inverse(dims.size(), 0);  // inline: the backward's capture is then the one allocation
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const auto d = static_cast<std::size_t>(wrap_dim("permute", "dims", dims[i], rank));
    if (seen[d]) fail<ShapeError>("permute: argument 'dims' {} repeats dim {} (input shape {})", shape_str(dims), d, shape_str(x.shape()));
    seen[d] = true;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
    inverse[d] = static_cast<std::int64_t>(i);
  }
  Tensor out = make_view(x, std::move(shape), std::move(strides), x.offset(), "permute");
  // dx = g permuted by the inverse permutation
  record_one("permute", x, out, {}, [inverse](const Tensor& g) {
    return permute(g, std::vector<std::int64_t>(inverse.begin(), inverse.end()));
  });
  return out;
}

Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1) {
  check_defined("transpose", "x", x);
  std::vector<std::int64_t> dims(static_cast<std::size_t>(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[static_cast<std::size_t>(wrap_dim("transpose", "dim0", dim0, x.dim()))],
            dims[static_cast<std::size_t>(wrap_dim("transpose", "dim1", dim1, x.dim()))]);
  return permute(x, std::move(dims));
}

Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) {
  check_defined("slice", "x", x);
  const auto d = static_cast<std::size_t>(wrap_dim("slice", "dim", dim, x.dim()));
  if (step < 1) fail<ValueError>("slice: argument 'step' must be >= 1, got {} (input shape {})", step, shape_str(x.shape()));
  const std::int64_t n = x.shape()[d];
  auto clamp = [n](std::int64_t i) { return std::clamp(i < 0 ? i + n : i, std::int64_t{0}, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape shape = x.shape(), strides = x.strides();
  shape[d] = end == start ? 0 : 1 + (end - start - 1) / step;  // no overflow for any step
  if (shape[d] > 1 && __builtin_mul_overflow(strides[d], step, &strides[d]))
    fail<ValueError>("slice: argument 'step' = {} is too large (input shape {})", step, shape_str(x.shape()));
  Tensor out = make_view(x, std::move(shape), std::move(strides), offset_at("slice", x, d, start), "slice");
  // dx = zeros with g written into the sliced region
  record_one("slice", x, out, {}, [xs = x.shape(), dim, start, end, step](const Tensor& g) {
    return scatter_into_zeros("slice_backward", xs, g,
                              [=](const Tensor& z) { return slice(z, dim, start, end, step); });
  });
  return out;
}

Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  check_defined("narrow", "x", x);
  const std::int64_t n = x.size(wrap_dim("narrow", "dim", dim, x.dim()));
  if (start < 0 || length < 0 || start > n || length > n - start)
    fail<ShapeError>("narrow: start = {} and length = {} must lie within dim {} of size {} (input shape {})", start, length,
                     dim, n, shape_str(x.shape()));
  return slice(x, dim, start, start + length);
}

Tensor select(const Tensor& x, std::int64_t dim, std::int64_t index) {
  check_defined("select", "x", x);
  const auto d = static_cast<std::size_t>(wrap_dim("select", "dim", dim, x.dim()));
  const std::int64_t n = x.shape()[d];
  if (index < -n || index >= n)
    fail<ShapeError>("select: argument 'index' = {} is out of range for dim {} of size {} (input shape {})",
                     index, dim, n, shape_str(x.shape()));
  if (index < 0) index += n;
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(d));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(d));
  Tensor out = make_view(x, std::move(shape), std::move(strides), offset_at("select", x, d, index), "select");
  // dx = zeros with g written into row `index`
  record_one("select", x, out, {}, [xs = x.shape(), dim, index](const Tensor& g) {
    return scatter_into_zeros("select_backward", xs, g, [=](const Tensor& z) { return select(z, dim, index); });
  });
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) { return expand_as("expand", x, shape); }
Tensor broadcast_to(const Tensor& x, const Shape& shape) { return expand_as("broadcast_to", x, shape); }

Tensor squeeze(const Tensor& x, std::int64_t dim) {
  check_defined("squeeze", "x", x);
  const auto d = static_cast<std::size_t>(wrap_dim("squeeze", "dim", dim, x.dim()));
  if (x.shape()[d] != 1)
    fail<ShapeError>("squeeze: dim {} of shape {} has size {}, expected 1", dim, shape_str(x.shape()), x.shape()[d]);
  Shape shape = x.shape();
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(d));
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, std::int64_t dim) {
  check_defined("unsqueeze", "x", x);
  const auto d = static_cast<std::size_t>(wrap_dim("unsqueeze", "dim", dim, x.dim() + 1));
  Shape shape = x.shape();
  shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(d), 1);
  return reshape(x, shape);
}

Tensor contiguous(const Tensor& x) {
  check_defined("contiguous", "x", x);
  if (x.is_contiguous()) return x;
  Tensor out = copy_of(x);
  // dx = g
  record_one("contiguous", x, out, {}, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::contiguous() const { return tapegrad::contiguous(checked_self("Tensor::contiguous", *this)); }
Tensor Tensor::reshape(Shape s) const {
  return tapegrad::reshape(checked_self("Tensor::reshape", *this), std::move(s));
}
Tensor Tensor::permute(std::vector<std::int64_t> d) const {
  return tapegrad::permute(checked_self("Tensor::permute", *this), std::move(d));
}
Tensor Tensor::transpose(std::int64_t a, std::int64_t b) const {
  return tapegrad::transpose(checked_self("Tensor::transpose", *this), a, b);
}

}  // namespace tapegrad
