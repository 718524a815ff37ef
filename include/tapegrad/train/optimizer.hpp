// Optimizers, gradient clipping and a learning-rate schedule.
//
// An optimizer holds named parameters (usually module.named_parameters()) and updates them in
// place with the functions of ops/inplace.hpp: the parameters stay the same tensors, so a
// module, a checkpoint and the optimizer all see one set of values. A parameter whose gradient
// is undefined (no backward reached it) is skipped by step(), as in PyTorch.
//
//   tg::AdamW opt(model.named_parameters(), {.lr = 3e-4, .weight_decay = 0.01});
//   for (...) {
//     const tg::Tensor loss = ...;
//     tg::backward(loss);
//     tg::clip_grad_norm(model.parameters(), 1.0);  // or AdamWOptions::max_grad_norm = 1.0
//     opt.step();
//     opt.zero_grad();
//   }
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/layers/module.hpp"

namespace tapegrad {

class Optimizer {
 public:
  // Every parameter must be a floating leaf that requires grad, with a unique non-empty name,
  // and appear once (a tensor listed twice would be updated twice).
  Optimizer(const char* kind, std::vector<NamedTensor> parameters, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  void zero_grad();  // drops every parameter's gradient

  double learning_rate() const noexcept { return lr_; }
  void set_learning_rate(double lr);  // >= 0 and finite
  std::int64_t steps() const noexcept { return steps_; }  // step() calls so far
  const std::vector<NamedTensor>& parameters() const noexcept { return params_; }

  // The optimizer's state for a checkpoint: tensors named "<slot>.<parameter name>" (for
  // example "exp_avg.blocks.0.attn.w_q"), plus steps(). load_state() checks that the names,
  // shapes and dtypes are exactly those state() would give, and that each parameter's step count
  // lies in [0, steps], before it copies the values in.
  std::vector<NamedTensor> state() const;
  void load_state(const std::vector<NamedTensor>& state, std::int64_t steps);

 protected:
  // Adds a zero tensor per parameter (of the parameter's shape and dtype, or with `counter` a
  // rank-0 int64), listed in state() as "<slot>.<name>"; returns its index.
  std::size_t add_slot(const char* slot, bool counter = false);
  std::vector<Tensor>& slot(std::size_t index) { return slots_[index].second; }
  // A step() calls this first: a count already at INT64_MAX (from load_state) cannot go up.
  void check_step_count() const;
  const char* kind_;
  std::vector<NamedTensor> params_;
  double lr_;
  std::int64_t steps_ = 0;

 private:
  std::vector<std::pair<const char*, std::vector<Tensor>>> slots_;
};

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;      // in [0, 1)
  double weight_decay = 0.0;  // L2: adds weight_decay * p to the gradient
  bool nesterov = false;      // needs momentum > 0
};

// g = grad (+ weight_decay p);  v = momentum v + g;  p -= lr (nesterov ? g + momentum v : v)
class SGD : public Optimizer {
 public:
  SGD(std::vector<NamedTensor> parameters, const SgdOptions& options = {});
  void step() override;

 private:
  SgdOptions options_;
  std::size_t velocity_ = 0;  // a slot only with momentum
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  // in [0, 1)
  double eps = 1e-8;                  // > 0
  double weight_decay = 0.0;          // Adam: added to the gradient (L2); AdamW: decoupled
  // > 0: step() first clips the gradients to this global norm, by clip_grad_norm's rule and with
  // its bits, inside the update's one pass over memory (the gradients themselves stay as they
  // are). 0: no clipping.
  double max_grad_norm = 0.0;
};

// m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with g = grad + weight_decay p (L2), and t the number of steps that updated this parameter
// (kept per parameter, as PyTorch does: one first reached late starts its bias correction at 1).
class Adam : public Optimizer {
 public:
  Adam(std::vector<NamedTensor> parameters, const AdamOptions& options = {});
  void step() override;
  // With max_grad_norm: the global gradient norm the last step() found (before clipping), as
  // clip_grad_norm returns it; NaN before the first step.
  double grad_norm() const noexcept { return grad_norm_; }

 protected:
  Adam(const char* kind, std::vector<NamedTensor> parameters, const AdamOptions& options, bool decoupled);

 private:
  AdamOptions options_;
  bool decoupled_;
  std::size_t exp_avg_, exp_avg_sq_, step_;
  double grad_norm_;
};

// AdamW's options: Adam's, with PyTorch's default decoupled weight decay.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double max_grad_norm = 0.0;  // as AdamOptions'
};

// Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr weight_decay p before the
// Adam step, instead of adding weight_decay p to the gradient.
class AdamW : public Adam {
 public:
  AdamW(std::vector<NamedTensor> parameters, const AdamWOptions& options = {});
};

// Scales every gradient by max_norm / (total + 1e-6) when that factor is below 1, as PyTorch's
// clip_grad_norm_ does, `total` being the global L2 norm of all gradients (parameters without a
// gradient count as zero; a tensor listed twice counts once); returns `total` (before
// clipping). A non-finite total leaves the gradients as they are (PyTorch would scale them by
// 0 or NaN): the caller sees it and can skip the step.
double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm);

// Learning rate for step s (counted from 0): linear warm-up peak_lr (s + 1) / warmup while
// s < warmup, then a cosine decay from peak_lr to final_lr, reached at s = total and kept after.
class WarmupCosine {
 public:
  WarmupCosine(double peak_lr, std::int64_t warmup, std::int64_t total, double final_lr = 0.0);
  double operator()(std::int64_t step) const;

 private:
  double peak_, final_;
  std::int64_t warmup_, total_;
};

}  // namespace tapegrad
