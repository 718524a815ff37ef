// Internal: what the library outside runtime/ calls to run work on several threads: loops
// (parallel_for), and for work that cuts itself into pieces (oneDNN's split products) the
// workers and ThreadChoice behind them.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>

namespace tapegrad::detail {

// The process-wide thread count behind set_num_threads()/num_threads(): every parallel piece of
// tapegrad (these loops, oneDNN's products) reads it when it starts, whichever thread calls.
// Until set: OMP_NUM_THREADS when that is set, else 1.
int max_threads() noexcept;
void set_max_threads(int n) noexcept;

// Below this many elements (times the per-element cost) a loop stays on the calling thread:
// handing chunks to an awake worker costs a few microseconds, which is what ~32k float copies
// take (a sleeping one takes longer to start; thread_choice.hpp weighs that).
inline constexpr std::int64_t kParallelGrain = 1 << 15;

// Calls body(begin, end) on disjoint chunks covering [0, n), in parallel when n * cost is at
// least kParallelGrain and max_threads() > 1, else once on the calling thread. Chunks are
// contiguous and at most max_threads() of them run at once; a nested call (from inside a
// body) runs inline. When the team has lately been slower than one thread for this call site
// and size (thread_choice.hpp), the same chunks run in order on the calling thread, so the
// result never depends on the choice. An exception thrown by a body is rethrown on the calling thread after
// every chunk has finished.
void parallel_for(std::int64_t n, std::int64_t cost, const std::function<void(std::int64_t, std::int64_t)>& body);

// Whether the calling thread runs a parallel_for body (on the team, or in order when one thread
// was chosen): nested parallel work then stays on it.
bool in_parallel_body() noexcept;

// A loop's cost per item from factors that may multiply past int64 (sizes of operands that hold
// no element, say): their product, capped where it no longer changes any choice.
inline std::int64_t cost_of(std::initializer_list<double> factors) {
  double c = 1;
  for (double f : factors) c *= f;
  return c < 1e15 ? static_cast<std::int64_t>(c) : std::int64_t{1'000'000'000'000'000};
}

// How many chunks parallel_for would use for n * cost units of work (1 when it stays serial).
int parallel_chunks(std::int64_t n, std::int64_t cost) noexcept;

// ---- Work that cuts itself into pieces ---------------------------------------------------

// Runs task(data, i) for every i in [0, count), on the calling thread and on up to
// min(threads, count) - 1 workers (started the first time they are needed), and returns when all
// have finished. Tasks must not throw (a throw ends the program). For one thread or one task,
// when another thread is already running a job, when called from a task, or for more than 256
// tasks, the tasks run in order on the calling thread, and pool_run returns false (true: the
// workers were offered the tasks).
bool pool_run(int threads, int count, void (*task)(void*, int), void* data) noexcept;

// Seconds on a monotonic clock.
double now_seconds() noexcept;
// The thread count for the next run of work `key` (its kind: shape, layout...), which the size
// rule gives `wanted` > 1 threads: `wanted`, or 1 while the team has lately been slower
// (thread_choice.hpp); `start` = now_seconds() before the run. Then what the run took.
int choose_threads(std::uint64_t key, int wanted, double start);
void record_threads(std::uint64_t key, int threads, double start, double one_thread_estimate = 0);

// Mixes v into a key (FNV-1a over 64-bit words).
constexpr std::uint64_t mix_key(std::uint64_t key, std::uint64_t v) noexcept { return (key ^ v) * 0x100000001b3ULL; }
inline constexpr std::uint64_t kKeySeed = 0xcbf29ce484222325ULL;

}  // namespace tapegrad::detail
