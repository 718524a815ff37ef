// The sections of tapegrad_bench, one file each. Each measures its part, prints its tables and
// adds them to the report; every ratio it prints is against a reference measured in the same
// run, in alternating rounds (measure()).
#pragma once

#include <string>
#include <vector>

#include "report.hpp"

namespace bench {

struct Options {
  bool quick = false;         // small sizes and few runs: checks that the benchmark runs
  std::vector<int> threads;   // thread counts each section runs at, in turn
  int runs = 10;              // timed calls per figure, at least (after warm-up)
  double seconds = 0.3;       // and at least this long in all
};

// Facts about the machine; the two references per thread count (copy loop, oneDNN's float32 matmul).
void section_system(Report& report, const Options& options);
// tapegrad::matmul against the raw oneDNN primitive, a naive loop and bfloat16.
void section_matmul(Report& report, const Options& options);
// The tape's fixed cost per recorded op.
void section_overhead(Report& report, const Options& options);
// Elementwise ops and reductions against a copy of the same bytes.
void section_kernels(Report& report, const Options& options);
// The public softmax ops against a copy of the same bytes.
void section_softmax(Report& report, const Options& options);
// MultiHeadAttention on the weights path, toy to long shapes, against oneDNN's products (roofline).
void section_attention(Report& report, const Options& options);
// Fused path (need_weights = false) against the weights path on long sequences: time and peak memory.
void section_fused(Report& report, const Options& options);
// Sliding windows, grouped-query heads and ALiBi against full attention: training calls and decoding.
void section_variants(Report& report, const Options& options);
// bfloat16 compute against float32: speed-ups and error against float64.
void section_bf16(Report& report, const Options& options);
// KV-cache decoding: per-token cost as the cache grows; generated tokens per second.
void section_decode(Report& report, const Options& options);
// Each operation with 1 thread against N threads, alone and next to a thread that keeps a core busy.
void section_threads(Report& report, const Options& options);
// A training step of train_sort's model: tokens per second and where the time goes.
void section_train(Report& report, const Options& options);
// A GPT-2-shaped training step: against its matmul limit, op by op, threads, bfloat16, memory.
void section_gpt2(Report& report, const Options& options);
// Data-parallel training, 1 process x 2 threads against 2 processes x 1 thread (tapegrad_dp_worker under mpirun).
void section_distributed(Report& report, const Options& options);
// Saving and loading checkpoints of 1k to 100k tensors: time per tensor and resident memory.
void section_checkpoint(Report& report, const Options& options);

// A field of /proc/self/status in kB ("VmRSS:", "VmHWM:"), or -1.
std::int64_t status_kb(const char* field);
// This program run again with `args` (a hidden child option), and the number it prints, or -1.
double run_self(const std::string& args);

// The fused section's child process: prints the resident MiB one call adds at its peak.
int fused_rss_child(long long len, bool need_weights, bool backward, int threads);
// The checkpoint section's child process: prints the resident bytes one load of `path` adds at its peak.
int checkpoint_rss_child(const std::string& path);

// A copy of `count` floats split over tapegrad's threads like its own loops: the bandwidth that
// memory-bound kernels are held to. CopyLoop copy(n); copy() runs one copy.
class CopyLoop {
 public:
  explicit CopyLoop(std::int64_t count);
  void operator()();
  double bytes() const { return 8.0 * static_cast<double>(src_.size()); }  // read + written

 private:
  std::vector<float> src_, dst_;
};

// The copy loop over buffers well past the last-level cache: the machine's memory bandwidth,
// which the performance targets of memory-bound kernels (elementwise ops, reductions, softmax)
// are fractions of. Per side, 4x the L3 size sysconf reports, within 64-256 MiB (64 MiB when
// it reports none; a virtual machine may report the L3 of every core complex summed, more than
// one core reaches; --quick: 1 MiB, only to check that it runs). One per process, built at its
// first call.
CopyLoop& memory_copy(const Options& options);

}  // namespace bench
