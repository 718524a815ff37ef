// Section "fused": the fused attention path (need_weights = false) against the weights path
// (need_weights = true) on long sequences: MultiHeadAttention float32, B = 1, E = 256, H = 4,
// a key-padding mask (the last eighth of the keys) and a causal mask. Forward (no recording)
// and forward + backward (from the output, every parameter's gradient), the four alternating.
//
// Peak memory, two ways:
// - storage: tensor storage one call holds at its peak above what it held before, in this
//   process (memory_stats()); it leaves out the fused path's per-thread tile buffers and
//   oneDNN's scratch, both small and independent of L^2.
// - resident: measured in a fresh process (this program re-run with the hidden --rss-peak), so
//   that nothing an earlier measurement freed is still counted. The child builds the layer and
//   input, makes one warm-up call (oneDNN primitives), empties tapegrad's cache of freed blocks,
//   resets the kernel's high-water mark (writing 5 to /proc/self/clear_refs), notes VmRSS, makes
//   the measured call and reports VmHWM - VmRSS. malloc is told to serve every block of 64 KiB
//   and up by mmap, so a freed block goes back to the kernel and this tracks what the call held
//   at once. -1 when the child cannot run or /proc lacks the fields.
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

constexpr std::int64_t kE = 256, kH = 4;

struct Setup {
  tg::MultiHeadAttention layer{{.query_dim = kE, .heads = kH, .seed = 1}};
  Tensor x;
  tg::MhaCall call;
  Setup(std::int64_t len, bool need_weights) : x(tg::randn({1, len, kE}, 2)) {
    std::vector<bool> keys(static_cast<std::size_t>(len), true);
    for (std::int64_t j = len - len / 8; j < len; ++j) keys[static_cast<std::size_t>(j)] = false;
    call = {.masking = {.key_mask = tg::from_bools(keys, {1, len}), .causal = true}, .need_weights = need_weights};
  }
  void forward() {
    tg::NoGradGuard no_grad;
    layer.forward(x, call);
  }
  void forward_backward() {
    layer.zero_grad();
    const Tensor out = layer.forward(x, call).output;
    tg::backward({out}, {tg::ones_like(out)});
    tg::clear_tape();
  }
};

double resident_mib(std::int64_t len, bool need_weights, bool backward, int threads) {
  return run_self(fmt::format("--rss-peak {} {} {} {}", len, int(need_weights), int(backward), threads));
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// Largest difference between the paths: output and the gradient of every parameter.
std::string agreement(std::int64_t len) {
  Setup fused(len, false), weights(len, true);
  std::vector<Tensor> grads[2];
  Tensor outs[2];
  for (int i = 0; i < 2; ++i) {
    Setup& s = i == 0 ? fused : weights;
    outs[i] = s.layer.forward(s.x, s.call).output;
    tg::backward({outs[i]}, {tg::ones_like(outs[i])});
    for (const Tensor& p : s.layer.parameters()) grads[i].push_back(p.grad());
    tg::clear_tape();
  }
  double worst_grad = 0, largest = 0;
  for (std::size_t p = 0; p < grads[0].size(); ++p) {
    worst_grad = std::max(worst_grad, max_abs_diff(grads[0][p], grads[1][p]));
    for (double g : grads[1][p].to_vector<double>()) largest = std::max(largest, std::abs(g));
  }
  return fmt::format("agreement at L = {}: max |output diff| {:.2e}, max |parameter gradient diff| {:.2e} (largest gradient {:.2e})", len,
                     max_abs_diff(outs[0], outs[1]), worst_grad, largest);
}

}  // namespace

int fused_rss_child(long long len, bool need_weights, bool backward, int threads) {
  mallopt(M_MMAP_THRESHOLD, 64 << 10);  // fixed: no dynamic threshold keeping big blocks in the heap
  tg::set_num_threads(threads);
  Setup s(len, need_weights);
  auto call = [&] { backward ? s.forward_backward() : s.forward(); };
  call();
  tg::release_cached_memory();
  std::ofstream("/proc/self/clear_refs") << "5";
  const std::int64_t before = status_kb("VmRSS:");
  call();
  const std::int64_t peak = status_kb("VmHWM:");
  fmt::print("{:.1f}\n", before < 0 || peak < 0 ? -1.0 : static_cast<double>(peak - before) / 1024.0);
  return 0;
}

void section_fused(Report& report, const Options& options) {
  auto& table = report.table("fused",
                             fmt::format("fused (need_weights = false) against the weights path: MultiHeadAttention float32, B = 1, E = {}, "
                                         "H = {}, key padding (last 1/8) + causal; ms median (min-max); speed-up = weights path's time / this",
                                         kE, kH),
                             {{"threads", "th", 0, 2},
                              {"length", "L", 0, 5},
                              {"path", "path", 0, 7},
                              {"forward_ms", "fwd ms", 1, 20},
                              {"forward_speedup", "fwd x", 2, 5},
                              {"forward_backward_ms", "f+b ms", 1, 22},
                              {"forward_backward_speedup", "f+b x", 2, 5},
                              {"peak_forward_mib", "peak fwd", 1, 8},
                              {"peak_forward_backward_mib", "peak f+b", 1, 8},
                              {"resident_forward_mib", "RSS fwd", 1, 8},
                              {"resident_forward_backward_mib", "RSS f+b", 1, 8}});
  const std::vector<std::int64_t> lengths = options.quick ? std::vector<std::int64_t>{256} : std::vector<std::int64_t>{2048, 4096};
  tg::set_num_threads(options.threads.front());
  table.note(agreement(lengths.front()));
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    for (std::int64_t len : lengths) {
      Setup fused(len, false), weights(len, true);
      const auto t = measure({[&] { fused.forward(); }, [&] { weights.forward(); }, [&] { fused.forward_backward(); },
                              [&] { weights.forward_backward(); }},
                             options.runs, options.seconds);
      for (int path = 0; path < 2; ++path) {
        Setup& s = path == 0 ? fused : weights;
        const Stats& f = t[path];
        const Stats& b = t[2 + path];
        table.add({static_cast<std::int64_t>(threads), len, std::string(path == 0 ? "fused" : "weights"), f, t[1].median / f.median, b,
                   t[3].median / b.median, peak_mib_of([&] { s.forward(); }), peak_mib_of([&] { s.forward_backward(); }),
                   resident_mib(len, path == 1, false, threads), resident_mib(len, path == 1, true, threads)});
      }
    }
  }
  table.note("peak: tensor storage one call holds at its peak (this process); RSS: resident MiB one call adds at its peak (fresh process)");
}

}  // namespace bench
