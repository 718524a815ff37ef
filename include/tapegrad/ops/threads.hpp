// How many threads tapegrad's parallel work (oneDNN's products, tapegrad's own loops) may use.
#pragma once

namespace tapegrad {

// Sets the thread count for the whole process: it applies to work started from any thread,
// from the next operation on. n >= 1. Each operation uses at most n threads, and only as many
// as its size repays: products below a few hundred microseconds of work and small loops run on
// the calling thread (README, "Threads").
void set_num_threads(int n);
// The current setting; until set_num_threads is called, OpenMP's default: OMP_NUM_THREADS when
// set, else the number of cores the process may run on.
int num_threads() noexcept;

}  // namespace tapegrad
