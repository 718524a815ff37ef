// tapegrad_dp_worker: the training run that the distributed section (bench/distributed.cpp)
// times, run alone (a ProcessGroup of one) or as one rank of an mpirun job. It trains one of the
// section's two models for --warmup + --steps steps, the global batch of each step split into M
// micro-batches, and rank 0 writes its step times and the exchange's figures (each rank's, in
// rank order) as JSON, and, with --params, the final parameters.
//
//   mpirun -np 2 tapegrad_dp_worker --model chars --processes 2 --threads 1 --json out.json [--fast] [--shard]
//   tapegrad_dp_worker --model gpt2 --quick --plain --threads 2 --json out.json   # one batch, tg::backward
//
// Every rank draws each step's windows from one stream and takes its micro-batches, and dropout
// is keyed by the global micro-batch (key_generators): every process count computes the same
// step, so the final parameters of two runs differ by the reduction's rounding alone.
#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <tapegrad/distributed/data_parallel.hpp>
#include <tapegrad/tapegrad.hpp>

#include "gpt2_shape.hpp"
#include "report.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

struct Args {
  std::string model = "chars", json, params;
  bool quick = false, plain = false, fast = false, shard = false;
  int processes = 1, threads = 1, warmup = 3, steps = 5;
};

// A model of the section, its data, and how a step's batch is split.
struct Setup {
  tg::DecoderConfig config;
  std::int64_t micro_batches, rows, length;  // M micro-batches of `rows` windows of `length` tokens
  tg::AdamWOptions adamw;
  std::vector<std::int64_t> text;
};

// The GPL's text (random printable bytes where it is missing).
std::string read_text() {
  std::ifstream file("/usr/share/common-licenses/GPL-3");
  std::string text{std::istreambuf_iterator<char>(file), {}};
  if (text.empty()) {
    tg::Generator gen(3);
    text.resize(100000);
    for (char& ch : text) ch = static_cast<char>(32 + gen.next_u64() % 96);
  }
  return text;
}

Setup setup(const Args& a) {
  const std::string raw = read_text();
  Setup s;
  if (a.model == "chars") {
    // examples/train_chars' default model: a vocabulary of the text's distinct bytes, windows of
    // 64, width 64, 4 heads, 2 blocks, dropout 0.2, sinusoidal positions; 32 windows a step, in 4
    // micro-batches of 8.
    std::array<std::int64_t, 256> id{};
    id.fill(-1);
    for (const char ch : raw) id[static_cast<unsigned char>(ch)] = 0;
    std::int64_t vocab = 0;
    for (auto& i : id)
      if (i == 0) i = vocab++;
    for (const char ch : raw) s.text.push_back(id[static_cast<unsigned char>(ch)]);
    s.config = {.vocab = vocab, .max_len = 64, .dim = 64, .heads = 4, .layers = 2, .dropout = 0.2, .positions = tg::PositionKind::sinusoidal, .seed = 1};
    s.micro_batches = 4, s.rows = 8, s.length = 64;
    s.adamw = {.lr = 2e-3, .weight_decay = 0.01};
  } else if (a.model == "gpt2") {
    // The gpt2 section's shape; its B sequences a step as B micro-batches of one.
    const bench::Gpt2 g = a.quick ? bench::kQuick : bench::kFull;
    for (const char ch : raw) s.text.push_back(static_cast<unsigned char>(ch) % g.vocab);
    s.config = {.vocab = g.vocab, .max_len = std::max<std::int64_t>(g.t, 1024), .dim = g.dim, .heads = g.heads, .layers = g.layers, .seed = 1};
    s.micro_batches = g.b, s.rows = 1, s.length = g.t;
    s.adamw = {.lr = 3e-4, .weight_decay = 0.1};
  } else {
    throw std::invalid_argument("tapegrad_dp_worker: --model is chars or gpt2, not '" + a.model + "'");
  }
  return s;
}

void run(tg::ProcessGroup& group, const Args& a) {
  if (group.size() != a.processes)
    throw std::runtime_error(fmt::format("tapegrad_dp_worker: {} processes asked for, {} in the group ({})", a.processes, group.size(), group.backend()));
  if (a.plain && a.processes != 1) throw std::invalid_argument("tapegrad_dp_worker: --plain is one process");
  tg::set_num_threads(a.threads);
  const Setup s = setup(a);
  tg::Decoder model(s.config);
  std::optional<tg::DataParallel> dp;
  if (!a.plain)
    dp.emplace(group, model,
               tg::DataParallelOptions{.micro_batches = s.micro_batches,
                                       .reduction = a.fast ? tg::GradientReduction::fast : tg::GradientReduction::exact,
                                       .shard_optimizer_state = a.shard});
  tg::AdamW opt(dp ? dp->optimizer_parameters() : model.named_parameters(), s.adamw);
  tg::Generator data(5);
  std::vector<double> step_seconds;
  tg::DataParallelStats before;
  double share = 0, loss = 0;
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    const tg::Windows w = tg::random_windows(s.text, s.micro_batches * s.rows, s.length, data);
    if (step == a.warmup && dp) before = dp->stats();
    const auto t0 = bench::clock_type::now();
    if (dp) {
      for (std::int64_t k = dp->first_micro_batch(); k < dp->end_micro_batch(); ++k) {
        tg::key_generators(model, 3, step * s.micro_batches + k);
        const Tensor l = tg::cross_entropy(model.forward(tg::narrow(w.x, 0, k * s.rows, s.rows)), tg::narrow(w.y, 0, k * s.rows, s.rows));
        dp->backward(l);
        loss = l.item();
      }
      dp->synchronize();
      dp->clip_grad_norm(1.0);
      opt.step();
      const auto t1 = bench::clock_type::now();
      dp->share_parameters();
      if (step >= a.warmup) share += bench::since(t1);
    } else {
      tg::key_generators(model, 3, step);
      const Tensor l = tg::cross_entropy(model.forward(w.x), w.y);
      tg::backward(l);
      tg::clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      opt.zero_grad();
      loss = l.item();
    }
    if (step >= a.warmup) step_seconds.push_back(bench::since(t0));
  }
  tg::DataParallelStats after = dp ? dp->stats() : tg::DataParallelStats{};
  const std::vector<double> mine{after.exchange_seconds - before.exchange_seconds, after.waiting_seconds - before.waiting_seconds,
                                 static_cast<double>(after.bytes_sent - before.bytes_sent), share};
  const std::vector<double> every = tg::all_gather(group, mine);  // rank by rank
  if (group.rank() != 0) return;
  nlohmann::json out{{"processes", group.size()}, {"threads", a.threads},          {"backend", group.backend()},
                     {"micro_batches", s.micro_batches}, {"rows", s.rows},     {"warmup", a.warmup},
                     {"step_seconds", step_seconds}, {"loss", loss}};
  for (const auto& [i, key] : {std::pair{0, "exchange_seconds"}, {1, "waiting_seconds"}, {2, "bytes_sent"}, {3, "share_seconds"}}) {
    std::vector<double> per_rank;
    for (std::size_t r = 0; r < static_cast<std::size_t>(group.size()); ++r) per_rank.push_back(every[r * mine.size() + static_cast<std::size_t>(i)]);
    out[key] = per_rank;
  }
  std::ofstream(a.json) << out.dump() << '\n';
  if (!a.params.empty()) tg::save_safetensors(a.params, model.named_parameters());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tapegrad_bench's distributed section: one training run, alone or as a rank under mpirun"};
  Args a;
  app.add_option("--model", a.model, "chars (train_chars' model) or gpt2 (the GPT-2 shape)");
  app.add_flag("--quick", a.quick, "gpt2: the small shape");
  app.add_flag("--plain", a.plain, "one batch of the whole step through tg::backward, without DataParallel");
  app.add_flag("--fast", a.fast, "GradientReduction::fast (else exact)");
  app.add_flag("--shard", a.shard, "shard_optimizer_state");
  app.add_option("--processes", a.processes, "the processes the group must have");
  app.add_option("--threads", a.threads, "tapegrad's threads in each process")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", a.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--json", a.json, "rank 0 writes the figures here")->required();
  app.add_option("--params", a.params, "rank 0 writes the final parameters here (safetensors)");
  CLI11_PARSE(app, argc, argv);
  tg::ProcessGroup group;
  try {
    run(group, a);
  } catch (const std::exception& e) {
    group.abort(e.what());
  }
  return 0;
}
