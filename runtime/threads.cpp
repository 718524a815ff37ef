// Thread count: one process-wide setting that each parallel operation reads when it starts
// (tapegrad's loops, and the products, which ops/matmul_dnnl.cpp cuts into one piece per thread).
#include "tapegrad/runtime/threads.hpp"

#include "autodiff/check.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad {

void set_num_threads(int n) {
  if (n < 1) detail::fail<ValueError>("set_num_threads: argument 'n' must be >= 1, got {}", n);
  detail::set_max_threads(n);
}

int num_threads() noexcept { return detail::max_threads(); }

}  // namespace tapegrad
