// Unary elementwise ops. Each is a small struct: the forward f(x) and the local derivative
// df(x, y) = dy/dx, side by side; the shared backward is dx = g * df(x, y). `uses_x`/`uses_y`
// say which of input and output the derivative reads, so only those are kept on the tape (and
// read by the backward loop). `cost` is the price per element relative to a copy, which decides
// when a loop is split over threads. float32 exp and tanh use the vectorisable functions of
// fast_math.hpp; float64 keeps the std:: functions. GELU, which keeps its slope, is written out
// at the end.
#include <cmath>
#include <type_traits>

#include "kernels/fast_math.hpp"
#include "kernels/gelu_f32.hpp"
#include "ops/op.hpp"
#include "runtime/parallel.hpp"
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
// GELU in its exact (erf) form, y = x Phi(x) (Phi, phi: the standard normal cdf and density):
// float32 on the kernels of gelu_f32.cpp, float64 with the std:: functions. Recorded, the
// forward also makes the slope y' = Phi(x) + x phi(x) (one exponential gives both) and the node
// keeps it instead of x, so the backward is one multiply. dx = g (Phi(x) + x phi(x))
Tensor gelu(const Tensor& x) {
  check_floating("gelu", "x", x);
  const bool keep_slope = should_record({&x, 1});
  const Tensor xc = x.is_contiguous() ? x : copy_of(x);
  Tensor y = new_tensor(x.shape(), x.dtype(), "gelu"), slope = keep_slope ? new_tensor(x.shape(), x.dtype(), "gelu") : Tensor();
  visit_float(x.dtype(), "gelu", [&]<class T>(Tag<T>) {
    const T* px = static_cast<const T*>(xc.raw_data());
    T* py = static_cast<T*>(mutable_data(y));
    T* ps = keep_slope ? static_cast<T*>(mutable_data(slope)) : nullptr;
    // float32 takes about twice exp's time per element, float64 (erf and exp) about ten times.
    parallel_for(xc.numel(), std::is_same_v<T, float> ? 6 : 10, [&](std::int64_t b, std::int64_t e) {
      if constexpr (std::is_same_v<T, float>) {
        if (keep_slope) gelu_slope_f32(px + b, py + b, ps + b, e - b);
        else gelu_f32(px + b, py + b, e - b);
      } else {
        for (std::int64_t i = b; i < e; ++i) {
          const double cdf = normal_cdf(px[i]);
          py[i] = px[i] * cdf;
          if (keep_slope) ps[i] = cdf + px[i] * normal_pdf(px[i]);
        }
      }
    });
  });
  record("gelu", {x}, y, {slope}, [slope](std::span<const Tensor> g, const std::vector<bool>&) { return std::vector<Tensor>{g[0] * slope}; });
  return y;
}

}  // namespace tapegrad
