// Section "threads": what more threads buy, per operation. Each operation is timed with 1 thread
// and with N threads (the largest --threads count, at least 2) in alternating rounds of the
// same run; ratio = 1-thread time / N-thread time, above 1 the threads help. Then the same next
// to a thread of this process that keeps one core busy (a spin loop pinned to the last CPU this
// process may use): the case of a machine shared with other work.
#include <algorithm>

#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"
#include "spinner.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

struct Case {
  std::string name;
  double flop;  // 0 for the ops that are not products
  std::function<void()> run;
};

Case product(std::string name, std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n) {
  const Tensor a = tg::full({batch, m, k}, 0.5), b = tg::full({batch, k, n}, 0.25);
  return {std::move(name), 2.0 * static_cast<double>(batch * m * k * n), [a, b] {
            tg::NoGradGuard no_grad;
            tg::matmul(a, b);
          }};
}


std::vector<Case> cases(const Options& options, tg::Decoder& model, tg::AdamW& opt, const Tensor& x, const Tensor& y) {
  std::vector<Case> out;
  const std::vector<std::int64_t> squares =
      options.quick ? std::vector<std::int64_t>{32, 128} : std::vector<std::int64_t>{16, 32, 64, 96, 128, 192, 256, 384, 512, 1024};
  for (std::int64_t s : squares) out.push_back(product(fmt::format("{}^3", s), 1, s, s, s));
  if (!options.quick) {
    // The products of the training step below (1024 tokens of width 64, 4 heads of 16), of decoding
    // and of the attention issue's large shape.
    out.push_back(product("train: proj 1024x64@64x64", 1, 1024, 64, 64));
    out.push_back(product("train: ffn 1024x64@64x256", 1, 1024, 64, 256));
    out.push_back(product("train: ffn 1024x256@256x64", 1, 1024, 256, 64));
    out.push_back(product("train: scores [256] 16x16@16x16", 256, 16, 16, 16));
    out.push_back(product("decode: [4] 1x16@16x500", 4, 1, 16, 500));
    out.push_back(product("decode: proj 1x256@256x768", 1, 1, 256, 768));
    out.push_back(product("attention large [32] 512x64@64x512", 32, 512, 64, 512));
  }
  for (std::int64_t n : options.quick ? std::vector<std::int64_t>{1 << 16} : std::vector<std::int64_t>{1 << 12, 1 << 16, 1 << 20, 1 << 22}) {
    const Tensor a = tg::full({n}, 0.5), b = tg::full({n}, 0.25);
    out.push_back({fmt::format("add, {} elements", n), 0, [a, b] { tg::add(a, b); }});
    const Tensor rows = tg::full({n / 64, 64}, 0.5);
    out.push_back({fmt::format("softmax, {} rows of 64", n / 64), 0, [rows] { tg::masked_softmax(rows); }});
  }
  out.push_back({"train_sort step (fwd+bwd+AdamW)", 0, [&model, &opt, x, y] {
                   tg::backward(tg::cross_entropy(model.forward(x), y));
                   opt.step();
                   opt.zero_grad();
                 }});
  return out;
}

}  // namespace

void section_threads(Report& report, const Options& options) {
  const int n = std::max(2, *std::max_element(options.threads.begin(), options.threads.end()));
  // train_sort's model and a batch of 64 sequences of 16 tokens.
  tg::Decoder model({.vocab = 11, .max_len = 17, .dim = 64, .heads = 4, .layers = 2, .seed = 1});
  tg::AdamW opt(model.named_parameters(), {.lr = 1e-4});
  tg::Generator gen(2);
  const std::int64_t batch = options.quick ? 8 : 64;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(batch * 16)), targets(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int64_t>(gen.uniform() * 11);
    targets[i] = static_cast<std::int64_t>(gen.uniform() * 10);
  }
  const Tensor x = tg::from_vector(std::span<const std::int64_t>(ids), {batch, 16});
  const Tensor y = tg::from_vector(std::span<const std::int64_t>(targets), {batch, 16});
  const auto all = cases(options, model, opt, x, y);
  for (bool busy : {false, true}) {
    auto& table = report.table(busy ? "threads_busy" : "threads",
                               fmt::format("1 thread against {} threads{}: us median (min-max); ratio = 1-thread time / {}-thread time", n,
                                           busy ? ", one core kept busy by a spinning thread" : "", n),
                               {{"operation", "operation", 0, 34},
                                {"n_threads", "N", 0, 2},
                                {"one_thread_ms", "1 thread us", 1, 28, true},
                                {"n_threads_ms", fmt::format("{} threads us", n), 1, 28, true},
                                {"ratio", "ratio", 2, 6},
                                {"one_thread_gflops", "GFLOP/s 1", 1, 9},
                                {"n_threads_gflops", fmt::format("GFLOP/s {}", n), 1, 9}});
    const auto spinner = busy ? std::make_unique<Spinner>() : nullptr;
    for (const Case& c : all) {
      const auto t = measure({[&] {
                                tg::set_num_threads(1);
                                c.run();
                              },
                              [&] {
                                tg::set_num_threads(n);
                                c.run();
                              }},
                             options.runs, options.seconds / 2);
      table.add({c.name, static_cast<std::int64_t>(n), t[0], t[1], t[0].median / t[1].median, c.flop > 0 ? Cell(per_second(c.flop, t[0])) : Cell(),
                 c.flop > 0 ? Cell(per_second(c.flop, t[1])) : Cell()});
    }
  }
  tg::set_num_threads(options.threads.front());
}

}  // namespace bench
