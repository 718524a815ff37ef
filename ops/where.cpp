// where / masked_fill: the selected values get the gradient, the others get zero.
#include "ops/op.hpp"
#include "tapegrad/ops/view.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
using namespace detail;

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_dtype("where", "cond", cond, DType::bool_);
  check_same_dtype("where", a, b);
  const Shape ab = broadcast_args("where", "a", a.shape(), "b", b.shape());
  const Shape shape = broadcast_args("where", "a and b (broadcast)", ab, "cond", cond.shape());
  Tensor out = new_tensor(shape, a.dtype(), "where");
  visit_any(a.dtype(), [&]<class T>(Tag<T>) {
    map_into<T, bool, T, T>(out, [](bool c, T x, T y) { return c ? x : y; }, cond, a, b);
  });
  // da = cond ? g : 0,  db = cond ? 0 : g   (each summed to its input's shape)
  record("where", {a, b}, out, {cond}, [cond, sa = a.shape(), sb = b.shape()](std::span<const Tensor> g, const std::vector<bool>& needs) {
    const Tensor zero = scalar(0.0, g[0].dtype());
    return std::vector<Tensor>{needs[0] ? sum_to(where(cond, g[0], zero), sa) : Tensor(),
                               needs[1] ? sum_to(where(cond, zero, g[0]), sb) : Tensor()};
  });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", "x", x);
  check_dtype("masked_fill", "mask", mask, DType::bool_);
  check_broadcasts_to("masked_fill", "mask", mask.shape(), "x", x.shape());
  return where(mask, scalar(value, x.dtype()), x);
}

}  // namespace tapegrad
