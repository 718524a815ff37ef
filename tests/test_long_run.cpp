// Long runs: 10,000 recorded-and-cleared training steps of a multi-head attention layer keep
// resident memory flat. Documented bound: RSS after step 10,000 is within 4 MiB of RSS after the
// 1,000-step warm-up (allocator caches and the tape's node vector settle during the warm-up).
#define BOOST_TEST_MODULE long_run
#include <fstream>
#include <unistd.h>

#include "support.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;  // its quarantine holds freed memory on purpose
#else
constexpr bool kAddressSanitizer = false;
#endif

}  // namespace

BOOST_AUTO_TEST_CASE(ten_thousand_training_steps_keep_memory_flat) {
  tg::MultiHeadAttention layer({.query_dim = 16, .heads = 2, .dtype = tg::float64, .seed = 1});
  const Tensor x = tg::randn({2, 8, 16}, 2, tg::float64), target = tg::randn({2, 8, 16}, 3, tg::float64);
  auto step = [&] {
    auto [y, attn] = layer.forward(x, x, {.causal = true});
    tg::backward(tg::mean(tg::pow(y - target, 2.0)));
    tg::NoGradGuard no_grad;
    for (Tensor* p : layer.parameters()) {
      *p = (*p - p->grad() * 0.01).detach().set_requires_grad();
    }
    tg::clear_tape();
  };
  for (int i = 0; i < 1000; ++i) step();
  const std::int64_t warm = resident_bytes();
  std::size_t tape_after = 0;
  for (int i = 1000; i < 10000; ++i) {
    step();
    tape_after = std::max(tape_after, tg::tape_size());
  }
  const std::int64_t end = resident_bytes();
  BOOST_TEST_MESSAGE("RSS after 1,000 steps " << warm / 1024 << " KiB, after 10,000 " << end / 1024 << " KiB");
  BOOST_TEST(tape_after == 0u);
  if (kAddressSanitizer) return;
  BOOST_TEST(end - warm <= 4 * 1024 * 1024);
}
