// Elementwise arithmetic and activations. Binary ops broadcast (NumPy rules); floating inputs
// must share one dtype. Scalar overloads use the tensor's dtype.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
// 1 / (1 + e^-x), and SiLU (swish) x * sigmoid(x), Llama's gate.
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
// |x|; its gradient is sign(x), 0 at x = 0 (PyTorch's subgradient).
Tensor abs(const Tensor& x);
// Exact GELU, x * Phi(x) with the normal CDF (PyTorch's default, approximate='none').
Tensor gelu(const Tensor& x);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
// a - b and a / b as one op each, with a as a rank-0 tensor of b's dtype (broadcast).
inline Tensor operator-(double a, const Tensor& b) { return sub(scalar(a, b.dtype()), b); }
inline Tensor operator/(double a, const Tensor& b) { return div(scalar(a, b.dtype()), b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace tapegrad
