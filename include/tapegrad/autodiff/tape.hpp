// The tape: a Wengert list of the ops run while grad mode is on.
//
// Each thread has its own tape. An op is recorded only when grad mode is on and at least one of
// its inputs requires a gradient. Nodes are stored in creation order, which is already a
// topological order, so backward is one reverse walk: no sort, no recursion, no depth limit.
//
// The tape grows until clear_tape(): that releases every saved tensor and detaches every
// non-leaf tensor recorded so far (its requires_grad() becomes false). A training loop calls it
// once per step, after the optimizer update, so its memory stays flat.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Runs backward from a scalar (one-element) tensor with upstream gradient 1.
void backward(const Tensor& output);
// Runs backward from several outputs at once, each with its upstream gradient (same shape and
// dtype as its output), like torch.autograd.backward(tensors, grad_tensors). Gradients are
// accumulated (+=) into the leaves reached. The tape is kept: call clear_tape() when done.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs);

// Grad mode is on by default.
bool is_grad_enabled() noexcept;
// Sets this thread's grad mode for its lifetime and restores the previous mode after.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) noexcept;
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};
// Records nothing while it lives (like torch.no_grad).
struct NoGradGuard : GradModeGuard {
  NoGradGuard() noexcept : GradModeGuard(false) {}
};
// Records again while it lives, inside a NoGradGuard too (like torch.enable_grad).
struct EnableGradGuard : GradModeGuard {
  EnableGradGuard() noexcept : GradModeGuard(true) {}
};

void clear_tape();               // this thread's tape
std::size_t tape_size() noexcept;  // number of recorded nodes on this thread's tape

// ---- Defining an op --------------------------------------------------------------------------
// Every built-in op uses this, and so can a user's own op.
//
// A backward receives the gradient of every output (an undefined Tensor for an output that no
// gradient reached, only possible with several outputs) and which inputs need a gradient. It
// returns one gradient per input, each of that input's shape and dtype, or an undefined Tensor
// where none is needed. It runs with grad mode off.
using BackwardFn = std::function<std::vector<Tensor>(std::span<const Tensor> grad_outputs,
                                                     const std::vector<bool>& needs_grad)>;

// True when an op with these inputs would be recorded (grad mode on, some input requires grad).
bool should_record(std::span<const Tensor> inputs);
// Records a node. When should_record(inputs) is false it does nothing and returns false;
// otherwise it marks `outputs` as produced by this node (they then require grad) and returns
// true. Inputs that do not require grad get no gradient.
bool record_op(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs,
               BackwardFn backward);

}  // namespace tapegrad
