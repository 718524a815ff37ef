#include <unistd.h>

#include <algorithm>

#include "runtime/parallel.hpp"
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

CopyLoop& memory_copy(const Options& options) {
  static CopyLoop copy([&] {
    constexpr std::int64_t kMiB = 1 << 20;
    if (options.quick) return kMiB / static_cast<std::int64_t>(sizeof(float));
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 when unknown
    const std::int64_t side = l3 > 0 ? std::clamp<std::int64_t>(4 * static_cast<std::int64_t>(l3), 64 * kMiB, 256 * kMiB) : 64 * kMiB;
    return side / static_cast<std::int64_t>(sizeof(float));
  }());
  return copy;
}

}  // namespace bench
