// The fixed order in which a step's M micro-batch gradients are summed, whatever the number of
// processes: a binary tree over the micro-batches 0..M-1, adjacent pairs summed level by level (a
// node with no right neighbour passes up unchanged). Node (level l, index i) holds micro-batches
// [i 2^l, min((i + 1) 2^l, M)).
//
// A process that computes the micro-batches [first, last) sums, as they come, the largest nodes
// inside its range (its cover); the covers of all processes are then combined in the tree's own
// order. Every node is summed the same way wherever it is computed, so any process count P that
// divides M gives the bits of one process summing all M.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace tapegrad::detail {

struct TreeNode {
  int level = 0;
  std::int64_t index = 0;
  std::int64_t begin() const { return index << level; }
  std::int64_t end(std::int64_t m) const { return std::min((index + 1) << level, m); }
};

// Micro-batch k's gradient joins the sums of one process; holds the cover built so far. The
// values are opaque (V: a buffer handle); `add(left, right)` sums right into left.
template <class V>
class TreeStack {
 public:
  using Add = std::function<void(V& left, const V& right)>;
  explicit TreeStack(std::int64_t m) : m_(m) {}
  // Pushes leaf k (k must follow the previous leaf), then sums every pair of siblings now complete.
  void push(std::int64_t k, V value, const Add& add) {
    TreeNode node{0, k};
    for (;;) {
      node = promoted(node);
      if (stack_.empty() || !(node.index % 2 == 1 && stack_.back().first.level == node.level &&
                              stack_.back().first.index == node.index - 1))
        break;
      V left = std::move(stack_.back().second);
      stack_.pop_back();
      add(left, value);
      value = std::move(left);
      node = {node.level + 1, node.index / 2};
    }
    stack_.emplace_back(node, std::move(value));
  }
  std::vector<std::pair<TreeNode, V>>& nodes() { return stack_; }
  void clear() { stack_.clear(); }

 private:
  // A left child with no right sibling is its parent (the same micro-batches).
  TreeNode promoted(TreeNode n) const {
    while ((std::int64_t{1} << n.level) < m_ && n.index % 2 == 0 && ((n.index + 1) << n.level) >= m_) n = {n.level + 1, n.index / 2};
    return n;
  }
  std::int64_t m_;
  std::vector<std::pair<TreeNode, V>> stack_;
};

// The cover of [first, last) that TreeStack leaves: the nodes, in order.
std::vector<TreeNode> tree_cover(std::int64_t m, std::int64_t first, std::int64_t last);

// The sum of all M micro-batches from the values of nodes that cover [0, M) exactly (the covers of
// every process, in order), combined in the tree's order: out[e] for e < n. `values[i]` holds
// nodes[i]'s n elements. T is float or double.
template <class T>
void tree_sum(std::int64_t m, const std::vector<TreeNode>& nodes, const std::vector<const T*>& values, T* out, std::int64_t n);

}  // namespace tapegrad::detail
