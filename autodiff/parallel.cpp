// parallel_for on libgomp's thread team, through its C ABI: GOMP_parallel is what GCC itself
// emits for `#pragma omp parallel`, so the loops share oneDNN's team (no second pool competing
// for the cores) and no compiler needs OpenMP flags to build tapegrad.
#include "autodiff/parallel.hpp"

#include <algorithm>
#include <atomic>
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

struct Job {
  std::int64_t n;
  int chunks;
  const std::function<void(std::int64_t, std::int64_t)>* body;
  std::exception_ptr error;
  std::mutex error_mutex;
};

void run_chunk(void* data) {
  Job& job = *static_cast<Job*>(data);
  const std::int64_t t = omp_get_thread_num();
  // The team may be smaller than asked for (OMP_THREAD_LIMIT, nesting): each member takes
  // every team-size-th chunk so that all chunks run whatever the team's size.
  const std::int64_t team = std::max(1, omp_get_num_threads());
  for (std::int64_t c = t; c < job.chunks; c += team) {
    const std::int64_t begin = job.n * c / job.chunks, end = job.n * (c + 1) / job.chunks;
    try {
      (*job.body)(begin, end);
    } catch (...) {
      std::lock_guard lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
    }
  }
}

}  // namespace

int max_threads() noexcept {
  const int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  // libgomp's default for a thread that never changed it, read once: later omp_set_num_threads
  // calls by anyone do not move tapegrad's setting.
  static const int omp_default = std::max(1, omp_get_max_threads());
  return omp_default;
}

void set_max_threads(int n) noexcept { g_threads.store(std::max(1, n), std::memory_order_relaxed); }

int parallel_chunks(std::int64_t n, std::int64_t cost) noexcept {
  if (n <= 1 || omp_in_parallel()) return 1;
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
  Job job{n, chunks, &body, nullptr, {}};
  GOMP_parallel(run_chunk, &job, static_cast<unsigned>(chunks), 0);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace tapegrad::detail
