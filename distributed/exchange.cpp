// The exchange of one bucket (see bucket.hpp and docs/distributed.md): the exact tree, or MPI's sum.
#include <cstring>

#include "distributed/bucket.hpp"
#include "tapegrad/ops/inplace.hpp"

namespace tapegrad::detail {
namespace {

// out = sum / m, element by element (in place when out is sum).
template <class T>
void divide(const T* sum, T* out, std::int64_t n, std::int64_t m) {
  const T d = static_cast<T>(m);
  for (std::int64_t e = 0; e < n; ++e) out[e] = sum[e] / d;
}

}  // namespace

void exchange(Communicator& c, Bucket& b, const std::vector<std::pair<TreeNode, Tensor>>& nodes,
              const std::vector<std::vector<TreeNode>>& covers, std::int64_t m, GradientReduction reduction, bool sharded) {
  const auto started = std::chrono::steady_clock::now();
  const int size = c.size();
  const auto r = static_cast<std::size_t>(c.rank());
  const Elem e = elem_of(b.dtype);
  const auto item = static_cast<std::int64_t>(itemsize(b.dtype));
  std::vector<std::int64_t> lengths;
  for (std::size_t j = 0; j + 1 < b.shard.size(); ++j) lengths.push_back(b.shard[j + 1] - b.shard[j]);
  const std::int64_t mine = lengths[r];
  b.result = empty({b.numel}, b.dtype);
  char* result = static_cast<char*>(const_cast<void*>(b.result.raw_data()));
  char* own = result + b.shard[r] * item;
  auto mean = [&](const void* sum, void* out, std::int64_t n) {
    if (b.dtype == float64) divide(static_cast<const double*>(sum), static_cast<double*>(out), n, m);
    else divide(static_cast<const float*>(sum), static_cast<float*>(out), n, m);
  };
  b.bytes = 0;
  if (size == 1 && nodes.size() == 1) {
    // One process: its one partial sum is the tree's root (its micro-batches are all of them).
    mean(nodes[0].second.raw_data(), result, b.numel);
  } else if (reduction == GradientReduction::exact) {
    // Shard j of each partial sum goes to rank j, which sums all of them in the tree's order. A
    // partial sum's shards lie in rank order: one partial sum is sent as it is.
    const std::int64_t k = static_cast<std::int64_t>(nodes.size());
    Tensor packed;
    const void* send = nodes[0].second.raw_data();
    if (k > 1) {
      packed = empty({b.numel * k}, b.dtype);
      char* out = static_cast<char*>(const_cast<void*>(packed.raw_data()));
      for (std::size_t j = 0; j < lengths.size(); ++j)
        for (const auto& [node, value] : nodes) {
          std::memcpy(out, static_cast<const char*>(value.raw_data()) + b.shard[j] * item, static_cast<std::size_t>(lengths[j] * item));
          out += lengths[j] * item;
        }
      send = packed.raw_data();
    }
    std::vector<std::int64_t> send_counts, recv_counts;
    std::int64_t received = 0;
    for (std::size_t j = 0; j < lengths.size(); ++j) {
      send_counts.push_back(lengths[j] * k);
      recv_counts.push_back(mine * static_cast<std::int64_t>(covers[j].size()));
      received += recv_counts.back();
      if (j != r) b.bytes += send_counts.back() * item;
    }
    Tensor recv = empty({received}, b.dtype);
    c.all_to_all(send, send_counts, const_cast<void*>(recv.raw_data()), recv_counts, e);
    std::vector<TreeNode> all;
    for (const auto& cover : covers) all.insert(all.end(), cover.begin(), cover.end());
    if (b.dtype == float64) {
      std::vector<const double*> values;
      for (std::size_t i = 0; i < all.size(); ++i) values.push_back(recv.data<const double>() + static_cast<std::int64_t>(i) * mine);
      tree_sum(m, all, values, reinterpret_cast<double*>(own), mine);
    } else {
      std::vector<const float*> values;
      for (std::size_t i = 0; i < all.size(); ++i) values.push_back(recv.data<const float>() + static_cast<std::int64_t>(i) * mine);
      tree_sum(m, all, values, reinterpret_cast<float*>(own), mine);
    }
    mean(own, own, mine);
    if (!sharded) {
      c.all_gather(nullptr, result, lengths, e);  // in place: this rank's shard is where it goes
      b.bytes += mine * (size - 1) * item;
    }
  } else {
    // This process's partial sums in order, then MPI's sum over the processes.
    Tensor local = nodes[0].second;  // the step's own buffer: free to overwrite
    for (std::size_t i = 1; i < nodes.size(); ++i) add_(local, nodes[i].second);  // a + b, as the tree's merges
    if (sharded) {
      c.reduce_scatter_sum(local.raw_data(), own, lengths, e);
      mean(own, own, mine);
    } else {
      c.all_reduce_sum(const_cast<void*>(local.raw_data()), b.numel, e);
      mean(local.raw_data(), result, b.numel);
    }
    b.bytes = 2 * b.numel * (size - 1) / size * item;
  }
  b.seconds = seconds_since(started);
}

}  // namespace tapegrad::detail
