#include "runtime/thread_pool.hpp"

#include "runtime/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

extern "C" void omp_set_num_threads(int n);  // libgomp, which oneDNN runs on

namespace tapegrad::detail {
namespace {

thread_local int t_task_depth = 0;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Marks the calling thread as running pool tasks while it lives.
struct InTask {
  InTask() noexcept { ++t_task_depth; }
  ~InTask() { --t_task_depth; }
  InTask(const InTask&) = delete;
  InTask& operator=(const InTask&) = delete;
};

// Spins on `still(value)` for up to kSpinMicros (not at all when spin is false), then sleeps on
// the atomic until it changes.
template <class T, class Still> T wait_while(const std::atomic<T>& a, Still still, bool spin = true) {
  using clock = std::chrono::steady_clock;
  const auto budget = std::chrono::duration<double, std::micro>(spin ? kSpinMicros : 0.0);
  const auto start = clock::now();
  int spins = 0;
  T v;
  while (still(v = a.load(std::memory_order_acquire))) {
    if (++spins < 64) {
      cpu_relax();
      continue;
    }
    spins = 0;
    if (clock::now() - start < budget) continue;
    a.wait(v, std::memory_order_acquire);
  }
  return v;
}

class Pool {
 public:
  // Jobs of more tasks than this run in order on the calling thread (parallel_for makes one
  // task per thread, a split product one piece per thread or up to 8 panels).
  static constexpr int kMaxTasks = 256;

  // false when the tasks ran in order on the calling thread instead (another thread's job was
  // running, or too many tasks).
  bool run(int threads, int count, void (*task)(void*, int), void* data) noexcept {
    if (count > kMaxTasks) return serial(count, task, data), false;
    std::unique_lock lock(submit_, std::try_to_lock);
    if (!lock.owns_lock()) return serial(count, task, data), false;
    const int helpers = grow(std::min(threads, count) - 1);
    task_ = task;
    data_ = data;
    count_.store(count, std::memory_order_relaxed);
    remaining_.store(count, std::memory_order_relaxed);
    // Each task's slot holds the job's number and whether it is taken: a worker still holding
    // an earlier job's number cannot take a task of this one.
    const std::uint64_t open = std::uint64_t{++epoch_} << 1;
    for (int i = 0; i < count; ++i) slots_[i].store(open, std::memory_order_relaxed);
    helpers_.store(helpers, std::memory_order_relaxed);
    job_.store(open, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    {
      const InTask in_task;
      drain(0, open, count);
    }
    wait_while(remaining_, [](int left) { return left != 0; });
    return true;
  }

  int workers() const noexcept { return started_.load(std::memory_order_relaxed); }

  static void serial(int count, void (*task)(void*, int), void* data) noexcept {
    const InTask in_task;
    for (int i = 0; i < count; ++i) task(data, i);
  }

 private:
  // Runs task i of job `open` if no one has taken it. A taken task keeps its job from
  // finishing, so the job's fields stay as they are until it has run.
  bool take(int i, std::uint64_t open) noexcept {
    std::uint64_t expected = open;
    if (!slots_[i].compare_exchange_strong(expected, open | 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return false;
    task_(data_, i);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_all();
    return true;
  }

  // Participant p (0 the caller, w + 1 worker w) runs task p first, the same one each time: in a
  // sequence of loops over the same rows, each thread then finds its rows in its own cache.
  // Then it takes any task not yet taken (the share of a worker that is late).
  void drain(int p, std::uint64_t open, int count) noexcept {
    if (p < count) take(p, open);
    for (int i = 0; i < count; ++i)
      if (i != p) take(i, open);
  }

  // Starts workers up to `wanted`; how many there are, at most `wanted`.
  int grow(int wanted) noexcept {
    for (int i = workers(); i < wanted; ++i) {
      try {
        std::thread(&Pool::work, this, i, generation_.load(std::memory_order_relaxed)).detach();
      } catch (...) {
        break;  // no more threads to be had: the tasks run on those there are
      }
      started_.store(i + 1, std::memory_order_relaxed);
    }
    return std::min(workers(), wanted);
  }

  // A worker: waits for the next job (seen: the generation it has handled), helps with it.
  [[noreturn]] void work(int index, std::uint32_t seen) {
    omp_set_num_threads(1);  // the products it runs stay on it
    t_task_depth = 1;
    bool joined = true;
    for (;;) {
      // A worker that the last job did not ask for sleeps at once: it would only take time
      // from the threads that have work.
      seen = wait_while(generation_, [seen](std::uint32_t g) { return g == seen; }, joined);
      joined = index < helpers_.load(std::memory_order_relaxed);
      if (!joined) continue;
      // count_ may belong to a later job by now: take() then finds the slots of another number.
      drain(index + 1, job_.load(std::memory_order_acquire), std::min(count_.load(std::memory_order_relaxed), kMaxTasks));
    }
  }

  std::mutex submit_;  // one job at a time
  // The current job. task_ and data_ are written by the submitting thread only while no task of
  // the job before is unfinished, and read by a worker only after it has taken a task.
  void (*task_)(void*, int) = nullptr;
  void* data_ = nullptr;
  std::atomic<int> count_{0};
  std::uint64_t epoch_ = 0;
  // What the waiting threads poll, each on a cache line of its own (away from the fields that
  // the submitting thread writes per job).
  std::atomic<std::uint64_t> job_{0};  // the current job's open-slot value
  alignas(64) std::atomic<std::uint64_t> slots_[kMaxTasks] = {};
  alignas(64) std::atomic<int> remaining_{0};  // tasks not yet finished
  std::atomic<int> helpers_{0};                // workers that may join the current job
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  std::atomic<int> started_{0};
};

// Never destroyed: its workers sleep in it until the process ends.
Pool& pool() {
  static Pool* instance = new Pool;
  return *instance;
}

}  // namespace

bool pool_run(int threads, int count, void (*task)(void*, int), void* data) noexcept {
  if (count <= 0) return false;
  if (threads <= 1 || count == 1 || t_task_depth > 0) return Pool::serial(count, task, data), false;
  return pool().run(threads, count, task, data);
}

bool in_pool_task() noexcept { return t_task_depth > 0; }

int pool_workers() noexcept { return pool().workers(); }

}  // namespace tapegrad::detail
