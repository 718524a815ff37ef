// Long runs: training loops of a multi-head attention layer keep resident memory flat, with and
// without clear_tape(). Documented bound: RSS at the end is within 4 MiB of RSS after the
// 1,000-step warm-up (allocator caches settle during the warm-up). Step time is reported, not
// asserted (tests never time); what makes it flat is asserted instead: the number of live
// nodes, which is what a backward pass could walk, never grows past one step's graph.
#define BOOST_TEST_MODULE long_run
#include <chrono>
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

struct Run {
  std::int64_t rss_warm = 0, rss_end = 0;
  std::size_t max_live_nodes = 0;
  double early_ms = 0, late_ms = 0;  // mean step time over steps 1,000-2,000 and the last 1,000
};

// `steps` SGD steps on a causal self-attention layer. `clear` calls clear_tape() each step;
// `backward_every` runs backward on every n-th step only (the others just build a graph).
Run train(int steps, bool clear, int backward_every) {
  tg::MultiHeadAttention layer({.query_dim = 16, .heads = 2, .dtype = tg::float64, .seed = 1});
  const Tensor x = tg::randn({2, 8, 16}, 2, tg::float64), target = tg::randn({2, 8, 16}, 3, tg::float64);
  Run run;
  Tensor loss;  // kept across iterations on purpose: the previous step's graph dies on reassignment
  auto step = [&](int i) {
    auto [y, attn] = layer.forward(x, x, {.masking = {.causal = true}});
    loss = tg::mean(tg::pow(y - target, 2.0));
    if (i % backward_every == 0) {
      tg::backward(loss);
      for (const Tensor& p : layer.parameters()) tg::add_(p, p.grad(), -0.01);
      layer.zero_grad();
    }
    if (clear) tg::clear_tape();
    run.max_live_nodes = std::max(run.max_live_nodes, tg::tape_size());
  };
  using clock = std::chrono::steady_clock;
  auto timed = [&](int from, int to) {
    const auto t0 = clock::now();
    for (int i = from; i < to; ++i) step(i);
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count() / (to - from);
  };
  timed(0, 1000);
  run.rss_warm = resident_bytes();
  run.early_ms = timed(1000, 2000);
  timed(2000, steps - 1000);
  run.late_ms = timed(steps - 1000, steps);
  run.rss_end = resident_bytes();
  return run;
}

void check_flat(const Run& r, std::size_t max_nodes) {
  BOOST_TEST_MESSAGE("RSS after warm-up " << r.rss_warm / 1024 << " KiB, at the end " << r.rss_end / 1024
                                          << " KiB; step time " << r.early_ms << " ms early, " << r.late_ms
                                          << " ms late; at most " << r.max_live_nodes << " live nodes");
  BOOST_TEST(r.max_live_nodes <= max_nodes);
  if (kAddressSanitizer) return;
  BOOST_TEST(r.rss_end - r.rss_warm <= 4 * 1024 * 1024);
}

}  // namespace

BOOST_AUTO_TEST_CASE(ten_thousand_steps_with_clear_tape) {
  const Run r = train(10000, /*clear=*/true, /*backward_every=*/1);
  check_flat(r, 0);  // cleared at the end of every step
}

// The loop a PyTorch user writes: no clear_tape() anywhere.
BOOST_AUTO_TEST_CASE(twenty_thousand_steps_without_clear_tape) {
  const Run r = train(20000, /*clear=*/false, /*backward_every=*/1);
  check_flat(r, 40);  // one step's graph (21 nodes today), kept alive by `loss` until the next step
}

BOOST_AUTO_TEST_CASE(twenty_thousand_steps_without_clear_tape_or_backward_on_most) {
  const Run r = train(20000, /*clear=*/false, /*backward_every=*/7);
  check_flat(r, 40);
}

// The training loop of the README and the examples: a decoder, AdamW, clipping, no clear_tape().
BOOST_AUTO_TEST_CASE(a_thousand_decoder_training_steps_keep_memory_flat) {
  tg::Decoder model({.vocab = 11, .max_len = 12, .dim = 32, .heads = 4, .layers = 2, .dropout = 0.1, .seed = 3});
  tg::AdamW opt(model.named_parameters(), {.lr = 1e-3});
  tg::Generator gen(4);
  std::vector<std::int64_t> ids(16 * 12);
  std::size_t max_nodes = 0;
  std::int64_t warm = 0;
  for (int step = 0; step < 1000; ++step) {
    for (auto& id : ids) id = static_cast<std::int64_t>(gen.uniform() * 11);
    const Tensor x = tg::from_vector(std::span<const std::int64_t>(ids), {16, 12});
    const Tensor loss = tg::cross_entropy(model.forward(x), x);
    tg::backward(loss);
    tg::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    max_nodes = std::max(max_nodes, tg::tape_size());
    if (step == 199) warm = resident_bytes();
  }
  const std::int64_t end = resident_bytes();
  BOOST_TEST_MESSAGE("decoder: RSS after 200 steps " << warm / 1024 << " KiB, after 1,000 " << end / 1024 << " KiB; at most "
                                                      << max_nodes << " live nodes");
  BOOST_TEST(tg::tape_size() == 0u);
  if (kAddressSanitizer) return;
  BOOST_TEST(end - warm <= 4 * 1024 * 1024);
}
