// Unary elementwise ops. Each is a small struct: the forward f(x) and the local derivative
// df(x, y) = dy/dx, side by side; the shared backward is the op unary_backward, dx = g * df(x, y).
// `d_slope(gu, x, y)` is gu * d(df)/d(x or y), in recorded ops: unary_backward's own gradient to
// the operand df reads. GELU, whose backward is a fused kernel and an op of its own, is written
// out at the end.
#include <cmath>
#include <numbers>
#include <type_traits>

#include "kernels/fast_math.hpp"
#include "kernels/gelu_f32.hpp"
#include "ops/op.hpp"
#include "runtime/parallel.hpp"
#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace {
using namespace detail;

// What a derivative reads (only that is kept on the tape and streamed through the backward
// loop), and the price per element relative to a copy, which decides when a loop is split over
// threads.
enum class Reads { nothing, x, y };
template <Reads R, std::int64_t Cost> struct Unary {
  static constexpr bool uses_x = R == Reads::x, uses_y = R == Reads::y;
  static constexpr std::int64_t cost = Cost;
  bool reads_x() const { return uses_x; }  // an op may say so per instance, as pow does
  bool curved() const { return true; }     // whether df varies with the operand it reads
};
// float32 on the vectorisable exp of fast_math.hpp, float64 on std::exp.
template <class T> T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}

struct Neg : Unary<Reads::nothing, 1> {
  static constexpr const char* name = "neg";
  static constexpr const char* backward_name = "neg_backward";
  template <class T> T f(T x) const { return -x; }
  template <class T> T df(T, T) const { return T(-1); }
  Tensor d_slope(const Tensor&, const Tensor&, const Tensor&) const { return {}; }  // never called: no operand
};
struct Exp : Unary<Reads::y, 4> {
  static constexpr const char* name = "exp";
  static constexpr const char* backward_name = "exp_backward";
  template <class T> T f(T x) const { return exp_of(x); }
  template <class T> T df(T, T y) const { return y; }  // (e^x)' = e^x
  Tensor d_slope(const Tensor& gu, const Tensor&, const Tensor&) const { return gu; }  // d(y)/dy = 1
};
struct Log : Unary<Reads::x, 8> {
  static constexpr const char* name = "log";
  static constexpr const char* backward_name = "log_backward";
  template <class T> T f(T x) const { return std::log(x); }
  template <class T> T df(T x, T) const { return T(1) / x; }
  Tensor d_slope(const Tensor& gu, const Tensor& x, const Tensor&) const { return gu * -pow(x, -2.0); }  // (1/x)' = -x^(-2)
};
struct Sqrt : Unary<Reads::y, 2> {
  static constexpr const char* name = "sqrt";
  static constexpr const char* backward_name = "sqrt_backward";
  template <class T> T f(T x) const { return std::sqrt(x); }
  template <class T> T df(T, T y) const { return T(0.5) / y; }  // 1 / (2 sqrt x)
  Tensor d_slope(const Tensor& gu, const Tensor&, const Tensor& y) const { return gu * (pow(y, -2.0) * -0.5); }  // (0.5/y)' = -0.5 y^(-2)
};
struct Pow : Unary<Reads::x, 16> {
  static constexpr const char* name = "pow";
  static constexpr const char* backward_name = "pow_backward";
  double p;
  template <class T> T f(T x) const { return std::pow(x, convert<T>(p)); }
  // p x^(p-1); exactly 0 for p = 0, where x^(-1) at x = 0 would turn 0 * inf into NaN (so
  // then x is not read, nor kept).
  template <class T> T df(T x, T) const {
    return p == 0.0 ? T(0) : convert<T>(p) * std::pow(x, convert<T>(p - 1.0));
  }
  bool reads_x() const { return p != 0.0; }
  // The slope p x^(p-1) is constant for p = 1 (and p = 0): no second derivative, so no 0 * x^(-1).
  bool curved() const { return p != 1.0; }
  // (p x^(p-1))' = p (p-1) x^(p-2); pow is recorded, so every order follows.
  Tensor d_slope(const Tensor& gu, const Tensor& x, const Tensor&) const { return gu * (pow(x, p - 2.0) * (p * (p - 1.0))); }
};
struct Tanh : Unary<Reads::y, 6> {
  static constexpr const char* name = "tanh";
  static constexpr const char* backward_name = "tanh_backward";
  template <class T> T f(T x) const {
    if constexpr (std::is_same_v<T, float>) return tanh_f32(x);
    else return std::tanh(x);
  }
  template <class T> T df(T, T y) const { return T(1) - y * y; }
  Tensor d_slope(const Tensor& gu, const Tensor&, const Tensor& y) const { return gu * y * -2.0; }  // (1 - y^2)' = -2y
};
// A slope that is piecewise constant (relu's 0/1, abs's -1/1; the kink's value is a convention):
// no second derivative in x.
struct PiecewiseLinear : Unary<Reads::x, 1> {
  bool curved() const { return false; }
  Tensor d_slope(const Tensor&, const Tensor&, const Tensor&) const { return {}; }  // never called
};
struct Relu : PiecewiseLinear {
  static constexpr const char* name = "relu";
  static constexpr const char* backward_name = "relu_backward";
  template <class T> T f(T x) const { return x < T(0) ? T(0) : x; }  // NaN stays NaN, as in PyTorch
  template <class T> T df(T x, T) const { return x > T(0) ? T(1) : T(0); }  // 0 at the kink, as PyTorch
};
// sigma(x) = 1 / (1 + e^-|x|) for x >= 0, e^-|x| / (1 + e^-|x|) below: e^-|x| <= 1 never overflows.
template <class T> T logistic(T x) {
  const T e = exp_of(-std::abs(x));
  return x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
}
struct Sigmoid : Unary<Reads::y, 6> {
  static constexpr const char* name = "sigmoid";
  static constexpr const char* backward_name = "sigmoid_backward";
  template <class T> T f(T x) const { return logistic(x); }
  template <class T> T df(T, T y) const { return y * (T(1) - y); }
  Tensor d_slope(const Tensor& gu, const Tensor&, const Tensor& y) const { return gu * (1.0 - 2.0 * y); }  // (y - y^2)' = 1 - 2y
};
struct Silu : Unary<Reads::x, 6> {
  static constexpr const char* name = "silu";
  static constexpr const char* backward_name = "silu_backward";
  template <class T> T f(T x) const { return x * logistic(x); }
  template <class T> T df(T x, T) const {
    const T s = logistic(x);
    return s * (T(1) + x * (T(1) - s));  // s + x s (1 - s)
  }
  // (s + x s (1 - s))' = s (1 - s) (2 + x (1 - 2s)), on the recorded sigmoid: every order follows.
  Tensor d_slope(const Tensor& gu, const Tensor& x, const Tensor&) const {
    const Tensor s = sigmoid(x);
    return gu * (s * (1.0 - s) * (2.0 + x * (1.0 - 2.0 * s)));
  }
};
struct Abs : PiecewiseLinear {
  static constexpr const char* name = "abs";
  static constexpr const char* backward_name = "abs_backward";
  template <class T> T f(T x) const { return std::abs(x); }
  // sign(x), 0 at 0 (PyTorch's subgradient); NaN stays NaN.
  template <class T> T df(T x, T) const { return x > T(0) ? T(1) : x < T(0) ? T(-1) : x == T(0) ? T(0) : x; }
};
// The shared backward as an op: dx = g * df(x, y), x and y what df reads (else undefined), y
// joined to the unary node in a create_graph pass. Its own gradients, for the upstream U:
//   dg = U * df(x, y)                       (this op again: dx is linear in g)
//   dx or dy = (U * g) * d(df)/d(x or y)    (op.d_slope; none where df is constant)
// Only the operands the derivative reads are streamed through the loop.
template <class Op> Tensor unary_backward(const Op& op, const Tensor& g, const Tensor& xs, const Tensor& ys) {
  Tensor dx = new_tensor(g.shape(), g.dtype(), Op::name);
  visit_float(dx.dtype(), Op::name, [&]<class T>(Tag<T>) {
    if constexpr (Op::uses_y)
      map_into_cost<T, T, T>(1, dx, [&](T gv, T yv) { return gv * op.template df<T>(T(0), yv); }, g, ys);
    else if (xs.defined())
      map_into_cost<T, T, T>(Op::cost, dx, [&](T gv, T xv) { return gv * op.template df<T>(xv, T(0)); }, g, xs);
    else
      map_into<T, T>(dx, [&](T gv) { return gv * op.template df<T>(T(0), T(0)); }, g);
  });
  if (!is_grad_enabled()) return dx;  // a first-order pass: record() would return at once
  const Tensor& operand = Op::uses_y ? ys : xs;  // what df reads: undefined when it reads nothing
  const Tensor slope_in = operand.defined() && op.curved() ? operand : Tensor();
  const Tensor keep_g = slope_in.defined() && slope_in.requires_grad() ? g : Tensor();  // read only for the operand's gradient
  record(Op::backward_name, {g, slope_in}, dx, {keep_g, xs, ys},
         [op, keep_g, xs, ys](std::span<const Tensor> u, const std::vector<bool>& needs) {
           return std::vector<Tensor>{needs[0] ? unary_backward(op, u[0], xs, ys) : Tensor(),
                                      needs[1] ? op.d_slope(u[0] * keep_g, xs, ys) : Tensor()};
         });
  return dx;
}

template <class Op> Tensor unary(const Tensor& x, Op op = {}) {
  check_floating(Op::name, "x", x);
  Tensor y = new_tensor(x.shape(), x.dtype(), Op::name);
  visit_float(x.dtype(), Op::name, [&]<class T>(Tag<T>) {
    map_into_cost<T, T>(Op::cost, y, [&](T v) { return op.template f<T>(v); }, x);
  });
  // dx = g * df(x, y), one formula to every order (y joined to this node in a create_graph pass)
  const Tensor xs = op.reads_x() ? x : Tensor();
  record_one(Op::name, x, y, {xs, Op::uses_y ? y : Tensor()},
             [op, xs, ys = Op::uses_y ? y.detach() : Tensor()](const Tensor& g) {
               return unary_backward(op, g, xs, output_with_history(ys, 0));
             });
  return y;
}

}  // namespace

Tensor neg(const Tensor& x) { return unary<Neg>(x); }
Tensor exp(const Tensor& x) { return unary<Exp>(x); }
Tensor log(const Tensor& x) { return unary<Log>(x); }
Tensor sqrt(const Tensor& x) { return unary<Sqrt>(x); }
Tensor pow(const Tensor& x, double exponent) {
  if (!std::isfinite(exponent))
    fail<ValueError>("pow: argument 'exponent' must be finite, got {}", exponent);
  return unary<Pow>(x, Pow{{}, exponent});
}
Tensor tanh(const Tensor& x) { return unary<Tanh>(x); }
Tensor relu(const Tensor& x) { return unary<Relu>(x); }
Tensor sigmoid(const Tensor& x) { return unary<Sigmoid>(x); }
Tensor silu(const Tensor& x) { return unary<Silu>(x); }
Tensor abs(const Tensor& x) { return unary<Abs>(x); }

namespace {

// phi(x) (2 - x^2), the derivative of GELU's slope, in recorded ops. Where |x| >= cut, phi(x)
// is 0 in the dtype and so is this; x is replaced by 0 there first, else x^2 = inf would make
// 0 * inf = NaN of this value and of its own gradients.
Tensor gelu_curvature(const Tensor& x) {
  const double cut = x.dtype() == DType::float32 ? 15.0 : 40.0;
  const Tensor zero = scalar(0.0, x.dtype());
  const Tensor far = logical_or(gt(x, scalar(cut, x.dtype())), lt(x, scalar(-cut, x.dtype())));
  const Tensor xs = where(far, zero, x), x2 = xs * xs;
  const Tensor pdf = exp(x2 * -0.5) * (0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
  return where(far, zero, pdf * (2.0 - x2));
}

// GELU's backward as an op of its own, the slope recomputed from x in the pass that multiplies
// by g, so that a create_graph pass can differentiate it in g and x (and again, to any order).
// dx = g (Phi(x) + x phi(x)); its own: dg = g' (Phi(x) + x phi(x)), dx = g' g phi(x) (2 - x^2)
Tensor gelu_backward(const Tensor& g, const Tensor& x) {
  const Tensor gc = g.is_contiguous() ? g : copy_of(g), xc = x.is_contiguous() ? x : copy_of(x);
  Tensor dx = new_tensor(x.shape(), x.dtype(), "gelu");
  visit_float(x.dtype(), "gelu", [&]<class T>(Tag<T>) {
    const T* pg = static_cast<const T*>(gc.raw_data());
    const T* px = static_cast<const T*>(xc.raw_data());
    T* pd = static_cast<T*>(mutable_data(dx));
    parallel_for(xc.numel(), std::is_same_v<T, float> ? 6 : 10, [&](std::int64_t b, std::int64_t e) {
      if constexpr (std::is_same_v<T, float>) gelu_backward_f32(pg + b, px + b, pd + b, e - b);
      else
        for (std::int64_t i = b; i < e; ++i) pd[i] = pg[i] * (normal_cdf(px[i]) + px[i] * normal_pdf(px[i]));
    });
  });
  if (!is_grad_enabled()) return dx;  // a first-order pass: record() would return at once
  const Tensor keep_g = x.requires_grad() ? g : Tensor();  // read only for x's gradient
  record("gelu_backward", {g, x}, dx, {keep_g, x}, [keep_g, x](std::span<const Tensor> gg, const std::vector<bool>& needs) {
    return std::vector<Tensor>{needs[0] ? gelu_backward(gg[0], x) : Tensor(), needs[1] ? gg[0] * keep_g * gelu_curvature(x) : Tensor()};
  });
  return dx;
}

}  // namespace

// GELU in its exact (erf) form, y = x Phi(x) (Phi, phi: the standard normal cdf and density):
// float32 on the kernels of gelu_f32.cpp, float64 with the std:: functions. The node keeps x
// and its backward recomputes the slope where it multiplies by g: the same memory traffic as
// keeping the slope, and a backward that differentiates in x. dx = g (Phi(x) + x phi(x))
Tensor gelu(const Tensor& x) {
  check_floating("gelu", "x", x);
  const Tensor xc = x.is_contiguous() ? x : copy_of(x);
  Tensor y = new_tensor(x.shape(), x.dtype(), "gelu");
  visit_float(x.dtype(), "gelu", [&]<class T>(Tag<T>) {
    const T* px = static_cast<const T*>(xc.raw_data());
    T* py = static_cast<T*>(mutable_data(y));
    // float32 takes about twice exp's time per element, float64 (erf and exp) about ten times.
    parallel_for(xc.numel(), std::is_same_v<T, float> ? 6 : 10, [&](std::int64_t b, std::int64_t e) {
      if constexpr (std::is_same_v<T, float>) gelu_f32(px + b, py + b, e - b);
      else
        for (std::int64_t i = b; i < e; ++i) py[i] = px[i] * normal_cdf(px[i]);
    });
  });
  record_one("gelu", x, y, {x}, [x](const Tensor& g) { return gelu_backward(g, x); });
  return y;
}

}  // namespace tapegrad
