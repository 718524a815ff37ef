// How many threads tapegrad's parallel work (oneDNN's kernels) may use.
#pragma once

namespace tapegrad {

// Sets the number of threads for work started from the calling thread (OpenMP's rule: each
// thread that calls tapegrad keeps its own setting). n >= 1.
void set_num_threads(int n);
// The current setting for the calling thread; by default the number of cores (or
// OMP_NUM_THREADS).
int num_threads() noexcept;

}  // namespace tapegrad
