// Data-parallel training: every process holds the whole model, computes the gradients of its
// share of each step's micro-batches, and the processes exchange them so that every one steps
// with the same averaged gradient.
//
//   tg::ProcessGroup group;
//   tg::DataParallel dp(group, model, {.micro_batches = M});   // rank 0's parameters everywhere
//   tg::AdamW opt(dp.optimizer_parameters(), {.lr = 3e-4});
//   for (std::int64_t step = 0; step < steps; ++step) {
//     // the step's M micro-batches of `rows` windows, drawn alike on every process
//     for (std::int64_t k = dp.first_micro_batch(); k < dp.end_micro_batch(); ++k) {
//       tg::key_generators(model, seed, step * M + k);       // dropout keyed by micro-batch
//       dp.backward(tg::cross_entropy(model.forward(tg::narrow(x, 0, k * rows, rows)), tg::narrow(y, 0, k * rows, rows)));
//     }
//     dp.synchronize();                                       // .grad: the mean over the M
//     dp.clip_grad_norm(1.0);
//     opt.step();
//     dp.share_parameters();                                  // with sharded optimizer state
//   }
//
// docs/distributed.md has the whole loop, checkpoints included.
//
// How (PyTorch DDP's design, on MPI): the gradients are grouped in buckets of about
// bucket_bytes, in the reverse order of the parameters (the order the backward completes them).
// During the backward of a process's last micro-batch, a bucket is handed to the communication
// thread as soon as its last gradient is ready (the tape's on_gradient_ready), always in bucket
// order, so the exchange overlaps the rest of the backward.
//
// GradientReduction::exact (the default) sums the M micro-batch gradients in one fixed tree
// (docs/distributed.md): each process sums the largest subtrees inside its micro-batches, the
// processes exchange shards of those partial sums (all-to-all), each sums its shard in the
// tree's order, and the shards are gathered. The averaged gradient, and so every parameter after
// any number of steps, has the same bits for every process count that divides M, and equals
// one process computing the M micro-batches; on any thread count. GradientReduction::fast sums each
// process's micro-batches, then MPI_Allreduce: less traffic, but its bits depend on the process
// count (MPI fixes no order of the sum).
//
// shard_optimizer_state (ZeRO-1): each parameter's optimizer state lives on one process, which
// alone updates it; share_parameters() then sends the new values to all. Same bits as without.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "tapegrad/distributed/process_group.hpp"
#include "tapegrad/layers/module.hpp"
#include "tapegrad/train/optimizer.hpp"
#include "tapegrad/train/training_state.hpp"

namespace tapegrad {

enum class GradientReduction { exact, fast };

struct DataParallelOptions {
  // M, the micro-batches of one step over all processes; the process count must divide it.
  std::int64_t micro_batches = 1;
  // About this many bytes of gradients per bucket (a parameter larger than that is a bucket of
  // its own); PyTorch DDP's default. In (0, 1 GiB].
  std::int64_t bucket_bytes = std::int64_t{25} << 20;
  GradientReduction reduction = GradientReduction::exact;
  // ZeRO-1: each process keeps the optimizer state of its own parameters only.
  bool shard_optimizer_state = false;
};

// What the exchanges cost, summed over the steps so far.
struct DataParallelStats {
  std::int64_t steps = 0;
  double exchange_seconds = 0;  // the communication thread's time on this process's buckets
  double waiting_seconds = 0;   // of it, what synchronize() waited for: what the backward did not hide
  std::int64_t bytes_sent = 0;  // gradient bytes this process sent
};

class DataParallel {
 public:
  // Checks that every process has the same parameters (names, shapes, dtypes, which train) and
  // options (a DistributedError names the first difference and the ranks) before anything else,
  // then gives every process rank 0's parameter values. Every parameter must be float32 or
  // float64; one that does not require grad is frozen (rank 0's values, no gradient, not the
  // optimizer's). DataParallel owns the parameters' .grad from here on, and knows each
  // parameter by the tensor it has now.
  DataParallel(ProcessGroup& group, Module& model, const DataParallelOptions& options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // This process's micro-batches of each step: [first_micro_batch(), end_micro_batch()), M / P
  // consecutive ones (rank r takes r M / P onwards).
  std::int64_t first_micro_batch() const noexcept { return first_; }
  std::int64_t end_micro_batch() const noexcept { return end_; }
  std::int64_t micro_batches() const noexcept { return options_.micro_batches; }

  // Runs the backward of the next micro-batch's loss (a scalar that requires grad). Its
  // gradients join this process's sums, not .grad (which it clears); the last micro-batch's
  // start the exchange as they complete. A failure before any gradient joined the sums leaves
  // the micro-batch to be run again; one after it ends this DataParallel (a DistributedError).
  void backward(const Tensor& loss);
  // Waits for the exchange; then every parameter's .grad is the mean of its gradient over the M
  // micro-batches (with sharded optimizer state, only this process's parameters have one). A
  // parameter no micro-batch reached counts a zero gradient.
  void synchronize();
  // After synchronize(): the global norm of the gradients, clip_grad_norm's rule and bits, with
  // sharded state too.
  double clip_grad_norm(double max_norm);
  // The parameters this process's optimizer updates: all of them, or its own with sharded state.
  std::vector<NamedTensor> optimizer_parameters() const;
  // After the optimizer's step: with sharded state, every process receives the parameters the
  // others updated (the next backward, and a checkpoint, refuse to go on without it); otherwise
  // nothing to do.
  void share_parameters();
  bool sharded() const noexcept { return options_.shard_optimizer_state; }
  // The rank whose optimizer updates parameter `name` with sharded state (consecutive
  // parameters, about as many elements on each rank; a rank may get none when one parameter
  // holds most of them).
  int owner(const std::string& name) const;
  const DataParallelStats& stats() const noexcept { return stats_; }
  // Whether the parameters are the same on every process now (not between a sharded step and
  // share_parameters()).
  bool parameters_shared() const noexcept;
  ProcessGroup& group() noexcept { return group_; }

  struct Impl;

 private:
  void launch(std::size_t bucket);  // hands a bucket to the communication thread
  ProcessGroup& group_;
  DataParallelOptions options_;
  std::int64_t first_ = 0, end_ = 1;
  DataParallelStats stats_;
  std::shared_ptr<Impl> impl_;
};

// Sets each of the model's random streams (its Dropout layers') to a stream that depends only on
// `seed`, the stream's name and `index`: keyed by the global micro-batch number, dropout draws
// the same masks for a micro-batch on whichever process computes it.
void key_generators(Module& model, std::uint64_t seed, std::int64_t index);

// A data-parallel run's whole training state (training_state.hpp) in one file, which rank 0
// writes and every rank reads, whatever the process count that wrote it, with or without sharded
// optimizer state: sharded, each parameter's optimizer state is broadcast by the rank that keeps
// it for rank 0 to write, and each rank takes its own from the file (rank 0 holds the whole
// optimizer state while it writes, and every rank while it reads). Every rank calls them, with
// an optimizer on dp.optimizer_parameters(); the path must be one every rank can read (a shared
// file system).
void save_training_state(const std::filesystem::path& path, const TrainingState& state, DataParallel& dp);
void load_training_state(const std::filesystem::path& path, TrainingState& state, DataParallel& dp);

// Every rank's `values` (the same count on each), in rank order.
std::vector<double> all_gather(ProcessGroup& group, const std::vector<double>& values);

}  // namespace tapegrad
