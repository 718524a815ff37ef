// Internal: a recorded op, as the tape keeps it.
//
// The graph is owned by the tensors: a non-leaf holds its node, and a node holds the nodes of
// its inputs (and the tensors its backward saved). A step's graph is therefore freed as soon as
// its last tensor is gone, whether or not backward ran, and a training loop's memory stays
// flat without any call. Each thread also keeps a list of its live nodes (its "tape") so that
// clear_tape() can release them all at once and tape_size() can count them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "autodiff/tensor_impl.hpp"
#include "tapegrad/autodiff/tape.hpp"

namespace tapegrad::detail {

// Where the gradient of one input goes: into output `slot` of an earlier node, or into a leaf.
struct Edge {
  std::shared_ptr<Node> node;
  std::int32_t slot = 0;
  std::shared_ptr<TensorImpl> leaf;
};

struct OutputMeta {
  Shape shape;
  DType dtype;
};

// A tensor the backward reads, and the version its storage had when the op was recorded.
struct SavedVersion {
  std::weak_ptr<Storage> storage;  // weak: the backward's own capture is what keeps it alive
  std::uint64_t version = 0;
  // What it is to the op, for the error message: "input 1", "a view of output 0"...
  enum class Kind : std::uint8_t { input, output, view_of_input, view_of_output, other } kind = Kind::other;
  std::uint32_t index = 0;
  std::uint32_t position = 0;  // in the op's `saved` list
};

using SharedBackward = std::shared_ptr<const BackwardFn>;

struct Tape;  // one per thread, in tape.cpp

struct Node {
  const char* name = "";
  std::uint64_t sequence = 0;  // creation order across all threads: a topological order
  std::vector<Edge> inputs;
  std::vector<bool> needs_grad;
  std::vector<OutputMeta> outputs;
  std::vector<SavedVersion> saved;
  SharedBackward backward;  // shared: a backward pass may hold it while clear_tape() releases the node
  std::atomic<bool> released{false};  // by clear_tape(): its outputs no longer require grad

  // Membership in the recording thread's list of live nodes. The tape's mutex also guards
  // `inputs`, `saved`, `backward` and `released`, which clear_tape() changes.
  std::shared_ptr<Tape> tape;
  Node* prev = nullptr;
  Node* next = nullptr;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node();  // frees the graph behind it without recursion: a chain of a million ops cannot overflow the stack
};

}  // namespace tapegrad::detail
