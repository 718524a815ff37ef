#include "autodiff/parallel.hpp"
#include "sections.hpp"

namespace bench {

CopyLoop::CopyLoop(std::int64_t count) : src_(static_cast<std::size_t>(count), 1.5f), dst_(src_.size()) {}

void CopyLoop::operator()() {
  const float* s = src_.data();
  float* d = dst_.data();
  tapegrad::detail::parallel_for(static_cast<std::int64_t>(src_.size()), 1, [s, d](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) d[i] = s[i];
  });
  asm volatile("" : : "r"(d) : "memory");  // the copy must happen
}

}  // namespace bench
