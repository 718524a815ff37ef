// Incremental decoding with a KV cache: what one token costs as the cache grows, and generated
// tokens per second for train_chars's model.
//
// 1. MultiHeadAttention::decode, one token at a time for 1,000 steps (B = 1): the time of the
//    step that attends over 1, 100, 500 and 1,000 cached positions (median over the steps
//    around it and over the runs). Next to it, "dots": the same number of query-key dot products
//    and weighted value rows as a bare loop, which is what a step has to grow by.
// 2. Decoder::generate with train_chars's default model (width 64, 4 heads, 2 blocks, a window
//    of 64 positions), 300 tokens after a 12-character prompt, greedy: tokens per second.
//
//   ./build/bench/bench_decode [--threads N]
#include <algorithm>
#include <chrono>
#include <vector>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;
using tg::Tensor;

namespace {

using clock_type = std::chrono::steady_clock;
double us_since(clock_type::time_point t0) { return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The arithmetic a step must do over `length` cached positions (width `dim`): scores q.k for
// every key, then the weighted sum of the value rows, in plain loops.
double dots_us(std::int64_t length, std::int64_t dim) {
  std::vector<float> k(static_cast<std::size_t>(length * dim), 0.5f), v(k), q(static_cast<std::size_t>(dim), 0.25f),
      out(static_cast<std::size_t>(dim));
  std::vector<float> s(static_cast<std::size_t>(length));
  std::vector<double> times;
  for (int rep = 0; rep < 51; ++rep) {
    const auto t0 = clock_type::now();
    for (std::int64_t j = 0; j < length; ++j) {
      float acc = 0;
      for (std::int64_t d = 0; d < dim; ++d) acc += q[d] * k[j * dim + d];
      s[j] = acc;
    }
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::int64_t j = 0; j < length; ++j)
      for (std::int64_t d = 0; d < dim; ++d) out[d] += s[j] * v[j * dim + d];
    times.push_back(us_since(t0));
    if (out[0] == 12345.0f) fmt::print(" ");  // keeps the loops
  }
  return median(times);
}

void long_decode(std::int64_t dim, std::int64_t heads, int runs) {
  constexpr std::int64_t kSteps = 1000;
  const tg::MultiHeadAttention layer({.query_dim = dim, .heads = heads, .seed = 3});
  std::vector<std::vector<double>> step_us(kSteps);
  std::vector<double> first_run(kSteps);
  tg::Generator gen(4);
  const Tensor x = tg::randn({1, kSteps, dim}, gen);
  for (int run = 0; run < runs; ++run) {
    tg::KVCache cache;
    for (std::int64_t t = 0; t < kSteps; ++t) {
      const Tensor row = tg::slice(x, 1, t, t + 1);
      const auto t0 = clock_type::now();
      const Tensor y = layer.decode(row, cache).output;
      const double us = us_since(t0);
      step_us[static_cast<std::size_t>(t)].push_back(us);
      if (run == 0) first_run[static_cast<std::size_t>(t)] = us;
    }
  }
  fmt::print("MultiHeadAttention::decode, width {}, {} heads, B = 1: microseconds per token ({} runs of {} steps)\n", dim, heads,
             runs, kSteps);
  fmt::print("{:>8} {:>12} {:>12} {:>10}\n", "cached", "median us", "first run", "dots us");
  for (std::int64_t at : {1, 100, 500, 1000}) {
    std::vector<double> around, first;
    for (std::int64_t t = std::max<std::int64_t>(0, at - 6); t < std::min(kSteps, at + 5); ++t) {
      around.insert(around.end(), step_us[static_cast<std::size_t>(t)].begin(), step_us[static_cast<std::size_t>(t)].end());
      first.push_back(first_run[static_cast<std::size_t>(t)]);
    }
    fmt::print("{:>8} {:>12.1f} {:>12.1f} {:>10.2f}\n", at, median(around), median(first), dots_us(at, dim));
  }
  double total = 0;
  for (const auto& s : step_us) total += median(s);
  fmt::print("{} steps: {:.1f} ms (median per step, summed)\n\n", kSteps, total / 1000);
}

void generate_chars() {
  // train_chars's defaults on a 96-character alphabet.
  tg::Decoder model({.vocab = 96, .max_len = 64, .dim = 64, .heads = 4, .layers = 2, .dropout = 0.2,
                     .positions = tg::PositionKind::sinusoidal, .seed = 1});
  model.eval();
  std::vector<std::int64_t> ids(12);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7 % 96);
  const Tensor prompt = tg::from_vector(std::span<const std::int64_t>(ids), {1, 12});
  constexpr std::int64_t kTokens = 300;
  std::vector<double> rates;
  for (int run = 0; run < 7; ++run) {
    const auto t0 = clock_type::now();
    model.generate(prompt, {.new_tokens = kTokens, .temperature = 0, .window = 64});
    rates.push_back(kTokens / (us_since(t0) * 1e-6));
    if (run == 0) fmt::print("Decoder::generate (train_chars's model, window 64): first run {:.0f} tokens/s\n", rates.back());
  }
  fmt::print("Decoder::generate: {:.0f} tokens/s (median of 7 runs of {} tokens)\n", median(rates), kTokens);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  CLI::App app{"bench_decode: per-token cost of KV-cache decoding, and generation speed"};
  app.add_option("--threads", threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tg::set_num_threads(threads);
  fmt::print("{} thread(s)\n", tg::num_threads());
  long_decode(64, 4, 5);
  long_decode(256, 8, 3);
  generate_chars();
}
