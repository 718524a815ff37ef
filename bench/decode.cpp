// Section "decode": incremental decoding with a KV cache.
// 1. MultiHeadAttention::decode, one token at a time (B = 1): the time of the step that attends
//    over 1, 100, 500 and 1,000 cached positions (median and spread over the 11 steps around it
//    in every run). Beside it the reference "dots": the same number of query-key dot products
//    and weighted value rows as a bare loop, which is what a step has to grow by.
// 2. Decoder::generate with train_chars's default model (width 64, 4 heads, 2 blocks, a window
//    of 64 positions), 300 greedy tokens after a 12-character prompt: tokens per second.
#include <algorithm>

#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

// The arithmetic a step must do over `length` cached positions (width `dim`), in plain loops.
Stats dots(std::int64_t length, std::int64_t dim, const Options& options) {
  std::vector<float> k(static_cast<std::size_t>(length * dim), 0.5f), v(k), q(static_cast<std::size_t>(dim), 0.25f),
      out(static_cast<std::size_t>(dim)), s(static_cast<std::size_t>(length));
  return measure(
      [&] {
        for (std::int64_t j = 0; j < length; ++j) {
          float acc = 0;
          for (std::int64_t d = 0; d < dim; ++d) acc += q[d] * k[j * dim + d];
          s[j] = acc;
        }
        std::fill(out.begin(), out.end(), 0.0f);
        for (std::int64_t j = 0; j < length; ++j)
          for (std::int64_t d = 0; d < dim; ++d) out[d] += s[j] * v[j * dim + d];
        asm volatile("" : : "r"(out.data()) : "memory");
      },
      options.runs, options.seconds / 10);
}

void long_decode(Table& table, std::int64_t dim, std::int64_t heads, int threads, const Options& options) {
  const std::int64_t steps = options.quick ? 100 : 1000;
  const int runs = options.quick ? 2 : dim > 64 ? 3 : 5;
  const tg::MultiHeadAttention layer({.query_dim = dim, .heads = heads, .seed = 3});
  std::vector<std::vector<double>> step_seconds(static_cast<std::size_t>(steps));
  const Tensor x = tg::randn({1, steps, dim}, 4);
  double peak = 0;
  for (int run = 0; run < runs; ++run) {
    const auto decode_all = [&] {
      tg::KVCache cache;
      for (std::int64_t t = 0; t < steps; ++t) {
        const Tensor row = tg::slice(x, 1, t, t + 1);
        const auto t0 = clock_type::now();
        const Tensor y = layer.decode(row, cache).output;
        step_seconds[static_cast<std::size_t>(t)].push_back(since(t0));
      }
    };
    if (run == 0) peak = peak_mib_of(decode_all);
    else decode_all();
  }
  for (std::int64_t at : options.quick ? std::vector<std::int64_t>{1, 50, 100} : std::vector<std::int64_t>{1, 100, 500, 1000}) {
    std::vector<double> around;
    for (std::int64_t t = std::max<std::int64_t>(0, at - 6); t < std::min(steps, at + 5); ++t)
      around.insert(around.end(), step_seconds[static_cast<std::size_t>(t)].begin(), step_seconds[static_cast<std::size_t>(t)].end());
    const Stats step = stats_of(around), reference = dots(at, dim, options);
    table.add({static_cast<std::int64_t>(threads), fmt::format("{}, {} heads", dim, heads), at, step, 1.0 / step.median,
               reference, step.median / reference.median, peak});
  }
}

}  // namespace

void section_decode(Report& report, const Options& options) {
  auto& table = report.table("decode", "MultiHeadAttention::decode, B = 1: us per token median (min-max) at a cache length; "
                                       "x dots = step time / the bare loops' time",
                             {{"threads", "th", 0, 2},
                              {"model", "width, heads", 0, 13},
                              {"cached", "cached", 0, 6},
                              {"step_ms", "step us", 1, 22, true},
                              {"tokens_per_second", "tokens/s", 0, 8},
                              {"dots_ms", "dots us", 2, 22, true},
                              {"step_over_dots", "x dots", 1, 6},
                              {"peak_mib", "peak MiB", 2, 8}});
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    long_decode(table, 64, 4, threads, options);
    if (!options.quick) long_decode(table, 256, 8, threads, options);
  }
  auto& generate = report.table("generate", "Decoder::generate, train_chars's model (width 64, 4 heads, 2 blocks, window 64), greedy",
                                {{"threads", "th", 0, 2},
                                 {"tokens", "tokens", 0, 6},
                                 {"run_ms", "ms per run", 1, 22},
                                 {"tokens_per_second", "tokens/s", 0, 8},
                                 {"first_run_tokens_per_second", "first run tokens/s", 0, 18},
                                 {"peak_mib", "peak MiB", 2, 8}});
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    tg::Decoder model({.vocab = 96, .max_len = 64, .dim = 64, .heads = 4, .layers = 2, .dropout = 0.2,
                       .positions = tg::PositionKind::sinusoidal, .seed = 1});
    model.eval();
    std::vector<std::int64_t> ids(12);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7 % 96);
    const Tensor prompt = tg::from_vector(std::span<const std::int64_t>(ids), {1, 12});
    const std::int64_t tokens = options.quick ? 30 : 300;
    const auto run = [&] { model.generate(prompt, {.new_tokens = tokens, .temperature = 0, .restart_after = 64}); };
    const auto t0 = clock_type::now();
    const double peak = peak_mib_of(run);
    const double first = static_cast<double>(tokens) / since(t0);
    // The first call above also warms up; measure() adds its own warm-up calls before timing.
    const Stats t = measure(run, options.runs, 0);
    generate.add({static_cast<std::int64_t>(threads), tokens, t, static_cast<double>(tokens) / t.median, first, peak});
  }
}

}  // namespace bench
