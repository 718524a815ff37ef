// Section "gpt2": one training step (forward, cross-entropy, backward, AdamW clipping to norm 1
// inside its update: max_grad_norm) of a
// GPT-2-shaped decoder: 12 pre-norm blocks of width 768 and 12 heads, GELU 4x, learned
// positions, a final LayerNorm and an untied head over GPT-2's 50,257 tokens (163M parameters
// with the head), batches of 4 sequences of 64 tokens. On each thread count:
// - the step against its matmul limit: every product of the step (each forward product and the
//   two of its backward) timed as a raw oneDNN primitive on the same threads just before, summed;
//   against the same primitives run once each on operands in memory (the cold limit); and
//   against them run in the step's order on the step's buffers (the chain limit, gpt2_chain.cpp);
// - where the step's time goes, op by op, with the products apart (one profiled step);
// - peak storage of the step against the activations llm.c keeps for the same shape;
// - float32 and bfloat16 products (MatmulPrecisionGuard around forward and backward);
// then the largest thread count against 1, alone and next to a thread that keeps a core busy;
// PyTorch's twin (`bench/torch_train.py --model gpt2`, another process) against the step, in
// turn, where /usr/bin/python3 has torch; and the loss of bfloat16 training against float32's
// over 200 steps of text from the same start.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include <tapegrad/tapegrad.hpp>

#include "gpt2_shape.hpp"
#include "op_profile.hpp"
#include "raw_dnnl.hpp"
#include "sections.hpp"
#include "spinner.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

tg::DecoderConfig config_of(const Gpt2& s) {
  return {.vocab = s.vocab, .max_len = std::max<std::int64_t>(s.t, 1024), .dim = s.dim, .heads = s.heads, .layers = s.layers, .seed = 1};
}

// The products' time at oneDNN's own throughput, on tapegrad's current thread count.
double matmul_limit(const Gpt2& s, bool bf16, const Options& options) {
  double total = 0;
  for (const Product& p : step_products(s)) {
    RawDnnl raw(p.batch, p.m, p.k, p.n, bf16, p.ta, p.tb);
    total += measure([&] { raw.run(); }, options.quick ? 2 : 5, options.quick ? 0.01 : 0.1).median * static_cast<double>(p.count);
  }
  after_references();
  return total;
}

// The same products with their operands where a step leaves them, in memory rather than in
// cache: one primitive per product of the step, each with its own buffers (1.5 GB for the full
// shape in float32), run once each in turn after a 256 MiB pass has flushed the caches; the
// median of 3 such passes.
double cold_limit(const Gpt2& s, bool bf16, const Options& options) {
  std::vector<std::unique_ptr<RawDnnl>> chain;
  for (const Product& p : step_products(s))
    for (std::int64_t i = 0; i < p.count; ++i) chain.push_back(std::make_unique<RawDnnl>(p.batch, p.m, p.k, p.n, bf16, p.ta, p.tb));
  std::vector<double> passes;
  for (int pass = 0; pass < (options.quick ? 1 : 3); ++pass) {
    evict_caches(options.quick);
    const auto t0 = clock_type::now();
    for (auto& raw : chain) raw->run();
    passes.push_back(since(t0));
  }
  after_references();
  return stats_of(passes).median;
}

double flop_of(const Gpt2& s) {
  double f = 0;
  for (const Product& p : step_products(s))
    f += 2.0 * static_cast<double>(p.batch * p.m) * static_cast<double>(p.k) * static_cast<double>(p.n) * static_cast<double>(p.count);
  return f;
}

// What llm.c's train_gpt2.c keeps for a step (its ActivationTensors), in bytes of float32.
double llmc_activation_bytes(const Gpt2& s) {
  const double btc = static_cast<double>(s.b * s.t * s.dim), bt = static_cast<double>(s.b * s.t);
  const double att = static_cast<double>(s.b * s.heads * s.t * s.t), btv = bt * static_cast<double>(s.vocab);
  const double per_layer = 18 * btc + 2 * att + 4 * bt;  // ln1 qkv(3) atty attproj res2 ln2 fch(4) gelu(4) fcproj res3; preatt att; 2 means 2 rstds
  return 4 * (static_cast<double>(s.layers) * per_layer + 2 * btc + 2 * bt + 2 * btv + bt);
}

// Token windows: of a text when one is given, else uniform random ids.
class Batches {
 public:
  Batches(const Gpt2& s, std::uint64_t seed, const std::string& text) : s_(s), gen_(seed) {
    for (char ch : text) tokens_.push_back(static_cast<unsigned char>(ch) % s.vocab);
  }
  tg::Windows next() {
    if (tokens_.size() > static_cast<std::size_t>(s_.t)) return tg::random_windows(tokens_, s_.b, s_.t, gen_);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(s_.b * (s_.t + 1)));
    for (auto& i : ids) i = static_cast<std::int64_t>(gen_.uniform() * static_cast<double>(s_.vocab)) % s_.vocab;
    const Tensor all = tg::from_vector(ids, {s_.b, s_.t + 1});
    return {tg::narrow(all, 1, 0, s_.t).contiguous(), tg::narrow(all, 1, 1, s_.t).contiguous()};
  }

 private:
  Gpt2 s_;
  tg::Generator gen_;
  std::vector<std::int64_t> tokens_;
};

struct Phases {
  double forward = 0, backward = 0, adamw = 0, loss = 0;
  double total() const { return forward + backward + adamw; }
};

Phases train_step(tg::Decoder& model, tg::AdamW& opt, const tg::Windows& w, bool bf16) {
  Phases p;
  {
    std::optional<tg::MatmulPrecisionGuard> guard;
    if (bf16) guard.emplace(tg::MatmulPrecision::bfloat16);
    auto t0 = clock_type::now();
    const Tensor loss = tg::cross_entropy(model.forward(w.x), w.y);
    p.forward = since(t0);
    t0 = clock_type::now();
    tg::backward(loss);
    p.backward = since(t0);
    p.loss = loss.item();
  }
  const auto t0 = clock_type::now();
  opt.step();  // clips to norm 1 inside (max_grad_norm)
  opt.zero_grad();
  p.adamw = since(t0);
  return p;
}

std::string read_text() {
  std::ifstream file("/usr/share/common-licenses/GPL-3");
  return {std::istreambuf_iterator<char>(file), {}};
}

// Steps in each block of one precision or thread count, and how many of them, first, are not
// timed (the switch's cost; see the comparisons below).
constexpr int kBlock = 6;
constexpr int kUntimed = 2;

// Rounds of blocks (one block per precision or thread count each) that time at least `timed`
// steps of each, after a first round that only warms up.
int rounds_for(int timed) { return 1 + (timed + kBlock - kUntimed - 1) / (kBlock - kUntimed); }

// PyTorch's twin of the step against tapegrad's on the same threads, in turn: a block of
// tapegrad steps, the oneDNN step, then one run of the twin (its own median of 5 steps after 2),
// three rounds per thread count. The two ran minutes apart before (./dev bench ran the twin after
// the whole benchmark), and this VM's speed drifts by 10-20% in that time; in turn, all see the
// same machine. The oneDNN step is a step made of oneDNN's own products, as its chain runs them,
// and an update at memory speed, with nothing else: PyTorch / oneDNN step is how far ahead a
// step on this machine's products gets without faster products. Not a floor: on one thread
// tapegrad's step has come in under it. Not in --quick runs: one run of the twin takes about a
// minute.
void against_torch(Report& report, const Gpt2& s, tg::Decoder& model, tg::AdamW& opt, const std::string& text, std::int64_t parameters,
                   const Options& options) {
  if (options.quick || std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) return;
  auto& table = report.table("gpt2_torch",
                             fmt::format("GPT-2-shaped step (float32) against PyTorch eager (bench/torch_train.py --model gpt2, another process), in turn: "
                                         "{} tapegrad steps (the first {} untimed), the oneDNN step, then a run of the twin: ms median (min-max)",
                                         kBlock + 1, kUntimed),
                             {{"threads", "th", 0, 2},
                              {"round", "round", 0, 5},
                              {"tapegrad_ms", "tapegrad ms", 1, 24},
                              {"onednn_step_ms", "oneDNN step ms", 1, 14},
                              {"torch_ms", "PyTorch ms", 1, 24},
                              {"ratio", "PyTorch / tapegrad", 2, 18},
                              {"onednn_step_ratio", "PyTorch / oneDNN step", 2, 21}});
  table.note("oneDNN step: the step's products at oneDNN's chain limit (gpt2 table) plus one pass of the update's memory streams "
             "(weights, gradients and both moments read, weights and moments written: 28 bytes per parameter), each the median of 3 in this round");
  UpdateStreams update(parameters);
  const std::string json = (std::filesystem::temp_directory_path() / fmt::format("tapegrad_bench_torch_{}.json", ::getpid())).string();
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    Batches batches(s, 13, text);
    for (int round = 1; round <= 3; ++round) {
      std::vector<double> ours;
      for (int i = 0; i < kBlock + 1; ++i) {
        const double t = train_step(model, opt, batches.next(), false).total();
        if (i >= kUntimed) ours.push_back(t);
      }
      std::vector<double> passes;
      for (int i = 0; i < 3; ++i) passes.push_back(update());
      const double reference = chain_limit(s, false, options.quick) + stats_of(passes).median;
      const std::string command = fmt::format("/usr/bin/python3 '{}/bench/torch_train.py' --model gpt2 --threads {} --json '{}' > /dev/null",
                                              TAPEGRAD_SOURCE_DIR, threads, json);
      if (std::system(command.c_str()) != 0) {
        table.note(fmt::format("the twin failed: {}", command));
        return;
      }
      std::ifstream in(json);
      const nlohmann::json out = nlohmann::json::parse(in);
      const nlohmann::json& row = out.at("rows").at(0);
      const Stats theirs{row.at("step_ms").get<double>() / 1e3, row.at("step_min_ms").get<double>() / 1e3,
                         row.at("step_max_ms").get<double>() / 1e3, out.at("timed").get<int>()};
      if (threads == options.threads.front() && round == 1)  // the twin's own counts, not a copy of them here
        table.note(fmt::format("PyTorch's figures: the median of {} steps after {} untimed, per run of the twin.", theirs.runs,
                               out.at("warmup").get<int>()));
      const Stats a = stats_of(ours);
      table.add({static_cast<std::int64_t>(threads), static_cast<std::int64_t>(round), a, reference * 1e3, theirs, theirs.median / a.median,
                 theirs.median / reference});
    }
  }
  std::remove(json.c_str());
}

}  // namespace

void section_gpt2(Report& report, const Options& options) {
  const Gpt2 s = options.quick ? kQuick : kFull;
  const std::string text = read_text();
  tg::Decoder model(config_of(s));
  tg::AdamW opt(model.named_parameters(), {.lr = 3e-4, .weight_decay = 0.1, .max_grad_norm = 1.0});
  std::int64_t parameters = 0;
  for (const Tensor& p : model.parameters()) parameters += p.numel();
  const double grad_bytes = 4.0 * static_cast<double>(parameters);
  report.fact("gpt2_shape", "gpt2 shape", fmt::format("{} blocks, width {}, {} heads, vocab {}, T {}, B {}; {} parameters", s.layers, s.dim,
                                                     s.heads, s.vocab, s.t, s.b, parameters));
  auto& steps = report.table(
      "gpt2", "GPT-2-shaped training step: ms median (min-max); limit = the step's products at oneDNN's own throughput (same threads, same run)",
      {{"threads", "th", 0, 2},
       {"products", "products", 0, 8},
       {"step_ms", "step ms", 1, 24},
       {"forward_ms", "fwd ms", 1, 8},
       {"backward_ms", "bwd ms", 1, 8},
       {"update_ms", "update ms", 1, 9},
       {"limit_ms", "limit ms", 1, 9},
       {"limit_percent", "% of limit", 1, 10},
       {"cold_limit_ms", "cold limit", 1, 10},
       {"cold_percent", "% of cold", 1, 9},
       {"chain_limit_ms", "chain limit", 1, 11},
       {"chain_percent", "% of chain", 1, 10},
       {"gflops", "GFLOP/s", 1, 8},
       {"speedup_bf16", "x float32", 2, 9},
       {"peak_mib", "peak MiB", 0, 8},
       {"activations_mib", "llm.c MiB", 0, 9},
       {"peak_ratio", "peak/llm.c", 2, 10}});
  const int timed = options.quick ? 2 : std::max(5, options.runs / 2);
  const double flop = flop_of(s);
  std::vector<std::vector<Cell>> split_rows;  // added after the steps' table, which prints as it fills
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    // The references first (they run on oneDNN's own team), then float32 and bfloat16 steps in
    // turn, so that the VM's slow phases fall on both alike.
    // Without a bfloat16 dot product, tapegrad's bfloat16 products are float32 ones on rounded
    // operands (oneDNN's own bfloat16 kernels there are several times slower), so float32's
    // limits are theirs too.
    double limit[2], cold[2], chain[2];
    for (const bool bf16 : {false, true}) {
      if (bf16 && !tg::bfloat16_native()) {
        limit[1] = limit[0], cold[1] = cold[0], chain[1] = chain[0];
        continue;
      }
      limit[bf16] = matmul_limit(s, bf16, options), cold[bf16] = cold_limit(s, bf16, options);
      chain[bf16] = chain_limit(s, bf16, options.quick);
    }
    Batches batches(s, 7, text);
    // bfloat16 steps train their own copy of the model: on the float32 one, each update would
    // leave the weights' bfloat16 copies to the next bfloat16 step to round afresh.
    tg::Decoder bf16_model(config_of(s));
    tg::AdamW bf16_opt(bf16_model.named_parameters(), {.lr = 3e-4, .weight_decay = 0.1, .max_grad_norm = 1.0});
    // In alternating blocks of kBlock steps per precision, the first kUntimed of each untimed:
    // steps right after the other model's pay for the caches and blocks that model left (a
    // training run never switches), and the blocks let the VM's slow phases fall on both alike.
    std::vector<double> total[2], fwd[2], bwd[2], upd[2];
    double peak_mib[2] = {0, 0};
    const int rounds = rounds_for(timed);
    for (int round = 0; round < rounds; ++round)
      for (const bool bf16 : {false, true})
        for (int i = 0; i < kBlock; ++i) {
          const tg::Windows w = batches.next();
          const std::int64_t before = tg::memory_stats().current_bytes;
          tg::reset_peak_memory();
          const Phases p = bf16 ? train_step(bf16_model, bf16_opt, w, true) : train_step(model, opt, w, false);
          if (round == 0 || i < kUntimed) continue;
          if (round == 1 && i == kUntimed) peak_mib[bf16] = (static_cast<double>(tg::memory_stats().peak_bytes - before) - grad_bytes) / (1 << 20);
          total[bf16].push_back(p.total()), fwd[bf16].push_back(p.forward), bwd[bf16].push_back(p.backward), upd[bf16].push_back(p.adamw);
        }
    const double f32_median = stats_of(total[0]).median;
    for (const bool bf16 : {false, true}) {
      const Stats st = stats_of(total[bf16]);
      const double activations = llmc_activation_bytes(s) / (1 << 20);
      steps.add({static_cast<std::int64_t>(threads), bf16 ? "bfloat16" : "float32", st, stats_of(fwd[bf16]).median * 1e3,
                 stats_of(bwd[bf16]).median * 1e3, stats_of(upd[bf16]).median * 1e3, limit[bf16] * 1e3, 100 * limit[bf16] / st.median,
                 cold[bf16] * 1e3, 100 * cold[bf16] / st.median, chain[bf16] * 1e3, 100 * chain[bf16] / st.median, per_second(flop, st), bf16 ? Cell(f32_median / st.median) : Cell(),
                 peak_mib[bf16], activations, peak_mib[bf16] / activations});
      // One profiled step, after kUntimed more of the same precision: the float32 one would
      // otherwise follow the last bfloat16 block and pay for the switch.
      for (int i = 0; i < kUntimed; ++i)
        bf16 ? train_step(bf16_model, bf16_opt, batches.next(), true) : train_step(model, opt, batches.next(), false);
      const tg::Windows w = batches.next();
      Phases p;
      std::map<std::string, OpProfile::Times> ops;
      {
        OpProfile profile;
        p = bf16 ? train_step(bf16_model, bf16_opt, w, true) : train_step(model, opt, w, false);
        ops = profile.times();
      }
      const double step = p.total();
      OpProfile::Times all;
      auto row = [&](const std::string& op, const OpProfile::Times& t) {
        split_rows.push_back({static_cast<std::int64_t>(threads), bf16 ? "bfloat16" : "float32", op, t.calls, t.forward * 1e3, t.forward_products * 1e3,
                   t.backward * 1e3, t.backward_products * 1e3, 100 * (t.forward + t.backward) / step});
      };
      for (const auto& [op, t] : ops) {
        row(op, t);
        all.forward += t.forward, all.backward += t.backward, all.calls += t.calls;
        all.forward_products += t.forward_products, all.backward_products += t.backward_products;
      }
      row("every op", all);
      row("AdamW step with clipping, zero_grad", {.forward = p.adamw, .calls = 1});
      row("the rest (loss.item(), between ops)", {.forward = std::max(0.0, step - all.forward - all.backward - p.adamw)});
    }
  }

  auto& split = report.table("gpt2_ops", "where the GPT-2-shaped step's time goes (one profiled step): ms; each op's products also apart",
                             {{"threads", "th", 0, 2},
                              {"products", "products", 0, 8},
                              {"op", "op", 0, 30},
                              {"calls", "calls", 0, 5},
                              {"forward_ms", "fwd ms", 1, 8},
                              {"forward_products_ms", "of it products", 1, 14},
                              {"backward_ms", "bwd ms", 1, 8},
                              {"backward_products_ms", "of it products", 1, 14},
                              {"share_percent", "% of step", 1, 9}});
  for (auto& r : split_rows) split.add(std::move(r));

  // The largest thread count against 1, alone and next to a busy core: in alternating blocks
  // (so that the VM's slow phases fall on both alike), of which the first kUntimed steps are
  // not timed. They pay for the switch (the data the other thread count left in one core's
  // cache, a worker that slept through the other block, thread choices made on those slow runs
  // and undone over the next calls), which training at one thread count never does: the second
  // step after a switch was still slow in most blocks (docs/performance-notes.md).
  const int n = std::max(2, *std::max_element(options.threads.begin(), options.threads.end()));
  auto& scaling = report.table("gpt2_threads", fmt::format("GPT-2-shaped step (float32) on 1 thread and on {}, in alternating blocks of {} steps (the first {} untimed): ms median (min-max)", n, kBlock, kUntimed),
                               {{"busy", "other load", 0, 26},
                                {"n_threads", "N", 0, 2},
                                {"one_thread_ms", "1 thread ms", 1, 24},
                                {"n_threads_ms", "N threads ms", 1, 24},
                                {"speedup", "1 thread / N", 2, 12}});
  for (const bool busy : {false, true}) {
    const auto spinner = busy ? std::make_unique<Spinner>() : nullptr;
    Batches batches(s, 11, text);
    std::vector<double> one, many;
    const int rounds = rounds_for(timed);
    for (int i = 0; i < 2 * kBlock * rounds; ++i) {
      const bool alone = i / kBlock % 2 == 0;
      tg::set_num_threads(alone ? 1 : n);
      const double t = train_step(model, opt, batches.next(), false).total();
      if (i >= 2 * kBlock && i % kBlock >= kUntimed) (alone ? one : many).push_back(t);
    }
    const Stats a = stats_of(one), b = stats_of(many);
    scaling.add({busy ? "a spinning thread on one core" : "none", static_cast<std::int64_t>(n), a, b, a.median / b.median});
  }

  against_torch(report, s, model, opt, text, parameters, options);

  // bfloat16 training against float32: the same start, the same batches, on n threads.
  tg::set_num_threads(n);
  const int curve_steps = options.quick ? 4 : 200, every = options.quick ? 1 : 20;
  std::vector<double> losses[2];
  for (const bool bf16 : {false, true}) {
    tg::Decoder fresh(config_of(s));
    tg::AdamW fresh_opt(fresh.named_parameters(), {.lr = 3e-4, .weight_decay = 0.1, .max_grad_norm = 1.0});
    Batches batches(s, 5, text);
    for (int i = 0; i < curve_steps; ++i) losses[bf16].push_back(train_step(fresh, fresh_opt, batches.next(), bf16).loss);
  }
  auto& curve = report.table("gpt2_bf16_loss",
                             fmt::format("bfloat16 against float32 training of the GPT-2 shape: the loss at each step from the same start and batches "
                                         "({} threads{})", n, text.empty() ? ", random tokens" : ", bytes of the GPL's text"),
                             {{"step", "step", 0, 5},
                              {"float32_loss", "float32", 4, 8},
                              {"bfloat16_loss", "bfloat16", 4, 8},
                              {"difference", "bf16 - f32", 4, 10},
                              {"largest_difference", "largest |diff| so far", 4, 21}});
  double largest = 0;
  for (int i = 0; i < curve_steps; ++i) {
    const double d = losses[1][static_cast<std::size_t>(i)] - losses[0][static_cast<std::size_t>(i)];
    largest = std::max(largest, std::abs(d));
    if ((i + 1) % every == 0 || i == 0)
      curve.add({static_cast<std::int64_t>(i + 1), losses[0][static_cast<std::size_t>(i)], losses[1][static_cast<std::size_t>(i)], d, largest});
  }
}

}  // namespace bench
