// add, sub, mul, div: forward and backward side by side. Shapes broadcast; each backward sums
// the gradient back over the dims its input was broadcast along (sum_to).
#include "ops/op.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad {
namespace {
using namespace detail;

template <class F> Tensor binary_forward(const char* op, const Tensor& a, const Tensor& b, F f) {
  const DType dtype = check_same_float(op, "a", a, "b", b);
  Tensor out = new_tensor(broadcast_args(op, "a", a.shape(), "b", b.shape()), dtype, op);
  visit_float(dtype, op, [&]<class T>(Tag<T>) { map_into<T, T, T>(out, f, a, b); });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("add", a, b, [](auto x, auto y) { return x + y; });
  // da = g, db = g
  record("add", {a, b}, out, {}, [sa = a.shape(), sb = b.shape()](std::span<const Tensor> g, const std::vector<bool>& needs) {
    return std::vector<Tensor>{needs[0] ? sum_to(g[0], sa) : Tensor(), needs[1] ? sum_to(g[0], sb) : Tensor()};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("sub", a, b, [](auto x, auto y) { return x - y; });
  // da = g, db = -g
  record("sub", {a, b}, out, {}, [sa = a.shape(), sb = b.shape()](std::span<const Tensor> g, const std::vector<bool>& needs) {
    return std::vector<Tensor>{needs[0] ? sum_to(g[0], sa) : Tensor(), needs[1] ? sum_to(neg(g[0]), sb) : Tensor()};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("mul", a, b, [](auto x, auto y) { return x * y; });
  // da = g b, db = g a: each operand is kept only when the other one needs its gradient
  const Tensor keep_a = b.requires_grad() ? a : Tensor(), keep_b = a.requires_grad() ? b : Tensor();
  record("mul", {a, b}, out, {keep_a, keep_b},
         [keep_a, keep_b, sa = a.shape(), sb = b.shape()](std::span<const Tensor> g, const std::vector<bool>& needs) {
           return std::vector<Tensor>{needs[0] ? sum_to(mul(g[0], keep_b), sa) : Tensor(),
                                      needs[1] ? sum_to(mul(g[0], keep_a), sb) : Tensor()};
         });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("div", a, b, [](auto x, auto y) { return x / y; });
  // da = g / b, db = -g a / b^2 = -(g / b) * out: out is kept only when b needs its gradient
  // (in a create_graph pass joined back to this node, so that db differentiates through it)
  const Tensor keep_out = b.requires_grad() ? out.detach() : Tensor();
  record("div", {a, b}, out, {b, b.requires_grad() ? out : Tensor()},
         [sa = a.shape(), b, keep_out](std::span<const Tensor> g, const std::vector<bool>& needs) {
           Tensor g_over_b = div(g[0], b);
           const Tensor db = needs[1] ? neg(mul(g_over_b, output_with_history(keep_out, 0))) : Tensor();
           return std::vector<Tensor>{needs[0] ? sum_to(g_over_b, sa) : Tensor(),
                                      needs[1] ? sum_to(db, b.shape()) : Tensor()};
         });
  return out;
}

// Scalar forms: the scalar becomes a rank-0 constant of the tensor's dtype, which never needs
// a gradient, so the tensor-tensor backward does only the tensor's half.
static Tensor scalar_like(const char* op, const Tensor& a, double v) {
  check_floating(op, "a", a);
  return scalar(v, a.dtype());
}
Tensor add(const Tensor& a, double b) { return add(a, scalar_like("add", a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, scalar_like("sub", a, b)); }
Tensor mul(const Tensor& a, double b) { return mul(a, scalar_like("mul", a, b)); }
Tensor div(const Tensor& a, double b) { return div(a, scalar_like("div", a, b)); }

}  // namespace tapegrad
