// Internal: tapegrad's own worker threads, behind parallel_for and the split products.
//
// Why not OpenMP's team, which oneDNN would use: libgomp's idle workers spin for 300,000
// `pause` iterations (1.7 ms measured on the 2-core test machine) after every parallel region,
// and that setting is read once, when libgomp loads, before any of tapegrad's code runs. A
// worker spinning on the second core slowed the thread doing the work on the first by 5-9%
// (both cores of a VM share more than their names say), and a small attention step (B = 8,
// Q = K = 64) ran 50% slower on two threads than on one. These workers spin for kSpinMicros
// after their last task, then sleep on a futex (std::atomic::wait); every oneDNN call
// tapegrad makes runs on one OpenMP thread, from whichever thread calls it, so libgomp never
// starts a team of its own.
//
// A job's tasks are claimed one at a time by the caller and the workers alike: a worker that is
// slow to wake (asleep, or its core taken by another process) leaves its tasks to the caller,
// which is then no slower than running them alone. Which thread runs a task never changes what
// it computes, so results do not depend on the timing.
#pragma once

#include <cstdint>

namespace tapegrad::detail {

// Microseconds an idle worker keeps checking for a new task before it sleeps. Waking a sleeping
// worker cost the caller ~30 us (the futex call) and the worker ~80 us to start on the 2-core
// EPYC VM, so a short spin lost the second thread's gain on loops of a few hundred microseconds
// (`--only threads`: 16,384 softmax rows 1.00x at 50 us, 1.41-1.44x at 250, 1.94x at 1,000);
// a long one took the core from another process (a train_sort step next to a spinning thread:
// 0.86x of one thread's speed at 1,000 us, 0.99-1.01x at 250). libgomp spins 1.7 ms there.
inline constexpr double kSpinMicros = 250.0;

// Runs task(data, i) for every i in [0, count), on the calling thread and on up to
// min(threads, count) - 1 workers (started the first time they are needed), and returns when all
// have finished. Tasks must not throw (a throw ends the program). While the calling thread runs
// tasks, in_pool_task() is true for it as for the workers. For one thread or one task, when
// another thread is already running a job, when called from a task, or for more than 256 tasks,
// the tasks run in order on the calling thread, and pool_run returns false (true: the workers
// were offered the tasks).
bool pool_run(int threads, int count, void (*task)(void*, int), void* data) noexcept;

// Whether the calling thread is running a pool task (nested parallel work then stays on it).
bool in_pool_task() noexcept;

// Workers started so far (tests).
int pool_workers() noexcept;

}  // namespace tapegrad::detail
