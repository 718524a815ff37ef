// argmax along a dim, and over all elements (the flattened index).
#include "tapegrad/ops/argmax.hpp"

#include <cmath>

#include "ops/op.hpp"

namespace tapegrad {
namespace {
using namespace detail;

void check_argmax_input(const Tensor& x) {
  check_defined("argmax", "x", x);
  if (x.dtype() == DType::bool_)
    fail<DTypeError>("argmax: argument 'x' must be float32, float64 or int64, got bool with shape {}", shape_str(x.shape()));
}

// Whether v, met after best, replaces it: strictly larger (so ties keep the first), or the
// first NaN (after which nothing replaces it).
template <class T> bool beats(T v, T best) {
  if constexpr (std::is_floating_point_v<T>) return !std::isnan(best) && (std::isnan(v) || v > best);
  else return v > best;
}

// x's dim d is scanned in order for each position of the other dims.
Tensor argmax_along(const Tensor& x, std::size_t d, bool keepdim) {
  Shape kept = x.shape();
  const std::int64_t n = kept[d];
  kept[d] = 1;
  if (n == 0 && shape_numel(kept) > 0)
    fail<ShapeError>("argmax: cannot reduce over dim {} of size 0 (input shape {}); the maximum of nothing has no index",
                     d, shape_str(x.shape()));
  Tensor out = new_tensor(kept, DType::int64);
  StridedLoop<2> loop(kept.data(), kept.size(), {out.strides().data(), x.strides().data()});
  const std::int64_t step = x.strides()[d];
  auto* po = static_cast<std::int64_t*>(mutable_data(out));
  visit_any(x.dtype(), [&]<class T>(Tag<T>) {
    const T* px = static_cast<const T*>(x.raw_data());
    loop.for_each_run([&](const auto& off, std::int64_t len, const auto& inner) {
      for (std::int64_t i = 0; i < len; ++i) {
        const T* slice = px + off[1] + i * inner[1];
        std::int64_t best = 0;
        for (std::int64_t j = 1; j < n; ++j)
          if (beats(slice[j * step], slice[best * step])) best = j;
        po[off[0] + i * inner[0]] = best;
      }
    });
  });
  if (keepdim) return out;
  Shape result = x.shape();
  result.erase(result.begin() + static_cast<std::ptrdiff_t>(d));
  return make_view(out, result, contiguous_strides(result), 0, "argmax");
}

}  // namespace

Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim) {
  check_argmax_input(x);
  return argmax_along(x, static_cast<std::size_t>(wrap_dim("argmax", "dim", dim, x.dim())), keepdim);
}

Tensor argmax(const Tensor& x) {
  check_argmax_input(x);
  if (x.numel() == 0)
    fail<ShapeError>("argmax: argument 'x' with shape {} is empty; the maximum of nothing has no index", shape_str(x.shape()));
  // Row-major order is the flat order of a contiguous tensor, viewed as one dim.
  const Tensor flat = x.is_contiguous() ? x : copy_of(x);
  return argmax_along(make_view(flat, {x.numel()}, {1}, flat.offset(), "argmax"), 0, /*keepdim=*/false);
}

}  // namespace tapegrad
