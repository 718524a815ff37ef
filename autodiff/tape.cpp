// The per-thread tape: recording ops and running them backward.
#include "tapegrad/autodiff/tape.hpp"

#include <atomic>
#include <unordered_map>

#include "autodiff/check.hpp"
#include "autodiff/tensor_impl.hpp"
#include "ops/kernel.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad {
namespace detail {
namespace {

// Where an input's gradient goes: into a leaf's .grad, or into output `slot` of an earlier node.
struct Edge {
  std::shared_ptr<TensorImpl> leaf;
  std::int64_t node = -1;
  std::int32_t slot = 0;
};

struct OutputMeta {
  Shape shape;
  DType dtype;
};

struct Node {
  const char* name;
  std::vector<Edge> inputs;
  std::vector<bool> needs_grad;
  std::vector<OutputMeta> outputs;
  BackwardFn backward;
};

// Epochs are unique across threads, so a tensor recorded on one thread's tape is never mistaken
// for a live node of another's, even when a thread-local tape reuses a dead thread's address.
std::atomic<std::uint64_t> next_epoch{1};

struct Tape {
  std::vector<Node> nodes;
  std::uint64_t epoch = next_epoch.fetch_add(1);
};

thread_local Tape tape;
thread_local bool grad_enabled = true;

void accumulate(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add(slot, g) : g; }

// Leaf gradients of one backward pass, applied to the leaves only once the whole pass has
// succeeded: a backward that throws half-way leaves every .grad as it was.
class LeafGradients {
 public:
  void add(const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
    auto [it, inserted] = index_.try_emplace(leaf.get(), pending_.size());
    if (inserted) pending_.emplace_back(leaf, g);
    else pending_[it->second].second = tapegrad::add(pending_[it->second].second, g);
  }
  void apply() {
    for (auto& [leaf, g] : pending_) {
      if (leaf->grad.defined()) {
        leaf->grad = tapegrad::add(leaf->grad, g);
        continue;
      }
      // Keep g itself only when nothing else can see its storage: a leaf's gradient must not
      // alias an upstream gradient the caller still holds, nor be a broadcast (stride 0) view.
      const bool exclusive = g.is_contiguous() && g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1;
      leaf->grad = exclusive ? std::move(g) : clone(g);
    }
  }

 private:
  std::vector<std::pair<std::shared_ptr<TensorImpl>, Tensor>> pending_;
  std::unordered_map<const TensorImpl*, std::size_t> index_;
};

}  // namespace

bool has_live_node(const TensorImpl& impl) noexcept {
  return impl.node >= 0 && impl.tape == &tape && impl.epoch == tape.epoch &&
         impl.node < static_cast<std::int64_t>(tape.nodes.size());
}

}  // namespace detail

using detail::fail;
using detail::shape_str;

bool is_grad_enabled() noexcept { return detail::grad_enabled; }
GradModeGuard::GradModeGuard(bool enabled) noexcept : previous_(detail::grad_enabled) { detail::grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { detail::grad_enabled = previous_; }

void clear_tape() {
  detail::tape.nodes.clear();
  detail::tape.epoch = detail::next_epoch.fetch_add(1);
}
std::size_t tape_size() noexcept { return detail::tape.nodes.size(); }

bool should_record(std::span<const Tensor> inputs) {
  if (!detail::grad_enabled) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool record_op(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs,
               BackwardFn backward) {
  if (!should_record(inputs)) return false;
  auto& tape = detail::tape;
  const auto index = static_cast<std::int64_t>(tape.nodes.size());
  detail::Node node{name, {}, {}, {}, std::move(backward)};
  node.inputs.reserve(inputs.size());
  node.needs_grad.reserve(inputs.size());
  for (const auto& t : inputs) {
    detail::Edge e;
    if (t.defined()) {
      auto* impl = t.impl();
      if (detail::has_live_node(*impl)) {
        e.node = impl->node;
        e.slot = impl->slot;
      } else if (impl->leaf_requires_grad) {
        e.leaf = t.impl_ptr();
      }
    }
    node.needs_grad.push_back(e.leaf != nullptr || e.node >= 0);
    node.inputs.push_back(std::move(e));
  }
  // Check every output before touching any, so a failure leaves no half-recorded node behind.
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined()) fail<Error>("{}: output {} is an undefined tensor", name, k);
    if (!is_floating(outputs[k].dtype()))
      fail<DTypeError>("{}: output {} is {}; only floating outputs can carry gradient", name, k, outputs[k].dtype());
  }
  node.outputs.reserve(outputs.size());
  for (const auto& out : outputs) node.outputs.push_back({out.shape(), out.dtype()});
  tape.nodes.push_back(std::move(node));
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    auto* impl = outputs[k].impl();
    impl->leaf_requires_grad = false;
    impl->node = index;
    impl->slot = static_cast<std::int32_t>(k);
    impl->tape = &tape;
    impl->epoch = tape.epoch;
  }
  return true;
}

void backward(const Tensor& output) {
  detail::check_defined("backward", "output", output);
  if (output.numel() != 1)
    fail<ShapeError>("backward: argument 'output' must have exactly one element to start from an "
                     "implicit gradient of 1, got shape {}; pass grad_outputs for a non-scalar output",
                     shape_str(output.shape()));
  backward({output}, {ones(output.shape(), output.dtype())});
}

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
  if (outputs.size() != grad_outputs.size())
    fail<ValueError>("backward: got {} outputs but {} grad_outputs; give one gradient per output",
                     outputs.size(), grad_outputs.size());
  auto& tape = detail::tape;
  std::int64_t last = -1;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    const Tensor& g = grad_outputs[i];
    if (!out.defined()) fail<Error>("backward: outputs[{}] is an undefined tensor", i);
    if (!out.requires_grad())
      fail<GraphError>("backward: outputs[{}] (shape {}, {}) does not require grad: no input of the "
                       "ops that made it requires grad, it was made under NoGradGuard, or its tape "
                       "was cleared",
                       i, shape_str(out.shape()), out.dtype());
    if (!g.defined()) fail<Error>("backward: grad_outputs[{}] is an undefined tensor", i);
    if (g.shape() != out.shape() || g.dtype() != out.dtype())
      fail<ShapeError>("backward: grad_outputs[{}] must match outputs[{}]: expected {} {}, got {} {}",
                       i, i, out.dtype(), shape_str(out.shape()), g.dtype(), shape_str(g.shape()));
    if (detail::has_live_node(*out.impl())) last = std::max(last, out.impl()->node);
  }

  NoGradGuard no_grad;
  detail::LeafGradients leaves;
  std::vector<std::vector<Tensor>> pending(static_cast<std::size_t>(last + 1));
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    auto* impl = outputs[i].impl();
    if (!detail::has_live_node(*impl)) {
      leaves.add(outputs[i].impl_ptr(), grad_outputs[i]);
      continue;
    }
    auto& slots = pending[static_cast<std::size_t>(impl->node)];
    slots.resize(tape.nodes[static_cast<std::size_t>(impl->node)].outputs.size());
    detail::accumulate(slots[static_cast<std::size_t>(impl->slot)], grad_outputs[i]);
  }

  for (std::int64_t n = last; n >= 0; --n) {
    auto& slots = pending[static_cast<std::size_t>(n)];
    if (slots.empty()) continue;
    const detail::Node& node = tape.nodes[static_cast<std::size_t>(n)];
    std::vector<Tensor> grads = node.backward(slots, node.needs_grad);
    slots = {};  // release this node's upstream gradients as soon as they are used
    if (grads.size() != node.inputs.size())
      fail<GraphError>("backward of {}: returned {} gradients for {} inputs", node.name,
                       grads.size(), node.inputs.size());
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const Tensor& g = grads[k];
      const detail::Edge& e = node.inputs[k];
      if (!g.defined() || !node.needs_grad[k]) continue;
      // What the gradient must look like: the input itself (a leaf) or the output it came from.
      const detail::OutputMeta& want = e.leaf ? detail::OutputMeta{e.leaf->shape, e.leaf->dtype}
                                              : tape.nodes[static_cast<std::size_t>(e.node)].outputs[static_cast<std::size_t>(e.slot)];
      if (g.shape() != want.shape || g.dtype() != want.dtype)
        fail<GraphError>("backward of {}: gradient for input {} must be {} {}, got {} {}", node.name,
                         k, want.dtype, shape_str(want.shape), g.dtype(), shape_str(g.shape()));
      if (e.leaf) {
        leaves.add(e.leaf, g);
      } else {
        auto& target = pending[static_cast<std::size_t>(e.node)];
        target.resize(tape.nodes[static_cast<std::size_t>(e.node)].outputs.size());
        detail::accumulate(target[static_cast<std::size_t>(e.slot)], g);
      }
    }
  }
  leaves.apply();
}

}  // namespace tapegrad
