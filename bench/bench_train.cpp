// Training throughput of train_sort's default model (2 blocks, width 64, 4 heads, batches of
// 64 sequences of 16 tokens), float32 and float64: tokens per second, and where a step's time
// goes (forward to the loss, backward, clipping + AdamW step). Median of 30 steps after 10 of
// warm-up, in one run.
//
//   ./build/bench/bench_train [--threads N]   (or the count alone, as before)
#include <algorithm>
#include <chrono>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;
using tg::Tensor;

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(tg::DType dtype) {
  constexpr std::int64_t kBatch = 64, kDigits = 8, kT = 2 * kDigits;
  tg::Decoder model({.vocab = 11, .max_len = kT + 1, .dim = 64, .heads = 4, .layers = 2, .dtype = dtype, .seed = 1});
  tg::AdamW opt(model.named_parameters(), {.lr = 3e-3});
  tg::Generator gen(2);
  std::vector<std::int64_t> ids(kBatch * kT), targets(kBatch * kT);
  std::vector<double> fwd, bwd, upd, total;
  for (int step = 0; step < 40; ++step) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int64_t>(gen.uniform() * 11);
      targets[i] = i % kT >= kDigits ? static_cast<std::int64_t>(gen.uniform() * 10) : -100;
    }
    const Tensor x = tg::from_vector(std::span<const std::int64_t>(ids), {kBatch, kT});
    const Tensor y = tg::from_vector(std::span<const std::int64_t>(targets), {kBatch, kT});
    const auto t0 = clock_type::now();
    const Tensor loss = tg::cross_entropy(model.forward(x), y);
    const double f = since(t0);
    const auto t1 = clock_type::now();
    tg::backward(loss);
    const double b = since(t1);
    const auto t2 = clock_type::now();
    tg::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    const double u = since(t2);
    if (step < 10) continue;
    fwd.push_back(f), bwd.push_back(b), upd.push_back(u), total.push_back(f + b + u);
  }
  const double ms = median(total);
  fmt::print("{:<8} {:>9.0f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>7.2f}-{:.2f}\n", fmt::format("{}", dtype),
             static_cast<double>(kBatch * kT) / (ms / 1000), ms, median(fwd), median(bwd), median(upd),
             *std::min_element(total.begin(), total.end()), *std::max_element(total.begin(), total.end()));
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  CLI::App app{"bench_train: training throughput of train_sort's model"};
  app.add_option("--threads,threads", threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tg::set_num_threads(threads);
  fmt::print("train_sort's model, {} thread(s); milliseconds per step (median of 30)\n", tg::num_threads());
  fmt::print("{:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>13}\n", "dtype", "tokens/s", "step", "forward", "backward", "update", "step min-max");
  run(tg::float32);
  run(tg::float64);
}
