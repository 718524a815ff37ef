// Multi-head attention on the weights path: the MultiHeadAttention layer with need_weights,
// key-padding and causal masks, float32, forward + backward through both outputs (output and
// per-head weights), with 1 and 2 threads.
//
// Roofline: every matmul of the forward, timed as oneDNN's own float32 primitive on that
// product shape in this run, x3 for forward + backward. The forward's products, D = E / H:
//   q, k, v and output projections: [B*L, E] x [E, E]   (four of them)
//   scores:          B*H x [Q, D] x [D, K]
//   weighted sum:    B*H x [Q, K] x [K, D]
// The layer and the raw primitives are timed in alternating blocks (the machine is shared);
// each figure is the median of the blocks, with the spread (min..max) beside it.
//
// Then the public softmax ops against memory bandwidth (softmax_bandwidth).
//
// Usage: bench_attention [shape|softmax|all] [threads]. On a machine shared with other work, two
// threads may wait for each other for whole scheduler slices in libgomp's spinning barriers
// (the raw primitives suffer most); OMP_WAIT_POLICY=passive avoids that.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <tapegrad/tapegrad.hpp>

#include "bench_support.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

struct Case {
  const char* name;
  std::int64_t b, q, e, h;
};

constexpr int kBlocks = 11;

struct Stats {
  double median = 0, lo = 0, hi = 0;  // seconds per call
};

Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// Median and spread of seconds per call for each function, over kBlocks alternating blocks.
std::vector<Stats> timed(const std::vector<std::function<void()>>& fs, double budget) {
  std::vector<int> reps;
  for (const auto& f : fs) reps.push_back(bench::calibrate(f, budget));
  std::vector<std::vector<double>> t(fs.size());
  for (int s = 0; s < kBlocks; ++s)
    for (std::size_t i = 0; i < fs.size(); ++i) t[i].push_back(bench::block(fs[i], reps[i]));
  std::vector<Stats> out;
  for (auto& v : t) out.push_back(stats_of(v));
  return out;
}

// The forward's matmuls as raw oneDNN primitives; run() executes each once (its time, x3, is the
// roofline).
struct Roofline {
  std::vector<std::unique_ptr<bench::RawDnnl>> products;
  explicit Roofline(const Case& c) {
    const std::int64_t d = c.e / c.h;
    for (int i = 0; i < 4; ++i) products.push_back(std::make_unique<bench::RawDnnl>(1, c.b * c.q, c.e, c.e));
    products.push_back(std::make_unique<bench::RawDnnl>(c.b * c.h, c.q, d, c.q));
    products.push_back(std::make_unique<bench::RawDnnl>(c.b * c.h, c.q, c.q, d));
  }
  void run() {
    for (auto& p : products) p->run();
  }
};

// Key padding: batch entry b keeps its first K - b K / (2 B) keys.
Tensor key_padding(const Case& c) {
  Tensor m = tg::ones({c.b, c.q}, tg::DType::bool_);
  for (std::int64_t b = 0; b < c.b; ++b) {
    const std::int64_t keep = c.q - b * c.q / (2 * c.b);
    if (keep < c.q) tg::fill_(tg::slice(tg::select(m, 0, b), 0, keep, c.q), 0.0);
  }
  return m;
}

struct Step {
  tg::MultiHeadAttention layer;
  Tensor x;
  tg::MhaCall call;
  explicit Step(const Case& c)
      : layer({.query_dim = c.e, .heads = c.h, .seed = 1}),
        x(tg::randn({c.b, c.q, c.e}, 2)),
        call{.masks = {.key_mask = key_padding(c)}, .causal = true, .need_weights = true} {}
  void forward() const {
    tg::NoGradGuard no_grad;
    layer.forward(x, call);
  }
  void forward_backward() {
    auto [out, attn] = layer.forward(x, call);
    tg::backward({out, attn}, {tg::ones_like(out), tg::ones_like(attn)});
    tg::clear_tape();
    for (Tensor p : layer.parameters()) p.zero_grad();
  }
};

// Peak resident memory grown by one call of f, in MiB (Linux: clear_refs 5 resets VmHWM). A
// lower bound: memory that tapegrad's block cache or malloc already hold from earlier calls
// (earlier shapes included) is reused without growing the resident set.
long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::string(field).size()));
  return -1;
}
double peak_mib(const std::function<void()>& f) {
  std::ofstream("/proc/self/clear_refs") << "5";
  const long before = status_kib("VmRSS:");
  f();
  const long peak = status_kib("VmHWM:");
  return before < 0 || peak < 0 ? -1.0 : (peak - before) / 1024.0;
}

void run_case(const Case& c, int threads) {
  tg::set_num_threads(threads);
  Roofline roof(c);
  Step step(c);
  const double peak = peak_mib([&] { step.forward_backward(); });  // first step: its buffers are new
  const double budget = c.q * c.e >= 512 * 256 ? 1.0 : 0.3;
  const auto t = timed({[&] { roof.run(); }, [&] { step.forward(); }, [&] { step.forward_backward(); }}, budget);
  const double roof_both = 3 * t[0].median;
  fmt::print("{:<7} {:>17} {:>2} {:>9.3f} {:>8.3f} {:>17} {:>7.1f}% {:>10.3f} {:>17} {:>7.1f}% {:>8.1f}\n", c.name,
             fmt::format("({}, {}, {}, {})", c.b, c.q, c.e, c.h), threads, roof_both * 1e3, t[1].median * 1e3,
             fmt::format("{:.3f}..{:.3f}", t[1].lo * 1e3, t[1].hi * 1e3), 100 * t[0].median / t[1].median, t[2].median * 1e3,
             fmt::format("{:.3f}..{:.3f}", t[2].lo * 1e3, t[2].hi * 1e3), 100 * roof_both / t[2].median,
             peak);
  std::fflush(stdout);
}

// The public softmax ops on a float32 [rows, 1024] tensor against memory bandwidth: a forward
// moves 2 N floats (read x, write y) and a backward 3 N (read y and dy, write dx); each is
// expressed as the fraction of the speed of a plain copy of N floats (2 N moved) in this run.
// The backward's time is (forward + backward) - forward, through the tape.
void softmax_bandwidth(const char* name, Tensor (*op)(const Tensor&, const Tensor&), std::int64_t rows, bool masked,
                       int threads) {
  tg::set_num_threads(threads);
  const std::int64_t k = 1024, n = rows * k;
  const Tensor x = tg::randn({rows, k}, 3).set_requires_grad();
  const Tensor mask = masked ? tg::gt(tg::randn({rows, k}, 4), tg::scalar(-1.0)) : Tensor();
  const Tensor g = tg::randn({rows, k}, 5);
  std::vector<float> src(static_cast<std::size_t>(n), 1.0f), dst(static_cast<std::size_t>(n));
  auto forward = [&] {
    tg::NoGradGuard no_grad;
    op(x, mask);
  };
  auto both = [&] {
    tg::backward({op(x, mask)}, {g});
    tg::clear_tape();
    Tensor(x).zero_grad();
  };
  const auto t = timed({[&] { std::copy(src.begin(), src.end(), dst.begin()); }, forward, both}, 0.3);
  const double copy = t[0].median, fwd = t[1].median, bwd = t[2].median - t[1].median;
  fmt::print("{:<22} {:>6.1f} MiB {:>2} {:>9.3f} {:>9.3f} {:>7.1f}% {:>9.3f} {:>7.1f}%\n",
             fmt::format("{}{}", name, masked ? " (mask)" : ""), n * 4.0 / (1 << 20), threads, copy * 1e3, fwd * 1e3,
             100 * copy / fwd, bwd * 1e3, 100 * 1.5 * copy / bwd);
  std::fflush(stdout);
}

void softmax_bandwidths(int only_threads) {
  fmt::print("\nsoftmax ops, float32 [rows, 1024], fraction of copy bandwidth\n");
  fmt::print("{:<22} {:>10} {:>2} {:>9} {:>9} {:>8} {:>9} {:>8}\n", "", "size", "th", "copy ms", "fwd ms", "fwd bw", "bwd ms",
             "bwd bw");
  for (int threads : {1, 2})
    if (only_threads == 0 || threads == only_threads)
      for (std::int64_t rows : {256, 4096}) {
        softmax_bandwidth("masked_softmax", tg::masked_softmax, rows, false, threads);
        softmax_bandwidth("masked_softmax", tg::masked_softmax, rows, true, threads);
        softmax_bandwidth("log_softmax", tg::log_softmax, rows, false, threads);
      }
}

}  // namespace

int main(int argc, char** argv) {
  // Optional arguments: run only the shape of that name ("" or "all": every shape), and only
  // with that many threads.
  const std::string only = argc > 1 && std::string(argv[1]) != "all" ? argv[1] : "";
  const int only_threads = argc > 2 ? std::stoi(argv[2]) : 0;
  fmt::print("multi-head attention (weights path), float32, key padding + causal, need_weights; {} blocks per figure\n",
             kBlocks);
  fmt::print("{:<7} {:>17} {:>2} {:>9} {:>8} {:>17} {:>8} {:>10} {:>17} {:>8} {:>8}\n", "", "(B, Q=K, E, H)", "th",
             "roof ms", "fwd ms", "fwd spread", "fwd %", "f+b ms", "f+b spread", "f+b %", "+RSS MiB");
  const std::vector<Case> cases = {{"toy", 1, 8, 16, 2}, {"small", 8, 64, 64, 4}, {"medium", 8, 128, 256, 8},
                                   {"large", 4, 512, 512, 8}, {"long", 1, 2048, 256, 4}};
  for (const auto& c : cases)
    if (only.empty() || only == c.name)
      for (int threads : {1, 2})
        if (only_threads == 0 || threads == only_threads) run_case(c, threads);
  if (only.empty() || only == "softmax") softmax_bandwidths(only_threads);
}
