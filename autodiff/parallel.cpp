// parallel_for on libgomp's thread team, through its C ABI: GOMP_parallel is what GCC itself
// emits for `#pragma omp parallel`, so the loops share oneDNN's team (no second pool competing
// for the cores) and no compiler needs OpenMP flags to build tapegrad.
#include "autodiff/parallel.hpp"

#include "autodiff/thread_choice.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <exception>
#include <mutex>

extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
int omp_get_thread_num(void);
int omp_get_num_threads(void);
int omp_get_max_threads(void);
int omp_in_parallel(void);
}

namespace tapegrad::detail {
namespace {

std::atomic<int> g_threads{0};  // 0: not set

// Bodies that parallel_for runs in order on the calling thread (ThreadChoice chose one thread):
// work nested in them must run inline, as it does inside the team.
thread_local int t_serial_depth = 0;

struct Job {
  std::int64_t n;
  int chunks;
  const std::function<void(std::int64_t, std::int64_t)>* body;
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<double> busy{0.0};  // seconds the chunks took, summed: what one thread would need

  void run(std::int64_t c) {
    const std::int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
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

void run_chunk(void* data) {
  Job& job = *static_cast<Job*>(data);
  const std::int64_t t = omp_get_thread_num();
  // The team may be smaller than asked for (OMP_THREAD_LIMIT, nesting): each member takes
  // every team-size-th chunk so that all chunks run whatever the team's size.
  const std::int64_t team = std::max(1, omp_get_num_threads());
  for (std::int64_t c = t; c < job.chunks; c += team) job.run(c);
}

}  // namespace

int max_threads() noexcept {
  const int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  // One thread unless OMP_NUM_THREADS asks for more. libgomp's workers spin for milliseconds
  // while they wait (OMP_WAIT_POLICY and GOMP_SPINCOUNT are read once, when libgomp loads, and
  // nothing can change them later): on a machine where another process holds a core, a spinning
  // thread takes the time the thread with work needs, and a 512^3 product took 5-7x longer on
  // two threads than on one (README, "Threads"). More threads are an explicit choice.
  static const int fallback = std::getenv("OMP_NUM_THREADS") ? std::max(1, omp_get_max_threads()) : 1;
  return fallback;
}

void set_max_threads(int n) noexcept { g_threads.store(std::max(1, n), std::memory_order_relaxed); }

bool in_parallel_body() noexcept { return t_serial_depth > 0 || omp_in_parallel(); }

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
  if (threads == 1) {
    // The same chunks in order, so the result does not depend on the choice.
    ++t_serial_depth;
    for (int c = 0; c < chunks; ++c) job.run(c);
    --t_serial_depth;
    record_threads(key, 1, start);
  } else {
    GOMP_parallel(run_chunk, &job, static_cast<unsigned>(chunks), 0);
    // The chunks' own times, summed, are what one thread would have taken: the team's run
    // measures both choices, and no trial on one thread is needed to leave a slow team.
    record_threads(key, threads, start, job.busy.load(std::memory_order_relaxed));
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace tapegrad::detail
