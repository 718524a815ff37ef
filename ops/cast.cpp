// Explicit dtype conversion; between floating dtypes the gradient is converted back.
#include "ops/op.hpp"
#include "tapegrad/ops/cast.hpp"

namespace tapegrad {
using namespace detail;

Tensor to(const Tensor& x, DType dtype) {
  check_defined("to", "x", x);
  if (x.dtype() == dtype) return x;
  Tensor out = new_tensor(x.shape(), dtype, "to");
  visit_any(dtype, [&]<class D>(Tag<D>) {
    visit_any(x.dtype(), [&]<class S>(Tag<S>) {
      map_into<D, S>(out, [](S v) { return convert<D>(v); }, x);
    });
  });
  if (is_floating(dtype) && is_floating(x.dtype())) {
    // dx = g converted to x's dtype
    record_one("to", x, out, {}, [from = x.dtype()](const Tensor& g) { return to(g, from); });
  }
  return out;
}

Tensor Tensor::to(DType d) const { return tapegrad::to(checked_self("Tensor::to", *this), d); }

}  // namespace tapegrad
