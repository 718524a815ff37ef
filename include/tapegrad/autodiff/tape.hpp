// The tape: the graph of the ops run while grad mode is on, and backward through it.
//
// An op is recorded only when grad mode is on and at least one of its inputs requires a
// gradient. Its node records where each input's gradient goes and keeps what its backward needs.
//
// Lifetime: the graph belongs to the tensors. A non-leaf keeps the node that made it alive, and
// a node keeps the nodes of its inputs, so a step's graph is freed as soon as its last tensor is
// gone (the loss, the outputs, any intermediate you kept), whether or not backward ran. A
// training loop therefore needs no call to stay flat in memory. Keep `loss.item()` or
// `loss.detach()`, not `loss`, when you log a value across steps: a kept tensor keeps its graph.
// backward does not free the graph: it may run again on the same outputs.
//
// Each thread also has a list of its live nodes, its "tape": clear_tape() releases every node
// recorded on this thread at once (their saved tensors are freed and their outputs stop
// requiring grad), and tape_size() counts them.
//
// Backward visits the nodes reachable from the outputs newest first (creation order is a
// topological order): no recursion, no depth limit. Graphs may be handed between threads, but
// one graph must not be used by two threads at once.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// See BackwardOptions::on_gradient_ready.
using GradientReadyHook = std::function<void(const Tensor& leaf, const Tensor& gradient)>;

struct BackwardOptions {
  // Record the backward pass itself, so that the gradients it produces have a graph and can be
  // differentiated again (gradients of gradients, Hessian-vector products). Off: nothing extra
  // is recorded. A leaf's .grad then holds a graph that holds the leaf: zero_grad() frees it;
  // grad() below returns the gradients instead and leaves .grad alone.
  bool create_graph = false;
  // Called during the pass, on the calling thread, once for each leaf the pass reaches that
  // requires grad, as soon as that leaf's gradient for this pass is complete (every node of the
  // pass that sends to it has run), with that gradient: this pass's total for the leaf, before it
  // is added to .grad (which happens only when the whole pass succeeded). Data-parallel training
  // starts reducing a gradient here while the backward goes on; an optimizer can update a
  // parameter here while its gradient is in cache. If the hook throws, the pass stops, the
  // exception propagates and no .grad changes.
  GradientReadyHook on_gradient_ready = nullptr;  // initialized, so `{.create_graph = true}` warns of no missing field
};

// Runs backward from a scalar (one-element) tensor with upstream gradient 1.
void backward(const Tensor& output);
// Runs backward from several outputs at once, each with its upstream gradient (same shape and
// dtype as its output), like torch.autograd.backward(tensors, grad_tensors). Gradients are
// accumulated (+=) into the leaves reached, and only when the whole pass succeeded.
//
// Re-entrancy: an op's backward may run ops with grad mode switched back on (EnableGradGuard)
// and may call backward or gradcheck itself (a nested pass); both are supported. It may not call
// clear_tape(), which throws a GraphError while a pass runs on its thread.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs,
              const BackwardOptions& options = {});

struct GradOptions {
  bool create_graph = false;  // as in BackwardOptions
  // An input that no gradient reaches gets an undefined Tensor instead of a GraphError.
  bool allow_unused = false;
};
// The gradients of `inputs` (leaves or intermediate tensors that require grad), one per input,
// like torch.autograd.grad: .grad is not touched. `grad_outputs` as for backward; left empty,
// every output must have one element and gets gradient 1. Only the nodes between the outputs
// and the inputs run.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, const GradOptions& options = {});

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

// Releases every node recorded on this thread that is still alive (see above).
void clear_tape();
// The number of live nodes recorded on this thread.
std::size_t tape_size() noexcept;

// ---- Defining an op --------------------------------------------------------------------------
// Every built-in op uses this, and so can a user's own op.
//
// A backward receives the gradient of every output (an undefined Tensor for an output that no
// gradient reached, only possible with several outputs) and which inputs need a gradient. It
// returns one gradient per input, each of that input's shape and dtype, or an undefined Tensor
// where none is needed. It runs with grad mode off, or on in a create_graph pass: a backward
// written in recorded ops (of the inputs it captured and of the upstream gradients) is then
// differentiable; one that computes with raw loops returns gradients without history, and the
// second-order terms through it are missing. Every built-in op's backward is differentiable.
//
// What a backward captures stays alive as long as the node. Capture an output as
// `out.detach()`, never `out` itself: an output holds its node, so the node would hold itself
// and never be freed (until clear_tape()).
using BackwardFn = std::function<std::vector<Tensor>(std::span<const Tensor> grad_outputs,
                                                     const std::vector<bool>& needs_grad)>;

// True when an op with these inputs would be recorded (grad mode on, some input requires grad).
bool should_record(std::span<const Tensor> inputs);
// Records a node. When should_record(inputs) is false it does nothing and returns false;
// otherwise it marks `outputs` as produced by this node (they then require grad) and returns
// true. Inputs that do not require grad get no gradient. Outputs must be new tensors (not a
// leaf that requires grad, an input, or another op's output).
//
// `saved` lists the tensors the backward reads (inputs, outputs or views of them). Their
// storage's version is noted now; an in-place write to any of them before backward makes
// backward throw a GraphError naming this op, instead of returning a wrong gradient. Without
// `saved`, every input and output counts as read.
bool record_op(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs,
               BackwardFn backward, std::span<const Tensor> saved);
bool record_op(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs,
               BackwardFn backward);

}  // namespace tapegrad
