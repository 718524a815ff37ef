// How many threads tapegrad's parallel work (oneDNN's products, tapegrad's own loops) may use:
// the calling thread and tapegrad's own workers, which sleep after 250 us without work.
#pragma once

namespace tapegrad {

// Sets the thread count for the whole process: it applies to work started from any thread,
// from the next operation on. n >= 1. Each operation uses at most n threads, and only as many
// as its size repays: products below about 10 microseconds of work and small loops run on
// the calling thread (docs/threads.md).
void set_num_threads(int n);
// The current setting. Until set_num_threads is called: OMP_NUM_THREADS when that is set, else
// the number of cores the process may run on (its CPU affinity: taskset, cpusets). Each
// operation still takes only the threads its size repays (docs/threads.md). Results have the
// same bits on any count (tests/test_parallel.cpp, tests/test_kernels.cpp).
int num_threads() noexcept;

}  // namespace tapegrad
