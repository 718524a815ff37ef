// The micro-batch tree (see sum_tree.hpp).
#include "distributed/sum_tree.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "autodiff/check.hpp"

namespace tapegrad::detail {

std::vector<TreeNode> tree_cover(std::int64_t m, std::int64_t first, std::int64_t last) {
  TreeStack<int> stack(m);
  for (std::int64_t k = first; k < last; ++k) stack.push(k, 0, [](int&, const int&) {});
  std::vector<TreeNode> out;
  for (const auto& [node, unused] : stack.nodes()) out.push_back(node);
  return out;
}

namespace {

template <class T>
struct Evaluation {
  std::int64_t m, n;
  std::map<std::pair<std::int64_t, std::int64_t>, const T*> given;
  std::vector<std::unique_ptr<T[]>> scratch;

  const T* value(TreeNode node) {
    if (const auto it = given.find({node.begin(), node.end(m)}); it != given.end()) return it->second;
    if (node.level == 0)
      fail<ValueError>("tree_sum: no node holds micro-batch {} of {}; the covers must tile [0, {})", node.index, m, m);
    const TreeNode left{node.level - 1, 2 * node.index}, right{node.level - 1, 2 * node.index + 1};
    if (right.begin() >= m) return value(left);  // no right child: the node is its left child
    const T* a = value(left);
    const T* b = value(right);
    scratch.push_back(std::make_unique<T[]>(static_cast<std::size_t>(n)));
    T* sum = scratch.back().get();
    for (std::int64_t e = 0; e < n; ++e) sum[e] = a[e] + b[e];
    return sum;
  }
};

}  // namespace

template <class T>
void tree_sum(std::int64_t m, const std::vector<TreeNode>& nodes, const std::vector<const T*>& values, T* out, std::int64_t n) {
  Evaluation<T> ev{m, n, {}, {}};
  for (std::size_t i = 0; i < nodes.size(); ++i) ev.given[{nodes[i].begin(), nodes[i].end(m)}] = values[i];
  int levels = 0;
  while ((std::int64_t{1} << levels) < m) ++levels;
  const T* root = ev.value({levels, 0});
  if (n > 0) std::memcpy(out, root, static_cast<std::size_t>(n) * sizeof(T));
}

template void tree_sum<float>(std::int64_t, const std::vector<TreeNode>&, const std::vector<const float*>&, float*, std::int64_t);
template void tree_sum<double>(std::int64_t, const std::vector<TreeNode>&, const std::vector<const double*>&, double*, std::int64_t);

}  // namespace tapegrad::detail
