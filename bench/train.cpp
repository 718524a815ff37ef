// Section "train": training throughput of train_sort's default model (2 blocks, width 64,
// 4 heads, batches of 64 sequences of 16 tokens, AdamW), float32 and float64: tokens per second
// and where a step's time goes (forward to the loss, backward, clipping + AdamW step). Steps
// after warm-up, a fresh batch each; the phases are timed inside each step, so this section
// keeps its own loop rather than measure(). Its PyTorch twin is bench/torch_train.py (another
// process and language: it cannot be a section).
#include <algorithm>

#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {

void section_train(Report& report, const Options& options) {
  auto& table = report.table("train", "train_sort's model, one training step: ms median (min-max)",
                             {{"threads", "th", 0, 2},
                              {"dtype", "dtype", 0, 7},
                              {"tokens_per_second", "tokens/s", 0, 8},
                              {"step_ms", "step ms", 2, 22},
                              {"forward_ms", "forward ms", 2, 22},
                              {"backward_ms", "backward ms", 2, 22},
                              {"update_ms", "update ms", 2, 22},
                              {"peak_mib", "peak MiB", 2, 8}});
  constexpr std::int64_t kBatch = 64, kDigits = 8, kT = 2 * kDigits;
  const int warmup = options.quick ? 2 : 10, steps = options.quick ? 3 : std::max(30, options.runs);
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    for (tg::DType dtype : {tg::float32, tg::float64}) {
      tg::Decoder model({.vocab = 11, .max_len = kT + 1, .dim = 64, .heads = 4, .layers = 2, .dtype = dtype, .seed = 1});
      tg::AdamW opt(model.named_parameters(), {.lr = 3e-3});
      tg::Generator gen(2);
      std::vector<std::int64_t> ids(kBatch * kT), targets(kBatch * kT);
      std::vector<double> fwd, bwd, upd, total;
      double peak = 0;
      for (int step = 0; step < warmup + steps; ++step) {
        for (std::size_t i = 0; i < ids.size(); ++i) {
          ids[i] = static_cast<std::int64_t>(gen.uniform() * 11);
          targets[i] = i % kT >= kDigits ? static_cast<std::int64_t>(gen.uniform() * 10) : -100;
        }
        const Tensor x = tg::from_vector(std::span<const std::int64_t>(ids), {kBatch, kT});
        const Tensor y = tg::from_vector(std::span<const std::int64_t>(targets), {kBatch, kT});
        double f = 0, b = 0, u = 0;
        const auto one_step = [&] {
          const auto t0 = clock_type::now();
          const Tensor loss = tg::cross_entropy(model.forward(x), y);
          f = since(t0);
          const auto t1 = clock_type::now();
          tg::backward(loss);
          b = since(t1);
          const auto t2 = clock_type::now();
          tg::clip_grad_norm(model.parameters(), 1.0);
          opt.step();
          opt.zero_grad();
          u = since(t2);
        };
        if (step == warmup - 1) peak = peak_mib_of(one_step);
        else one_step();
        if (step < warmup) continue;
        fwd.push_back(f), bwd.push_back(b), upd.push_back(u), total.push_back(f + b + u);
      }
      const Stats s = stats_of(total);
      table.add({static_cast<std::int64_t>(threads), fmt::format("{}", dtype), static_cast<double>(kBatch * kT) / s.median, s,
                 stats_of(fwd), stats_of(bwd), stats_of(upd), peak});
    }
  }
}

}  // namespace bench
