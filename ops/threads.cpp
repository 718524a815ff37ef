// Thread count: oneDNN runs on the OpenMP runtime, so OpenMP's per-thread setting is the one
// that governs it.
#include "tapegrad/ops/threads.hpp"

#include "autodiff/check.hpp"

// The two OpenMP runtime calls, declared here rather than through <omp.h>: that header comes with
// each compiler's own runtime, and tapegrad must use libgomp, the one Debian's oneDNN runs on.
extern "C" {
void omp_set_num_threads(int n);
int omp_get_max_threads(void);
}

namespace tapegrad {

void set_num_threads(int n) {
  if (n < 1) detail::fail<ValueError>("set_num_threads: argument 'n' must be >= 1, got {}", n);
  omp_set_num_threads(n);
}

int num_threads() noexcept { return omp_get_max_threads(); }

}  // namespace tapegrad
