// The per-thread tape: recording ops, running them backward, and releasing them.
#include "tapegrad/autodiff/tape.hpp"

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "autodiff/check.hpp"
#include "autodiff/kernel.hpp"
#include "autodiff/node.hpp"

namespace tapegrad {
namespace detail {

// The live nodes recorded on one thread. Locked because a node made on this thread may be
// destroyed on another (tensors can be handed between threads).
struct Tape {
  std::mutex mutex;
  Node* head = nullptr;
  std::size_t size = 0;

  void link(Node* n) {
    std::lock_guard lock(mutex);
    n->next = head;
    if (head) head->prev = n;
    head = n;
    ++size;
  }
  void unlink(Node* n) {
    std::lock_guard lock(mutex);
    if (n->released) return;  // clear_tape() already took it off the list
    (n->prev ? n->prev->next : head) = n->next;
    if (n->next) n->next->prev = n->prev;
    --size;
  }
};

namespace {

std::atomic<std::uint64_t> next_sequence{1};
thread_local bool grad_enabled = true;
thread_local int backward_depth = 0;  // > 0 while a backward pass runs on this thread

const std::shared_ptr<Tape>& this_tape() {
  thread_local const std::shared_ptr<Tape> tape = std::make_shared<Tape>();
  return tape;
}

// Pieces of a graph waiting to be destroyed by the outermost ~Node running on this thread.
// Destroying a node's inputs (or its backward's saved tensors, which hold their own nodes) from
// inside its destructor would recurse once per op along a chain.
struct Graveyard {
  std::vector<std::shared_ptr<Node>> nodes;
  std::vector<BackwardFn> backwards;
};
thread_local Graveyard* active_graveyard = nullptr;

struct BackwardDepth {
  BackwardDepth() noexcept { ++backward_depth; }
  ~BackwardDepth() { --backward_depth; }
};

// Leaf gradients of one backward pass, applied to the leaves only once the whole pass has
// succeeded: a backward that throws half-way leaves every .grad as it was.
class LeafGradients {
 public:
  void add(const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
    auto [it, inserted] = index_.try_emplace(leaf.get(), pending_.size());
    if (inserted) pending_.emplace_back(leaf, g);
    else pending_[it->second].second = add_same_shape(pending_[it->second].second, g);
  }
  void apply() {
    for (auto& [leaf, g] : pending_) {
      if (leaf->grad.defined()) {
        leaf->grad = add_same_shape(leaf->grad, g);
        continue;
      }
      // Keep g itself only when nothing else can see its storage: a leaf's gradient must not
      // alias an upstream gradient the caller still holds, nor be a broadcast (stride 0) view.
      // Nor may it carry a graph (a backward that ran its ops under EnableGradGuard): those
      // nodes can hold the leaf itself, a cycle that only clear_tape() would break.
      const bool exclusive = g.is_contiguous() && g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 &&
                             live_node(*g.impl()) == nullptr;
      leaf->grad = exclusive ? std::move(g) : copy_of(g);
    }
  }

 private:
  std::vector<std::pair<std::shared_ptr<TensorImpl>, Tensor>> pending_;
  std::unordered_map<const TensorImpl*, std::size_t> index_;
};

void accumulate(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add_same_shape(slot, g) : g; }

std::string describe(const Tensor& t, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const std::string layout = fmt::format("{} {}", shape_str(t.shape()), t.dtype());
  auto find = [&](std::span<const Tensor> list, const char* kind, bool same_tensor) -> std::string {
    for (std::size_t k = 0; k < list.size(); ++k) {
      if (!list[k].defined()) continue;
      if (same_tensor ? list[k].impl() == t.impl() : list[k].shares_storage_with(t))
        return fmt::format("{}{} {}", same_tensor ? "" : "a view of ", kind, k);
    }
    return {};
  };
  for (bool same : {true, false})
    for (auto [list, kind] : {std::pair{inputs, "input"}, {outputs, "output"}})
      if (auto s = find(list, kind, same); !s.empty()) return fmt::format("{} ({})", s, layout);
  return fmt::format("a saved tensor ({})", layout);
}

void check_saved_versions(const Node& node) {
  for (const SavedVersion& s : node.saved) {
    const auto storage = s.storage.lock();
    if (!storage) continue;  // the backward does not hold it, so it cannot read it
    const std::uint64_t now = storage->version.load(std::memory_order_relaxed);
    if (now != s.version)
      fail<GraphError>(
          "backward of {}: {} was modified in place after {} was recorded (version {}, now {}), so its "
          "gradient would be wrong; run backward before updating it, or update a clone()",
          node.name, s.what, node.name, s.version, now);
  }
}

}  // namespace

Node::~Node() {
  if (tape) tape->unlink(this);
  if (active_graveyard != nullptr) {
    for (auto& e : inputs)
      if (e.node) active_graveyard->nodes.push_back(std::move(e.node));
    if (backward) active_graveyard->backwards.push_back(std::move(backward));
    return;
  }
  Graveyard local;
  for (auto& e : inputs)
    if (e.node) local.nodes.push_back(std::move(e.node));
  if (backward) local.backwards.push_back(std::move(backward));
  active_graveyard = &local;
  while (!local.nodes.empty() || !local.backwards.empty()) {
    if (!local.backwards.empty()) {
      BackwardFn doomed = std::move(local.backwards.back());
      local.backwards.pop_back();
    } else {
      std::shared_ptr<Node> doomed = std::move(local.nodes.back());
      local.nodes.pop_back();
    }
  }
  active_graveyard = nullptr;
}

Node* live_node(const TensorImpl& impl) noexcept {
  Node* n = impl.grad_fn.get();
  return n != nullptr && !n->released ? n : nullptr;
}

}  // namespace detail

using detail::fail;
using detail::shape_str;

bool is_grad_enabled() noexcept { return detail::grad_enabled; }
GradModeGuard::GradModeGuard(bool enabled) noexcept : previous_(detail::grad_enabled) { detail::grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { detail::grad_enabled = previous_; }

void clear_tape() {
  if (detail::backward_depth > 0)
    fail<GraphError>("clear_tape: called from inside a backward pass on this thread (by an op's backward); the "
                     "graph being differentiated cannot be released under it. Call clear_tape() after backward returns");
  detail::Tape& tape = *detail::this_tape();
  // Taken off the nodes under the lock, destroyed after it: destroying them frees other nodes,
  // whose destructors take the lock.
  std::vector<detail::Edge> inputs;
  std::vector<BackwardFn> backwards;
  {
    std::lock_guard lock(tape.mutex);
    for (detail::Node* n = tape.head; n != nullptr;) {
      detail::Node* next = n->next;
      n->released = true;
      n->prev = n->next = nullptr;
      for (auto& e : n->inputs) inputs.push_back(std::move(e));
      n->inputs.clear();
      n->saved.clear();
      if (n->backward) backwards.push_back(std::move(n->backward));
      n->backward = nullptr;
      n = next;
    }
    tape.head = nullptr;
    tape.size = 0;
  }
}

std::size_t tape_size() noexcept {
  detail::Tape& tape = *detail::this_tape();
  std::lock_guard lock(tape.mutex);
  return tape.size;
}

bool should_record(std::span<const Tensor> inputs) {
  if (!detail::grad_enabled) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool record_op(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs, BackwardFn backward,
               std::span<const Tensor> saved) {
  if (!should_record(inputs)) return false;
  // Check every output before touching any, so a failure leaves nothing half-recorded.
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    if (!out.defined()) fail<Error>("{}: output {} is an undefined tensor", name, k);
    if (!is_floating(out.dtype()))
      fail<DTypeError>("{}: output {} is {}; only floating outputs can carry gradient", name, k, out.dtype());
    if (out.requires_grad())
      fail<GraphError>("{}: output {} (shape {}) already requires grad (a leaf, an input, or the output of another "
                       "recorded op); an op's outputs must be new tensors",
                       name, k, shape_str(out.shape()));
  }
  auto node = std::make_shared<detail::Node>();
  node->name = name;
  node->inputs.reserve(inputs.size());
  node->needs_grad.reserve(inputs.size());
  for (const auto& t : inputs) {
    detail::Edge e;
    if (t.defined()) {
      const auto& impl = *t.impl();
      if (detail::live_node(impl) != nullptr) {
        e.node = impl.grad_fn;
        e.slot = impl.slot;
      } else if (impl.leaf_requires_grad) {
        e.leaf = t.impl_ptr();
      }
    }
    node->needs_grad.push_back(e.leaf != nullptr || e.node != nullptr);
    node->inputs.push_back(std::move(e));
  }
  node->outputs.reserve(outputs.size());
  for (const auto& out : outputs) node->outputs.push_back({out.shape(), out.dtype()});
  node->saved.reserve(saved.size());
  for (const auto& s : saved)
    if (s.defined())
      node->saved.push_back({s.impl()->storage, s.impl()->storage->version.load(std::memory_order_relaxed),
                             detail::describe(s, inputs, outputs)});
  node->backward = std::move(backward);
  node->sequence = detail::next_sequence.fetch_add(1, std::memory_order_relaxed);
  node->tape = detail::this_tape();
  node->tape->link(node.get());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    auto* impl = outputs[k].impl();
    impl->leaf_requires_grad = false;
    impl->grad_fn = node;
    impl->slot = static_cast<std::int32_t>(k);
  }
  return true;
}

bool record_op(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs, BackwardFn backward) {
  std::vector<Tensor> everything(inputs.begin(), inputs.end());
  everything.insert(everything.end(), outputs.begin(), outputs.end());
  return record_op(name, inputs, outputs, std::move(backward), everything);
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
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    const Tensor& g = grad_outputs[i];
    if (!out.defined()) fail<Error>("backward: argument 'outputs[{}]' is an undefined tensor", i);
    if (!out.requires_grad())
      fail<GraphError>("backward: outputs[{}] (shape {}, {}) does not require grad: no input of the "
                       "ops that made it requires grad, it was made under NoGradGuard, or its tape "
                       "was cleared",
                       i, shape_str(out.shape()), out.dtype());
    if (!g.defined()) fail<Error>("backward: argument 'grad_outputs[{}]' is an undefined tensor", i);
    if (g.shape() != out.shape() || g.dtype() != out.dtype())
      fail<ShapeError>("backward: grad_outputs[{}] must match outputs[{}]: expected {} {}, got {} {}",
                       i, i, out.dtype(), shape_str(out.shape()), g.dtype(), shape_str(g.shape()));
  }

  NoGradGuard no_grad;
  detail::BackwardDepth depth;
  // The nodes reachable from the outputs, newest first. Every edge points from a node to an
  // older one, so this is a reverse topological order: no recursion, no depth limit. The roots
  // are held here, and they hold everything below them, for the whole pass.
  std::vector<std::shared_ptr<detail::Node>> roots;
  std::vector<detail::Node*> order;
  std::unordered_map<const detail::Node*, std::size_t> index;
  for (const Tensor& out : outputs)
    if (detail::Node* n = detail::live_node(*out.impl()); n != nullptr && index.emplace(n, 0).second) {
      roots.push_back(out.impl()->grad_fn);
      order.push_back(n);
    }
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const detail::Edge& e : order[i]->inputs)
      if (e.node && !e.node->released && index.emplace(e.node.get(), 0).second) order.push_back(e.node.get());
  std::sort(order.begin(), order.end(), [](const detail::Node* a, const detail::Node* b) { return a->sequence > b->sequence; });
  for (std::size_t i = 0; i < order.size(); ++i) index[order[i]] = i;

  detail::LeafGradients leaves;
  std::vector<std::vector<Tensor>> pending(order.size());
  auto send = [&](const detail::Node* n, std::int32_t slot, const Tensor& g) {
    auto& slots = pending[index.at(n)];
    slots.resize(n->outputs.size());
    detail::accumulate(slots[static_cast<std::size_t>(slot)], g);
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& impl = *outputs[i].impl();
    if (const detail::Node* n = detail::live_node(impl)) send(n, impl.slot, grad_outputs[i]);
    else leaves.add(outputs[i].impl_ptr(), grad_outputs[i]);
  }

  for (std::size_t i = 0; i < order.size(); ++i) {
    if (pending[i].empty()) continue;
    const detail::Node& node = *order[i];
    if (!node.backward)
      fail<GraphError>("backward of {}: its graph was released by clear_tape() during this pass", node.name);
    detail::check_saved_versions(node);
    std::vector<Tensor> grads = node.backward(pending[i], node.needs_grad);
    pending[i] = {};  // release this node's upstream gradients as soon as they are used
    if (grads.size() != node.inputs.size())
      fail<GraphError>("backward of {}: returned {} gradients for {} inputs", node.name, grads.size(), node.inputs.size());
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const Tensor& g = grads[k];
      const detail::Edge& e = node.inputs[k];
      if (!g.defined() || !node.needs_grad[k]) continue;
      // What the gradient must look like: the input itself (a leaf) or the output it came from.
      const detail::OutputMeta& want = e.leaf ? detail::OutputMeta{e.leaf->shape, e.leaf->dtype}
                                              : e.node->outputs[static_cast<std::size_t>(e.slot)];
      if (g.shape() != want.shape || g.dtype() != want.dtype)
        fail<GraphError>("backward of {}: gradient for input {} must be {} {}, got {} {}", node.name, k, want.dtype,
                         shape_str(want.shape), g.dtype(), shape_str(g.shape()));
      if (e.leaf) leaves.add(e.leaf, g);
      else if (!e.node->released) send(e.node.get(), e.slot, g);
    }
  }
  leaves.apply();
}

}  // namespace tapegrad
