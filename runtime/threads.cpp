// set_num_threads / num_threads (tapegrad/runtime/threads.hpp) over the runtime's thread count.
#include "tapegrad/runtime/threads.hpp"

#include <fmt/format.h>

#include "runtime/parallel.hpp"
#include "tapegrad/autodiff/error.hpp"

namespace tapegrad {

void set_num_threads(int n) {
  if (n < 1) throw ValueError(fmt::format("set_num_threads: argument 'n' must be >= 1, got {}", n));
  detail::set_max_threads(n);
}

int num_threads() noexcept { return detail::max_threads(); }

}  // namespace tapegrad
