// dropout: a seeded keep-mask, forward and backward both selecting through it.
#include "tapegrad/ops/dropout.hpp"

#include "ops/op.hpp"

namespace tapegrad {
namespace {
using namespace detail;

// keep ? v * scale : 0, a selection rather than a product with the mask, so dropped elements are
// exact zeros even when v is not finite (and p = 1 never multiplies by 1 / 0). Linear in v and
// its own transpose, so recorded (as `name`) its backward is itself: dropout's backward is then
// an op a create_graph pass differentiates, to any order.
Tensor apply_mask(const char* name, const Tensor& v, const Tensor& keep, double scale) {
  Tensor out = new_tensor(v.shape(), v.dtype());
  visit_float(v.dtype(), "dropout", [&]<class T>(Tag<T>) {
    const T s = convert<T>(scale);
    map_into<T, T, bool>(out, [s](T x, bool k) { return k ? x * s : T(0); }, v, keep);
  });
  // dv = keep ? g * scale : 0
  record_one(name, v, out, {keep}, [keep, scale](const Tensor& g) {
    return apply_mask("dropout_backward", g, keep, scale);
  });
  return out;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  check_floating("dropout", "x", x);
  if (!(p >= 0.0 && p <= 1.0)) fail<ValueError>("dropout: argument 'p' must lie in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;
  Tensor keep = new_tensor(x.shape(), DType::bool_);
  bool* pk = static_cast<bool*>(mutable_data(keep));
  for (std::int64_t i = 0, n = keep.numel(); i < n; ++i) pk[i] = gen.uniform() >= p;
  const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  // dx = keep ? g / (1 - p) : 0
  return apply_mask("dropout", x, keep, scale);
}

}  // namespace tapegrad
