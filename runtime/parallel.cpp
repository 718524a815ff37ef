// parallel_for on tapegrad's own workers (thread_pool.hpp says why not OpenMP's team).
#include "runtime/parallel.hpp"

#include "runtime/thread_choice.hpp"
#include "runtime/thread_pool.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

extern "C" {
int omp_get_max_threads(void);
int omp_in_parallel(void);
}

namespace tapegrad::detail {
namespace {

std::atomic<int> g_threads{0};  // 0: not set

struct Job {
  std::int64_t n;
  int chunks;
  const std::function<void(std::int64_t, std::int64_t)>* body;
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<double> busy{0.0};  // seconds the chunks took, summed: what one thread would need

  void run(std::int64_t c) {
    // floor(n i / chunks) without forming n i, which can pass int64 for a large n and many threads
    const auto at = [&](std::int64_t i) { return n / chunks * i + n % chunks * i / chunks; };
    const std::int64_t begin = at(c), end = at(c + 1);
    const double start = now_seconds();
    try {
      (*body)(begin, end);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
    busy.fetch_add(now_seconds() - start, std::memory_order_relaxed);
  }
};

void run_chunk(void* data, int c) noexcept { static_cast<Job*>(data)->run(c); }

// The cores this process may run on (its CPU affinity, which taskset and cpusets narrow; a CPU
// quota does not), as PyTorch, oneDNN and OpenBLAS default to; OMP_NUM_THREADS wins when set. Results have the same bits on any count, so the default only changes the speed.
int affinity_cores() noexcept {
  for (int cpus = 1024; cpus <= (1 << 20); cpus *= 4) {  // a set too small for the kernel's: EINVAL
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) break;
    const std::size_t bytes = CPU_ALLOC_SIZE(cpus);
    const int got = sched_getaffinity(0, bytes, set) == 0 ? CPU_COUNT_S(bytes, set) : (errno == EINVAL ? 0 : -1);
    CPU_FREE(set);
    if (got > 0) return got;
    if (got < 0) break;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}
int default_threads() noexcept {
  static const int n = std::getenv("OMP_NUM_THREADS") ? std::max(1, omp_get_max_threads()) : affinity_cores();
  return n;
}
// Read when the library loads: the oneDNN calls set the calling thread's OpenMP count to 1 for
// their duration, and a first read inside one would keep that 1 for the process.
[[maybe_unused]] const int g_default_at_load = default_threads();

}  // namespace

int max_threads() noexcept {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : default_threads();
}

void set_max_threads(int n) noexcept { g_threads.store(std::max(1, n), std::memory_order_relaxed); }

// Also inside the caller's own OpenMP region: tapegrad then adds no threads of its own.
bool in_parallel_body() noexcept { return in_pool_task() || omp_in_parallel(); }

int parallel_chunks(std::int64_t n, std::int64_t cost) noexcept {
  if (n <= 1 || in_parallel_body()) return 1;
  const int threads = max_threads();
  if (threads <= 1) return 1;
  const std::int64_t work = n * std::max<std::int64_t>(cost, 1);
  if (work < kParallelGrain) return 1;
  return static_cast<int>(std::min<std::int64_t>({threads, n, work / kParallelGrain}));
}

void parallel_for(std::int64_t n, std::int64_t cost, const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  const int chunks = parallel_chunks(n, cost);
  if (chunks == 1) {
    body(0, n);
    return;
  }
  // One kind of work per call site (the body's type) and size class, so that a compute-bound
  // loop and a memory-bound one of the same size keep separate times.
  const auto work = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(std::max<std::int64_t>(cost, 1));
  std::uint64_t key = mix_key(kKeySeed, body.target_type().hash_code());
  key = mix_key(key, static_cast<std::uint64_t>(std::bit_width(work)));
  key = mix_key(key, static_cast<std::uint64_t>(chunks));
  const double start = now_seconds();
  const int threads = choose_threads(key, chunks, start);
  Job job{n, chunks, &body, nullptr, {}};
  // On one thread (the choice, or another thread's job holding the workers) the pool runs the
  // same chunks in order, so the result does not depend on the choice. On the workers, the
  // chunks' own times, summed, are what one thread would have taken: the run measures both
  // choices, and no trial on one thread is needed to leave a slow team.
  if (pool_run(threads, chunks, run_chunk, &job)) record_threads(key, threads, start, job.busy.load(std::memory_order_relaxed));
  else record_threads(key, 1, start);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace tapegrad::detail
