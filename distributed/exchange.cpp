// The exchange of one bucket (see bucket.hpp and docs/distributed.md): the exact tree, or MPI's sum.
#include <chrono>
#include <cstring>

#include "distributed/bucket.hpp"

namespace tapegrad::detail {
namespace {

template <class T>
void divide(T* x, std::int64_t n, std::int64_t m) {
  const T d = static_cast<T>(m);
  for (std::int64_t e = 0; e < n; ++e) x[e] /= d;
}

}  // namespace

void add_into(Tensor& left, const Tensor& right) {
  const std::int64_t n = left.numel();
  if (left.dtype() == float64) {
    double* a = left.data<double>();
    const double* b = right.data<const double>();
    for (std::int64_t e = 0; e < n; ++e) a[e] += b[e];
  } else {
    float* a = left.data<float>();
    const float* b = right.data<const float>();
    for (std::int64_t e = 0; e < n; ++e) a[e] += b[e];
  }
}

void exchange(Communicator& c, Bucket& b, const std::vector<std::pair<TreeNode, Tensor>>& nodes,
              const std::vector<std::vector<TreeNode>>& covers, std::int64_t m, GradientReduction reduction, bool sharded) {
  const auto started = std::chrono::steady_clock::now();
  const int size = c.size(), rank = c.rank();
  const Elem e = elem_of(b.dtype);
  const std::size_t item = itemsize(b.dtype);
  const auto r = static_cast<std::size_t>(rank);
  const std::int64_t mine = b.shard[r + 1] - b.shard[r];
  std::vector<std::int64_t> lengths;
  for (int j = 0; j < size; ++j) lengths.push_back(b.shard[static_cast<std::size_t>(j) + 1] - b.shard[static_cast<std::size_t>(j)]);
  b.result = empty({b.numel}, b.dtype);
  char* result = static_cast<char*>(const_cast<void*>(b.result.raw_data()));
  b.bytes = 0;
  if (reduction == GradientReduction::exact) {
    // Shard j of each partial sum goes to rank j, which sums all of them in the tree's order.
    std::vector<std::int64_t> send_counts, recv_counts;
    Tensor send = empty({b.numel * static_cast<std::int64_t>(nodes.size())}, b.dtype);
    char* out = static_cast<char*>(const_cast<void*>(send.raw_data()));
    for (int j = 0; j < size; ++j) {
      const auto jj = static_cast<std::size_t>(j);
      for (const auto& [node, value] : nodes) {
        std::memcpy(out, static_cast<const char*>(value.raw_data()) + b.shard[jj] * static_cast<std::int64_t>(item),
                    static_cast<std::size_t>(lengths[jj]) * item);
        out += lengths[jj] * static_cast<std::int64_t>(item);
      }
      send_counts.push_back(lengths[jj] * static_cast<std::int64_t>(nodes.size()));
      recv_counts.push_back(mine * static_cast<std::int64_t>(covers[jj].size()));
      if (j != rank) b.bytes += send_counts.back() * static_cast<std::int64_t>(item);
    }
    std::int64_t received = 0;
    for (const std::int64_t n : recv_counts) received += n;
    Tensor recv = empty({received}, b.dtype);
    c.all_to_all(send.raw_data(), send_counts, const_cast<void*>(recv.raw_data()), recv_counts, e);
    std::vector<TreeNode> all;
    for (const auto& cover : covers) all.insert(all.end(), cover.begin(), cover.end());
    void* own = result + b.shard[r] * static_cast<std::int64_t>(item);
    if (b.dtype == float64) {
      std::vector<const double*> values;
      for (std::size_t i = 0; i < all.size(); ++i) values.push_back(recv.data<const double>() + static_cast<std::int64_t>(i) * mine);
      tree_sum(m, all, values, static_cast<double*>(own), mine);
      divide(static_cast<double*>(own), mine, m);
    } else {
      std::vector<const float*> values;
      for (std::size_t i = 0; i < all.size(); ++i) values.push_back(recv.data<const float>() + static_cast<std::int64_t>(i) * mine);
      tree_sum(m, all, values, static_cast<float*>(own), mine);
      divide(static_cast<float*>(own), mine, m);
    }
    if (!sharded) {
      Tensor shard_copy = empty({mine}, b.dtype);
      std::memcpy(const_cast<void*>(shard_copy.raw_data()), own, static_cast<std::size_t>(mine) * item);
      c.all_gather(shard_copy.raw_data(), result, lengths, e);
      b.bytes += mine * (size - 1) * static_cast<std::int64_t>(item);
    }
  } else {
    // This process's partial sums in order, then MPI's sum over the processes.
    Tensor local = empty({b.numel}, b.dtype);
    std::memcpy(const_cast<void*>(local.raw_data()), nodes[0].second.raw_data(), static_cast<std::size_t>(b.numel) * item);
    for (std::size_t i = 1; i < nodes.size(); ++i) add_into(local, nodes[i].second);
    void* own = result + b.shard[r] * static_cast<std::int64_t>(item);
    if (sharded) {
      c.reduce_scatter_sum(local.raw_data(), own, lengths, e);
    } else {
      c.all_reduce_sum(const_cast<void*>(local.raw_data()), b.numel, e);
      std::memcpy(result, local.raw_data(), static_cast<std::size_t>(b.numel) * item);
    }
    const std::int64_t from = sharded ? b.shard[r] : 0, count = sharded ? mine : b.numel;
    if (b.dtype == float64) divide(reinterpret_cast<double*>(result) + from, count, m);
    else divide(reinterpret_cast<float*>(result) + from, count, m);
    b.bytes = 2 * b.numel * (size - 1) / size * static_cast<std::int64_t>(item);
  }
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}


}  // namespace tapegrad::detail
