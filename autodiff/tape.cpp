// The per-thread tape: recording ops, running them backward, and releasing them.
#include "tapegrad/autodiff/tape.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <utility>

#include "autodiff/check.hpp"
#include "autodiff/loops.hpp"
#include "autodiff/node.hpp"
#include "autodiff/saved_output.hpp"
#include "autodiff/saved_versions.hpp"
#include "autodiff/tape_observer.hpp"
#include "runtime/parallel.hpp"

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
thread_local TapeObserver* observer_of_thread = nullptr;

const std::shared_ptr<Tape>& this_tape() {
  thread_local const std::shared_ptr<Tape> tape = std::make_shared<Tape>();
  return tape;
}

// Pieces of a graph waiting to be destroyed by the outermost ~Node running on this thread:
// nodes, backwards (their saved tensors hold their own nodes) and leaves (a .grad may hold a
// graph). Destroying them from inside ~Node would recurse once per op along a chain.
thread_local std::vector<std::shared_ptr<const void>>* active_graveyard = nullptr;

struct BackwardDepth {
  BackwardDepth() noexcept { ++backward_depth; }
  ~BackwardDepth() { --backward_depth; }
};

// `out`, computed from `in` by a kernel (which records nothing), recorded as op `name` when grad
// mode is on and an input requires grad: its gradient passes unchanged to every input.
Tensor record_pass_through(const char* name, std::vector<Tensor> in, const Tensor& out) {
  std::vector<Tensor> outs{out};
  const auto pass_on = [n = in.size()](std::span<const Tensor> g, const std::vector<bool>&) {
    return std::vector<Tensor>(n, g[0]);
  };
  record_op(name, in, outs, pass_on, std::span<const Tensor>());
  return outs[0];
}

// a + b recorded when grad mode is on and either requires grad (a create_graph pass sums the
// gradients reaching one tensor with history); the plain sum otherwise.
Tensor add_gradients(const Tensor& a, const Tensor& b) {
  const Tensor sum = add_same_shape(a, b);
  return grad_enabled ? record_pass_through("add", {a, b}, sum) : sum;
}

// A gradient the caller may keep (.grad or grad()'s result): g itself when nothing else can see
// it, else a copy. A leaf's gradient must not alias an upstream gradient the caller still holds,
// nor be a broadcast (stride 0) view. Without create_graph it carries no history (a backward run
// with grad mode on may return one: a .grad holding a graph would hold its own leaf in a cycle);
// with create_graph the copy is recorded.
Tensor own_gradient(const Tensor& g, bool create_graph) {
  const bool exclusive = g.is_contiguous() && g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1;
  if (!create_graph) return exclusive ? g.detach() : copy_of(g);
  return exclusive ? g : record_pass_through("clone", {g}, copy_of(g));
}

// Leaf gradients of one backward pass, applied to the leaves only once the whole pass has
// succeeded: a backward that throws half-way leaves every .grad as it was.
class LeafGradients {
 public:
  void add(const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
    if (!leaf->leaf_requires_grad) return;  // set_requires_grad(false) since it was recorded
    auto [it, inserted] = index_.try_emplace(leaf.get(), pending_.size());
    if (inserted) pending_.emplace_back(leaf, g);
    else pending_[it->second].second = add_gradients(pending_[it->second].second, g);
  }
  Tensor find(const TensorImpl* leaf) const {
    const auto it = index_.find(leaf);
    return it == index_.end() ? Tensor() : pending_[it->second].second;
  }
  void apply(bool create_graph) {
    GradModeGuard mode(create_graph);  // so add_gradients records the sum only with create_graph
    for (auto& [leaf, g] : pending_)
      leaf->grad = leaf->grad.defined() ? add_gradients(leaf->grad, g) : own_gradient(g, create_graph);
  }

 private:
  std::vector<std::pair<std::shared_ptr<TensorImpl>, Tensor>> pending_;
  std::unordered_map<const TensorImpl*, std::size_t> index_;
};

// What a backward pass reads of a node, copied under the recording tape's lock: clear_tape() on
// that thread may release the node (and null its backward) while this pass runs on another.
struct NodeView {
  SharedBackward backward;
  std::vector<Edge> inputs;
  std::vector<SavedVersion> saved;
};

NodeView view_of(const Node& n) {
  std::lock_guard lock(n.tape->mutex);
  return {n.backward, n.inputs, n.saved};
}

// What one pass walks: the nodes reachable from its outputs, newest first, held for the pass,
// and what it reads and sums for each.
struct Walk {
  std::vector<std::shared_ptr<Node>> nodes;
  std::vector<NodeView> views;
  std::unordered_map<const Node*, std::size_t> index;
  std::vector<std::vector<bool>> pruned;     // grad(): the inputs that lead to a wanted tensor
  std::vector<bool> leads;                   // grad(): whether the node leads to one at all
  std::vector<std::vector<Tensor>> pending;  // the gradients of the node's outputs so far

  // The inputs of node i whose gradients are computed: every one it needs (backward()), or
  // those that lead to a wanted tensor (grad()).
  const std::vector<bool>& needs_of(std::size_t i) const { return pruned.empty() ? nodes[i]->needs_grad : pruned[i]; }
  void send(const Node* n, std::int32_t slot, const Tensor& g) {
    auto& slots = pending[index.at(n)];
    slots.resize(n->outputs.size());
    Tensor& sum = slots[static_cast<std::size_t>(slot)];
    sum = sum.defined() ? add_gradients(sum, g) : g;
  }
};

// backward()'s on_gradient_ready: how many edges of the walk may still send to each leaf, so the
// hook fires once per leaf, as soon as nothing more can reach it. Made only when a hook is set.
class LeafCountdown {
 public:
  LeafCountdown(const Walk& walk, const GradientReadyHook& hook) : hook_(hook) {
    for (std::size_t i = 0; i < walk.nodes.size(); ++i) for_each_leaf(walk, i, [&](const Edge& e) { ++remaining_[e.leaf.get()]; });
  }
  // A leaf passed as an output: complete now, unless a node sends to it too (it fires with the last).
  void output(const std::shared_ptr<TensorImpl>& leaf, const LeafGradients& leaves) {
    if (remaining_.try_emplace(leaf.get(), 0).second) fire(leaf, leaves);
  }
  // Node i ran or was skipped: its leaf edges send nothing more.
  void done(const Walk& walk, std::size_t i, const LeafGradients& leaves) {
    for_each_leaf(walk, i, [&](const Edge& e) { if (--remaining_[e.leaf.get()] == 0) fire(e.leaf, leaves); });
  }

 private:
  template <class F>
  static void for_each_leaf(const Walk& walk, std::size_t i, F f) {
    const std::vector<bool>& needs = walk.needs_of(i);
    const std::vector<Edge>& inputs = walk.views[i].inputs;
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (needs[k] && inputs[k].leaf) f(inputs[k]);
  }
  // The hook gets a handle to the pass's gradient, which own_gradient counts: if the hook keeps
  // it, .grad gets a copy. No gradient (never reached, or no longer requires grad): no call.
  void fire(const std::shared_ptr<TensorImpl>& leaf, const LeafGradients& leaves) const {
    if (const Tensor g = leaves.find(leaf.get()); g.defined()) hook_(Tensor(leaf), g);
  }

  const GradientReadyHook& hook_;
  std::unordered_map<const TensorImpl*, std::size_t> remaining_;
};

// One backward pass: backward() applies its leaf gradients, grad() reads the wanted ones.
class Pass {
 public:
  explicit Pass(bool create_graph, const GradientReadyHook* on_ready = nullptr)
      : create_graph_(create_graph), on_ready_(on_ready) {}
  // grad(): only these tensors' gradients are wanted (their nodes' and leaves' gradients are
  // kept, and nodes that lead to none of them are skipped).
  void want(const std::vector<Tensor>& inputs);
  void run(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs);
  Tensor gradient_of(const Tensor& t) const;
  LeafGradients leaves;

 private:
  Walk collect_reachable(const std::vector<Tensor>& outputs) const;
  void prune_to_wanted(Walk& walk) const;
  void run_node(Walk& walk, std::size_t i);
  std::vector<Tensor> call_backward(Walk& walk, std::size_t i, const std::vector<bool>& needs) const;
  void send_on(Walk& walk, std::size_t i, const std::vector<Tensor>& grads, const std::vector<bool>& needs);

  bool create_graph_;
  const GradientReadyHook* on_ready_;  // backward()'s hook, or none
  bool wanting_ = false;
  std::uint64_t oldest_wanted_ = 0;  // nodes older than this are not walked (grad() of intermediates)
  std::unordered_map<const Node*, int> wanted_nodes_;
  std::unordered_map<const TensorImpl*, int> wanted_leaves_;
  std::map<std::pair<const Node*, std::int32_t>, Tensor> captured_;
};

}  // namespace

Node::~Node() {
  if (tape) tape->unlink(this);
  // Everything this node holds that may hold other nodes goes to the graveyard of the outermost
  // ~Node on this thread, which frees it in a loop instead of by recursion.
  std::vector<std::shared_ptr<const void>> local;
  auto& graveyard = active_graveyard != nullptr ? *active_graveyard : local;
  for (auto& e : inputs) {
    if (e.node) graveyard.push_back(std::move(e.node));
    if (e.leaf) graveyard.push_back(std::move(e.leaf));
  }
  if (backward) graveyard.push_back(std::move(backward));
  if (active_graveyard != nullptr) return;
  active_graveyard = &local;
  while (!local.empty()) {
    const std::shared_ptr<const void> doomed = std::move(local.back());
    local.pop_back();
  }
  active_graveyard = nullptr;
}

ObserveTape::ObserveTape(TapeObserver& observer) noexcept : previous_(observer_of_thread) { observer_of_thread = &observer; }
ObserveTape::~ObserveTape() { observer_of_thread = previous_; }
TapeObserver* tape_observer() noexcept { return observer_of_thread; }

Node* live_node(const TensorImpl& impl) noexcept {
  Node* n = impl.grad_fn.get();
  return n != nullptr && !n->released ? n : nullptr;
}

namespace {
// The node whose backward runs in a create_graph pass on this thread (output_with_history).
thread_local const std::shared_ptr<Node>* creating_node = nullptr;
}  // namespace

Tensor output_with_history(const Tensor& saved, std::int32_t slot) {
  if (creating_node == nullptr || !grad_enabled || !saved.defined()) return saved;
  Tensor joined = saved.detach();
  joined.impl()->grad_fn = *creating_node;
  joined.impl()->slot = slot;
  return joined;
}

bool creating_graph() noexcept { return creating_node != nullptr && grad_enabled; }

void check_pass_arguments(const char* op, const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
  if (outputs.size() != grad_outputs.size())
    fail<ValueError>("{}: got {} outputs but {} grad_outputs; give one gradient per output", op, outputs.size(),
                     grad_outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    const Tensor& g = grad_outputs[i];
    if (!out.defined()) fail<Error>("{}: argument 'outputs[{}]' is an undefined tensor", op, i);
    if (!out.requires_grad())
      fail<GraphError>("{}: outputs[{}] (shape {}, {}) does not require grad: no input of the "
                       "ops that made it requires grad, it was made under NoGradGuard, or its tape "
                       "was cleared",
                       op, i, shape_str(out.shape()), out.dtype());
    check_like(op, fmt::format("grad_outputs[{}]", i).c_str(), g, fmt::format("outputs[{}]", i).c_str(), out);
  }
}

void Pass::want(const std::vector<Tensor>& inputs) {
  wanting_ = true;
  oldest_wanted_ = std::numeric_limits<std::uint64_t>::max();
  for (const Tensor& t : inputs) {
    if (Node* n = live_node(*t.impl())) {
      wanted_nodes_.emplace(n, 0);
      oldest_wanted_ = std::min(oldest_wanted_, n->sequence);
    } else {
      wanted_leaves_.emplace(t.impl(), 0);
    }
  }
  // A leaf may sit below any node: only wanted nodes alone bound the walk.
  if (!wanted_leaves_.empty()) oldest_wanted_ = 0;
}

Tensor Pass::gradient_of(const Tensor& t) const {
  const TensorImpl& impl = *t.impl();
  if (const Node* n = live_node(impl)) {
    const auto it = captured_.find({n, impl.slot});
    return it == captured_.end() ? Tensor() : it->second;
  }
  return leaves.find(&impl);
}

// The nodes reachable from the outputs, newest first. Every edge points from a node to an older
// one, so this is a reverse topological order: no recursion, no depth limit.
Walk Pass::collect_reachable(const std::vector<Tensor>& outputs) const {
  std::vector<std::shared_ptr<Node>> found;
  std::vector<NodeView> views;  // parallel to `found`
  std::unordered_map<const Node*, std::size_t> seen;
  for (const Tensor& out : outputs)
    if (Node* n = live_node(*out.impl()); n != nullptr && seen.emplace(n, 0).second) found.push_back(out.impl()->grad_fn);
  // grad() of intermediate tensors alone walks no further down than the oldest of them: every
  // edge points to an older node, so nothing below it leads to one (a create_graph backward that
  // differentiates its own inputs would otherwise walk the whole history under them).
  for (std::size_t i = 0; i < found.size(); ++i) {
    views.push_back(view_of(*found[i]));
    for (const Edge& e : views.back().inputs)
      if (e.node && e.node->sequence >= oldest_wanted_ && seen.emplace(e.node.get(), 0).second) found.push_back(e.node);
  }
  std::vector<std::size_t> by_age(found.size());
  std::iota(by_age.begin(), by_age.end(), std::size_t{0});
  std::sort(by_age.begin(), by_age.end(), [&](std::size_t a, std::size_t b) { return found[a]->sequence > found[b]->sequence; });
  Walk walk;
  walk.index = std::move(seen);
  for (std::size_t i : by_age) {
    walk.index[found[i].get()] = walk.nodes.size();
    walk.nodes.push_back(std::move(found[i]));
    walk.views.push_back(std::move(views[i]));
  }
  walk.pending.resize(walk.nodes.size());
  return walk;
}

// grad(): which edges lead to a wanted input (oldest first, so each node's inputs are known
// before it). Gradients that lead nowhere wanted are not computed.
void Pass::prune_to_wanted(Walk& walk) const {
  walk.pruned.resize(walk.nodes.size());
  walk.leads.assign(walk.nodes.size(), true);
  for (std::size_t i = walk.nodes.size(); i-- > 0;) {
    std::vector<bool>& needs = walk.pruned[i];
    needs = walk.nodes[i]->needs_grad;
    bool any = wanted_nodes_.count(walk.nodes[i].get()) > 0;
    for (std::size_t k = 0; k < needs.size(); ++k) {
      const Edge& e = walk.views[i].inputs[k];
      const auto at = e.node ? walk.index.find(e.node.get()) : walk.index.end();
      const bool to = e.node ? at != walk.index.end() && walk.leads[at->second] : e.leaf && wanted_leaves_.count(e.leaf.get()) > 0;
      needs[k] = needs[k] && to;
      any = any || needs[k];
    }
    walk.leads[i] = any;
  }
}

void Pass::run(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
  GradModeGuard mode(create_graph_);
  BackwardDepth depth;
  Walk walk = collect_reachable(outputs);
  if (wanting_) prune_to_wanted(walk);
  std::optional<LeafCountdown> countdown;
  if (on_ready_ != nullptr) countdown.emplace(walk, *on_ready_);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& impl = *outputs[i].impl();
    if (const Node* n = live_node(impl)) walk.send(n, impl.slot, grad_outputs[i]);
    else leaves.add(outputs[i].impl_ptr(), grad_outputs[i]);
  }
  if (countdown)  // after the loop: a leaf passed twice as an output fires once, with the sum
    for (const Tensor& out : outputs)
      if (live_node(*out.impl()) == nullptr) countdown->output(out.impl_ptr(), leaves);
  // Newest first, every node that gradients reached: its backward, then its gradients sent on to
  // its inputs (micrograd's `for v in reversed(topo): v._backward()`).
  for (std::size_t i = 0; i < walk.nodes.size(); ++i) {
    run_node(walk, i);
    if (countdown) countdown->done(walk, i, leaves);  // run or skipped alike
  }
}

// Node i's backward and sends, or nothing when no gradient reached it (or, for grad(), none is wanted below it).
void Pass::run_node(Walk& walk, std::size_t i) {
  if (walk.pending[i].empty() || (wanting_ && !walk.leads[i])) return;
  const Node& node = *walk.nodes[i];
  if (!walk.views[i].backward)
    fail<GraphError>("backward: the graph through {} was released by clear_tape() on the thread that recorded it, "
                     "so the gradients reaching it cannot go further",
                     node.name);
  if (wanting_ && wanted_nodes_.count(&node) > 0)
    for (std::size_t slot = 0; slot < walk.pending[i].size(); ++slot)
      if (walk.pending[i][slot].defined()) captured_[{&node, static_cast<std::int32_t>(slot)}] = walk.pending[i][slot];
  const std::vector<bool>& needs = walk.needs_of(i);
  if (wanting_ && std::none_of(needs.begin(), needs.end(), [](bool b) { return b; })) return;
  check_saved_versions(node.name, walk.views[i].saved);
  TapeObserver* const observer = observer_of_thread;
  if (observer != nullptr) observer->backward_began(node.name);
  const std::vector<Tensor> grads = call_backward(walk, i, needs);
  walk.pending[i] = {};  // release this node's upstream gradients as soon as they are used
  send_on(walk, i, grads, needs);
  if (observer != nullptr) observer->backward_ended(node.name);
}

// Node i's backward. A create_graph pass runs it as the node whose saved outputs
// output_with_history joins back (creating_node); a first-order pass nested in one, as none.
std::vector<Tensor> Pass::call_backward(Walk& walk, std::size_t i, const std::vector<bool>& needs) const {
  struct Restore {
    const std::shared_ptr<Node>* outer;
    ~Restore() { creating_node = outer; }
  } restore{creating_node};
  creating_node = create_graph_ ? &walk.nodes[i] : nullptr;
  return (*walk.views[i].backward)(walk.pending[i], needs);
}

// Node i's gradients to its inputs: a leaf's into the pass's staging, a node's summed into its
// pending gradients.
void Pass::send_on(Walk& walk, std::size_t i, const std::vector<Tensor>& grads, const std::vector<bool>& needs) {
  const Node& node = *walk.nodes[i];
  const std::vector<Edge>& inputs = walk.views[i].inputs;
  if (grads.size() != inputs.size())
    fail<GraphError>("backward of {}: returned {} gradients for {} inputs", node.name, grads.size(), inputs.size());
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const Tensor& g = grads[k];
    const Edge& e = inputs[k];
    if (!g.defined() || !needs[k]) continue;
    // What the gradient must look like: the input itself (a leaf) or the output it came from.
    const OutputMeta& want = e.leaf ? OutputMeta{e.leaf->shape, e.leaf->dtype} : e.node->outputs[static_cast<std::size_t>(e.slot)];
    if (g.shape() != want.shape || g.dtype() != want.dtype)
      fail<GraphError>("backward of {}: gradient for input {} must be {} {}, got {} {}", node.name, k, want.dtype,
                       shape_str(want.shape), g.dtype(), shape_str(g.shape()));
    if (e.leaf) leaves.add(e.leaf, g);
    else walk.send(e.node.get(), e.slot, g);
  }
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
  std::vector<std::vector<detail::Edge>> inputs;
  std::vector<detail::SharedBackward> backwards;
  {
    std::lock_guard lock(tape.mutex);
    for (detail::Node* n = tape.head; n != nullptr;) {
      detail::Node* next = n->next;
      n->released = true;
      n->prev = n->next = nullptr;
      inputs.push_back(std::move(n->inputs));  // leaves it empty
      n->saved.clear();
      if (n->backward) backwards.push_back(std::move(n->backward));  // leaves it null
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
  return detail::grad_enabled &&
         std::ranges::any_of(inputs, [](const Tensor& t) { return t.defined() && t.requires_grad(); });
}

bool record_op(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outputs, BackwardFn backward,
               std::span<const Tensor> saved) {
  if (!should_record(inputs)) return false;
  if (!backward) fail<ValueError>("record_op: argument 'backward' of {} is empty", name);
  // Check every output before touching any, so a failure leaves nothing half-recorded.
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    if (!out.defined()) fail<Error>("{}: output {} is an undefined tensor", name, k);
    if (!is_floating(out.dtype()))
      fail<DTypeError>("{}: output {} is {}; only floating outputs can carry gradient", name, k, out.dtype());
    if (out.requires_grad())
      fail<GraphError>("{}: output {} (shape {}) already requires grad (a leaf, an input, or the output of another "
                       "recorded op); an op's outputs must be new tensors: compute the forward under NoGradGuard, so "
                       "that the ops it uses record nothing (docs/api.md, \"Writing your own op\")",
                       name, k, shape_str(out.shape()));
    // An output that is also an input, or listed twice, would make the node hold itself.
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].impl() == out.impl())
        fail<GraphError>("{}: output {} is input {} itself; an op's outputs must be new tensors", name, k, i);
    for (std::size_t j = 0; j < k; ++j)
      if (outputs[j].impl() == out.impl()) fail<GraphError>("{}: outputs {} and {} are the same tensor", name, j, k);
  }
  auto node = std::make_shared<detail::Node>();
  node->name = name;
  node->inputs.reserve(inputs.size());
  node->needs_grad.reserve(inputs.size());
  for (const auto& t : inputs) {
    detail::Edge e;
    if (t.defined() && detail::live_node(*t.impl()) != nullptr) e = {t.impl()->grad_fn, t.impl()->slot, nullptr};
    else if (t.defined() && t.impl()->leaf_requires_grad) e.leaf = t.impl_ptr();
    node->needs_grad.push_back(e.leaf != nullptr || e.node != nullptr);
    node->inputs.push_back(std::move(e));
  }
  node->outputs.reserve(outputs.size());
  for (const auto& out : outputs) node->outputs.push_back({out.shape(), out.dtype()});
  node->saved.reserve(saved.size());
  for (std::size_t k = 0; k < saved.size(); ++k) {
    const Tensor& s = saved[k];
    if (!s.defined()) continue;
    detail::SavedVersion v{s.impl()->storage, s.impl()->storage->version.load(std::memory_order_relaxed)};
    v.kind = detail::describe(s, inputs, outputs, v.index);
    v.position = static_cast<std::uint32_t>(k);
    node->saved.push_back(std::move(v));
  }
  node->backward = std::make_shared<const BackwardFn>(std::move(backward));
  node->sequence = detail::next_sequence.fetch_add(1, std::memory_order_relaxed);
  node->tape = detail::this_tape();
  node->tape->link(node.get());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    auto* impl = outputs[k].impl();
    impl->leaf_requires_grad = false;
    impl->grad_fn = node;
    impl->slot = static_cast<std::int32_t>(k);
  }
  if (detail::observer_of_thread != nullptr) detail::observer_of_thread->recorded(name);
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

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, const BackwardOptions& options) {
  detail::check_pass_arguments("backward", outputs, grad_outputs);
  detail::Pass pass(options.create_graph, options.on_gradient_ready ? &options.on_gradient_ready : nullptr);
  pass.run(outputs, grad_outputs);
  detail::TapeObserver* const observer = detail::observer_of_thread;
  if (observer != nullptr) observer->backward_began("(gradients into leaves)");
  pass.leaves.apply(options.create_graph);
  if (observer != nullptr) observer->backward_ended("(gradients into leaves)");
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, const GradOptions& options) {
  std::vector<Tensor> given = grad_outputs;
  if (given.empty())
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& out = outputs[i];
      if (!out.defined()) fail<Error>("grad: argument 'outputs[{}]' is an undefined tensor", i);
      if (out.numel() != 1)
        fail<ShapeError>("grad: outputs[{}] has shape {}; without grad_outputs every output must have exactly one "
                         "element (an implicit gradient of 1)",
                         i, shape_str(out.shape()));
      given.push_back(ones(out.shape(), out.dtype()));
    }
  detail::check_pass_arguments("grad", outputs, given);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) fail<Error>("grad: argument 'inputs[{}]' is an undefined tensor", i);
    if (!inputs[i].requires_grad())
      fail<GraphError>("grad: inputs[{}] (shape {}, {}) does not require grad, so it has no gradient", i,
                       shape_str(inputs[i].shape()), inputs[i].dtype());
  }
  std::vector<Tensor> result(inputs.size());
  {
    detail::Pass pass(options.create_graph);
    pass.want(inputs);
    pass.run(outputs, given);
    for (std::size_t i = 0; i < inputs.size(); ++i) result[i] = pass.gradient_of(inputs[i]);
  }  // the pass no longer holds the gradients: own_gradient copies only what something else can see
  // With create_graph the copies are recorded, whatever the caller's grad mode.
  GradModeGuard mode(options.create_graph);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!result[i].defined() && !options.allow_unused)
      fail<GraphError>("grad: no gradient reaches inputs[{}] (shape {}) from the outputs; pass allow_unused to get an "
                       "undefined tensor for it",
                       i, shape_str(inputs[i].shape()));
    if (result[i].defined()) result[i] = detail::own_gradient(std::exchange(result[i], Tensor()), options.create_graph);
  }
  return result;
}

}  // namespace tapegrad
