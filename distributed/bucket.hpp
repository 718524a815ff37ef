// A bucket of DataParallel: its parameters' gradients as flat buffers, this process's partial
// sums, the step's result, and the job that exchanges it on the communication thread.
#pragma once

#include <chrono>
#include <future>
#include <utility>
#include <vector>

#include "distributed/communicator.hpp"
#include "distributed/sum_tree.hpp"
#include "tapegrad/autodiff/tensor.hpp"
#include "tapegrad/distributed/data_parallel.hpp"

namespace tapegrad::detail {

// One bucket: its parameters' gradients as one flat buffer per micro-batch, this process's
// partial sums, and the step's result. Shared with the communication thread's jobs.
struct Bucket {
  DType dtype = float32;
  std::int64_t numel = 0;
  std::vector<std::size_t> params;   // indices into Impl::params, in bucket order
  std::vector<std::int64_t> shard;   // size + 1 boundaries: rank j reduces [shard[j], shard[j + 1])
  Tensor leaf;                       // the current micro-batch's gradients
  std::vector<char> filled;          // per parameter of the bucket: its gradient is in `leaf`
  std::size_t pending = 0;           // parameters of the current micro-batch still to come
  TreeStack<Tensor> sums{1};
  std::vector<Tensor> spare;         // buffers to reuse
  Tensor result;                     // the step's mean gradients (with sharded state: own shard)
  std::future<void> exchanged;
  bool ready = false;                // complete for this step: may go to the communication thread
  double seconds = 0;                // the communication thread's time on this step's exchange
  std::int64_t bytes = 0;
};

inline Elem elem_of(DType d) { return d == float64 ? Elem::f64 : Elem::f32; }
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
// Reduces one bucket on the communication thread, by the tree (exact) or by MPI's all-reduce
// (fast), into b.result. `nodes`: this process's partial sums; `covers`: every rank's.
void exchange(Communicator& c, Bucket& b, const std::vector<std::pair<TreeNode, Tensor>>& nodes,
              const std::vector<std::vector<TreeNode>>& covers, std::int64_t m, GradientReduction reduction, bool sharded);

}  // namespace tapegrad::detail
