// What a second thread buys, per operation: each shape is timed with 1 thread and with N
// threads in alternating blocks of the same run (best of 7 blocks each), so both see the same
// machine. Ratio = time with 1 thread / time with N threads: above 1 the threads help. Run it
// once on an idle machine and once next to a process that keeps a core busy, e.g.
//
//   ./build/bench/bench_threads --threads 2
//   taskset -c 0 sh -c 'while :; do :; done' & ./build/bench/bench_threads --threads 2; kill %1
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

#include "bench_support.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

struct Case {
  std::string name;
  double flop;  // 0 for the ops that are not products
  std::function<void()> run;
};

Case product(std::string name, std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n) {
  const Tensor a = tg::full({batch, m, k}, 0.5), b = tg::full({batch, k, n}, 0.25);
  return {std::move(name), 2.0 * static_cast<double>(batch * m * k * n), [a, b] { tg::matmul(a, b); }};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  CLI::App app{"bench_threads: each operation with 1 thread against N threads, alternating"};
  app.add_option("--threads", threads, "N, the thread count compared with 1")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  tg::NoGradGuard no_grad;
  std::vector<Case> cases;
  for (std::int64_t s : {16, 32, 64, 96, 128, 192, 256, 384, 512, 1024})
    cases.push_back(product(fmt::format("{}^3", s), 1, s, s, s));
  // The products of bench_train (1024 tokens of width 64, 4 heads of 16) and of decoding.
  cases.push_back(product("train: proj 1024x64@64x64", 1, 1024, 64, 64));
  cases.push_back(product("train: ffn 1024x64@64x256", 1, 1024, 64, 256));
  cases.push_back(product("train: ffn 1024x256@256x64", 1, 1024, 256, 64));
  cases.push_back(product("train: scores [256] 16x16@16x16", 256, 16, 16, 16));
  cases.push_back(product("decode: [4] 1x16@16x500", 4, 1, 16, 500));
  cases.push_back(product("decode: proj 1x256@256x768", 1, 1, 256, 768));
  cases.push_back(product("attention large [32] 512x64@64x512", 32, 512, 64, 512));
  for (std::int64_t n : {1 << 12, 1 << 16, 1 << 20, 1 << 22}) {
    const Tensor x = tg::full({n}, 0.5), y = tg::full({n}, 0.25);
    cases.push_back({fmt::format("add, {} elements", n), 0, [x, y] { tg::add(x, y); }});
    const Tensor rows = tg::full({n / 64, 64}, 0.5);
    cases.push_back({fmt::format("softmax, {} rows of 64", n / 64), 0, [rows] { tg::masked_softmax(rows); }});
  }
  // A whole training step of bench_train's model (train_sort's: 64 sequences of 16 tokens).
  tg::Decoder model({.vocab = 11, .max_len = 17, .dim = 64, .heads = 4, .layers = 2, .seed = 1});
  tg::AdamW opt(model.named_parameters(), {.lr = 1e-4});
  tg::Generator gen(2);
  std::vector<std::int64_t> ids(64 * 16), targets(64 * 16);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int64_t>(gen.uniform() * 11);
    targets[i] = static_cast<std::int64_t>(gen.uniform() * 10);
  }
  const Tensor x = tg::from_vector(std::span<const std::int64_t>(ids), {64, 16});
  const Tensor y = tg::from_vector(std::span<const std::int64_t>(targets), {64, 16});
  cases.push_back({"train_sort step (fwd+bwd+AdamW)", 0, [&] {
                     tg::EnableGradGuard grad;
                     tg::backward(tg::cross_entropy(model.forward(x), y));
                     opt.step();
                     opt.zero_grad();
                   }});
  fmt::print("1 thread against {} threads, best of 7 alternating blocks\n", threads);
  fmt::print("{:<36} {:>12} {:>12} {:>8} {:>10}\n", "operation", "1 thread us", fmt::format("{} threads us", threads), "ratio",
             "GFLOP/s 1");
  for (const Case& c : cases) {
    const auto t = bench::seconds_per_call({[&] {
                                              tg::set_num_threads(1);
                                              c.run();
                                            },
                                            [&] {
                                              tg::set_num_threads(threads);
                                              c.run();
                                            }},
                                           0.2);
    fmt::print("{:<36} {:>12.2f} {:>12.2f} {:>8.2f} {:>10}\n", c.name, t[0] * 1e6, t[1] * 1e6, t[0] / t[1],
               c.flop > 0 ? fmt::format("{:.1f}", c.flop / t[0] * 1e-9) : std::string("-"));
  }
}
