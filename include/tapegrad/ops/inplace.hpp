// In-place updates: the one safe way to change a tensor's values after it exists (optimizer
// steps, initialisation, gradient clipping, loading a checkpoint).
//
// They are not differentiable and never record, whatever the grad mode, so an optimizer needs
// no NoGradGuard around them. Each bumps the version of dst's storage: a recorded op that saved
// dst (or a view of it) for its backward then refuses to run that backward, with a GraphError
// naming the op, instead of returning a gradient computed from the new values.
//
// `dst` must be a leaf (a parameter, a gradient, an optimizer's state, anything made under
// NoGradGuard), not the output of a recorded op whose graph is alive (changing it would make
// that graph lie), and not an expanded view (several of its elements at one address). Tensor
// arguments broadcast to dst's shape and have dst's dtype; one that overlaps dst's memory is
// read completely before dst is written.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

void copy_(const Tensor& dst, const Tensor& src);  // dst = src (any dtype, the same for both)
void fill_(const Tensor& dst, double value);       // dst = value (any dtype)
void zero_(const Tensor& dst);                     // dst = 0 (any dtype)
// Floating dst only:
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);                  // dst += alpha src
void mul_(const Tensor& dst, double factor);                                          // dst *= factor
void mul_(const Tensor& dst, const Tensor& src);                                      // dst *= src
void addcmul_(const Tensor& dst, const Tensor& a, const Tensor& b, double value = 1.0);  // dst += value a b
void addcdiv_(const Tensor& dst, const Tensor& a, const Tensor& b, double value = 1.0);  // dst += value a / b
// dst += weight (end - dst), as PyTorch evaluates it (end - (end - dst) (1 - weight) for a weight of
// magnitude 0.5 or more, which gives end exactly at weight 1)
void lerp_(const Tensor& dst, const Tensor& end, double weight);

// One Adam (or AdamW) step of one parameter, in place: the update tapegrad's Adam and AdamW run
// for each parameter, in one pass (docs/training.md has the formula and its order). param, grad,
// exp_avg and exp_avg_sq have one shape and floating dtype; every input is read before anything
// is written, whatever shares memory with what.
struct AdamStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled = false;  // AdamW: param *= 1 - lr weight_decay first; else weight_decay param joins grad
  double step = 1;         // t: the updates of this parameter so far, this one included (>= 1)
  double grad_scale = 1;   // grad is read as grad * grad_scale (a clipping factor, in grad's dtype)
};
void adam_update_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamStep& s);

}  // namespace tapegrad
