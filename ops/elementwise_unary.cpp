// Unary elementwise ops. Each is a small struct: the forward f(x) and the local derivative
// df(x, y) = dy/dx, side by side; the shared backward is dx = g * df(x, y). `uses_x`/`uses_y`
// say which of input and output the derivative reads, so only those are kept on the tape (and
// read by the backward loop). `cost` is the price per element relative to a copy, which decides
// when a loop is split over threads. float32 exp and tanh use the vectorisable functions of
// fast_math.hpp, float32 GELU the kernels of gelu_f32.cpp; float64 keeps the std:: functions.
#include <cmath>

#include "kernels/fast_math.hpp"
#include "kernels/gelu_f32.hpp"
#include "ops/op.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad {
namespace {
using namespace detail;

struct Neg {
  static constexpr const char* name = "neg";
  static constexpr bool uses_x = false, uses_y = false;
  static constexpr std::int64_t cost = 1;
  template <class T> T f(T x) const { return -x; }
  template <class T> T df(T, T) const { return T(-1); }
};
struct Exp {
  static constexpr const char* name = "exp";
  static constexpr bool uses_x = false, uses_y = true;
  static constexpr std::int64_t cost = 4;
  template <class T> T f(T x) const {
    if constexpr (std::is_same_v<T, float>) return exp_f32(x);
    else return std::exp(x);
  }
  template <class T> T df(T, T y) const { return y; }  // (e^x)' = e^x
};
struct Log {
  static constexpr const char* name = "log";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr std::int64_t cost = 8;
  template <class T> T f(T x) const { return std::log(x); }
  template <class T> T df(T x, T) const { return T(1) / x; }
};
struct Sqrt {
  static constexpr const char* name = "sqrt";
  static constexpr bool uses_x = false, uses_y = true;
  static constexpr std::int64_t cost = 2;
  template <class T> T f(T x) const { return std::sqrt(x); }
  template <class T> T df(T, T y) const { return T(0.5) / y; }  // 1 / (2 sqrt x)
};
struct Pow {
  static constexpr const char* name = "pow";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr std::int64_t cost = 16;
  double p;
  template <class T> T f(T x) const { return std::pow(x, convert<T>(p)); }
  // p x^(p-1); exactly 0 for p = 0, where x^(-1) at x = 0 would turn 0 * inf into NaN (so
  // then x is not read, nor kept).
  template <class T> T df(T x, T) const {
    return p == 0.0 ? T(0) : convert<T>(p) * std::pow(x, convert<T>(p - 1.0));
  }
  bool reads_x() const { return p != 0.0; }
};
struct Tanh {
  static constexpr const char* name = "tanh";
  static constexpr bool uses_x = false, uses_y = true;
  static constexpr std::int64_t cost = 6;
  template <class T> T f(T x) const {
    if constexpr (std::is_same_v<T, float>) return tanh_f32(x);
    else return std::tanh(x);
  }
  template <class T> T df(T, T y) const { return T(1) - y * y; }
};
struct Relu {
  static constexpr const char* name = "relu";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr std::int64_t cost = 1;
  template <class T> T f(T x) const { return x < T(0) ? T(0) : x; }  // NaN stays NaN, as in PyTorch
  template <class T> T df(T x, T) const { return x > T(0) ? T(1) : T(0); }  // 0 at the kink, as PyTorch
};
// GELU in its exact (erf) form, x Phi(x). The generic form serves float64; float32 takes the
// kernels of gelu_f32.cpp (gelu below).
struct Gelu {
  static constexpr const char* name = "gelu";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr std::int64_t cost = 10;
  // Only float64 comes here (float32 takes gelu_f32 below).
  template <class T> T f(T x) const { return x * static_cast<T>(normal_cdf(x)); }
  // (x Phi(x))' = Phi(x) + x phi(x), phi the normal density
  template <class T> T df(T x, T) const { return static_cast<T>(normal_cdf(x) + x * normal_pdf(x)); }
};

// float32 GELU (gelu_f32.cpp) takes about twice exp's time per element. Its kernels want
// contiguous arrays, so a strided x or upstream gradient is copied first.
constexpr std::int64_t kGeluF32Cost = 6;

Tensor gelu_f32(const Tensor& x) {
  Tensor y = new_tensor(x.shape(), x.dtype(), "gelu");
  {
    const Tensor xc = x.is_contiguous() ? x : copy_of(x);
    const auto* px = static_cast<const float*>(xc.raw_data());
    float* py = static_cast<float*>(mutable_data(y));
    parallel_for(xc.numel(), kGeluF32Cost, [&](std::int64_t b, std::int64_t e) { detail::gelu_f32(px + b, py + b, e - b); });
  }
  // dx = g (Phi(x) + x phi(x))
  record("gelu", {x}, y, {x}, [x](std::span<const Tensor> g, const std::vector<bool>&) {
    const Tensor xc = x.is_contiguous() ? x : copy_of(x), gc = g[0].is_contiguous() ? g[0] : copy_of(g[0]);
    Tensor dx = new_tensor(gc.shape(), gc.dtype(), "gelu");
    const auto* px = static_cast<const float*>(xc.raw_data());
    const auto* pg = static_cast<const float*>(gc.raw_data());
    float* pd = static_cast<float*>(mutable_data(dx));
    parallel_for(xc.numel(), kGeluF32Cost, [&](std::int64_t b, std::int64_t e) { gelu_backward_f32(pg + b, px + b, pd + b, e - b); });
    return std::vector<Tensor>{dx};
  });
  return y;
}

// Whether op's derivative reads x (an op may say so per instance, as pow does).
template <class Op> bool reads_x(const Op& op) {
  if constexpr (requires { op.reads_x(); }) return Op::uses_x && op.reads_x();
  else return Op::uses_x;
}

template <class Op> Tensor unary(const Tensor& x, Op op = {}) {
  check_floating(Op::name, "x", x);
  Tensor y = new_tensor(x.shape(), x.dtype(), Op::name);
  visit_float(x.dtype(), Op::name, [&]<class T>(Tag<T>) {
    map_into_cost<T, T>(Op::cost, y, [&](T v) { return op.template f<T>(v); }, x);
  });
  // dx = g * df(x, y)
  const Tensor xs = reads_x(op) ? x : Tensor();
  record(Op::name, {x}, y, {xs, Op::uses_y ? y : Tensor()},
         [op, xs, ys = Op::uses_y ? y.detach() : Tensor()](
             std::span<const Tensor> g, const std::vector<bool>&) {
           Tensor dx = new_tensor(g[0].shape(), g[0].dtype(), Op::name);
           // Only the operands the derivative reads are streamed through the loop.
           visit_float(dx.dtype(), Op::name, [&]<class T>(Tag<T>) {
             if constexpr (Op::uses_x && Op::uses_y)
               map_into_cost<T, T, T, T>(Op::cost, dx, [&](T gv, T xv, T yv) { return gv * op.template df<T>(xv, yv); }, g[0], xs, ys);
             else if constexpr (Op::uses_x)
               if (xs.defined()) map_into_cost<T, T, T>(Op::cost, dx, [&](T gv, T xv) { return gv * op.template df<T>(xv, T(0)); }, g[0], xs);
               else map_into<T, T>(dx, [&](T gv) { return gv * op.template df<T>(T(0), T(0)); }, g[0]);
             else if constexpr (Op::uses_y)
               map_into_cost<T, T, T>(1, dx, [&](T gv, T yv) { return gv * op.template df<T>(T(0), yv); }, g[0], ys);
             else
               map_into<T, T>(dx, [&](T gv) { return gv * op.template df<T>(T(0), T(0)); }, g[0]);
           });
           return std::vector<Tensor>{dx};
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
  return unary<Pow>(x, Pow{exponent});
}
Tensor tanh(const Tensor& x) { return unary<Tanh>(x); }
Tensor relu(const Tensor& x) { return unary<Relu>(x); }
Tensor gelu(const Tensor& x) {
  check_floating(Gelu::name, "x", x);
  return x.dtype() == float32 ? gelu_f32(x) : unary<Gelu>(x);
}

}  // namespace tapegrad
