// The fused attention path (need_weights = false) against the weights path (need_weights = true)
// on long sequences: MultiHeadAttention float32, B = 1, E = 256, H = 4, Q = K = 2048 and 4096,
// a key-padding mask (the last eighth of the keys) and a causal mask.
//
// Time: forward (no recording) and forward + backward (backward from the output, every
// parameter's gradient), the two paths alternating, median and range of `runs` calls each.
//
// Peak memory: each measurement runs in a fresh process (this program re-run with --peak), so
// that nothing freed by an earlier measurement is still counted. The child builds the layer and
// input, makes one warm-up call (oneDNN primitives), empties tapegrad's cache of freed blocks
// (release_cached_memory), resets the kernel's high-water mark (writing 5 to
// /proc/self/clear_refs), notes VmRSS, makes the measured call and reports VmHWM - VmRSS: the
// resident memory the call added at its peak. malloc is told to serve every block of 64 KiB and
// up by mmap, so a freed block goes back to the kernel and this tracks what the call held at once.
//
// Usage: bench_flash [runs] [--no-causal]  (default 10 runs), at 1 and 2 threads. Without the
// causal mask the fused path has no key tiles to skip: the weights path's best case.
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <tapegrad/tapegrad.hpp>

#include "bench_support.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

constexpr std::int64_t kE = 256, kH = 4;
bool causal = true;

struct Setup {
  tg::MultiHeadAttention layer{{.query_dim = kE, .heads = kH, .seed = 1}};
  Tensor x;
  tg::MhaCall call;
  explicit Setup(std::int64_t len, bool need_weights) : x(tg::randn({1, len, kE}, 2)) {
    std::vector<bool> keys(static_cast<std::size_t>(len), true);
    for (std::int64_t j = len - len / 8; j < len; ++j) keys[static_cast<std::size_t>(j)] = false;
    call = {.masks = {.key_mask = tg::from_bools(keys, {1, len})}, .causal = causal, .need_weights = need_weights};
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

std::int64_t status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::string(field).size() + 1));
  return -1;
}

// The child: prints the peak resident memory (MiB) one call added.
int peak_child(std::int64_t len, bool need_weights, bool backward, int threads) {
  mallopt(M_MMAP_THRESHOLD, 64 << 10);  // fixed: no dynamic threshold keeping big blocks in the heap
  tg::set_num_threads(threads);
  Setup s(len, need_weights);
  auto call = [&] { backward ? s.forward_backward() : s.forward(); };
  call();
  tg::release_cached_memory();
  std::ofstream("/proc/self/clear_refs") << "5";
  const std::int64_t before = status_kb("VmRSS:");
  call();
  fmt::print("{:.1f}\n", static_cast<double>(status_kb("VmHWM:") - before) / 1024.0);
  return 0;
}

double peak_mib(const char* self, std::int64_t len, bool need_weights, bool backward, int threads) {
  const std::string cmd =
      fmt::format("{} --peak {} {} {} {}{}", self, len, int(need_weights), int(backward), threads, causal ? "" : " --no-causal");
  FILE* pipe = popen(cmd.c_str(), "r");
  double mib = -1;
  if (pipe == nullptr || std::fscanf(pipe, "%lf", &mib) != 1) mib = -1;
  if (pipe != nullptr) pclose(pipe);
  return mib;
}

struct Stats {
  double median, lo, hi;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

// Seconds per call of a and b, alternating, `runs` calls each after one warm-up.
std::pair<Stats, Stats> alternate(const std::function<void()>& a, const std::function<void()>& b, int runs) {
  a();
  b();
  std::vector<double> ta, tb;
  for (int r = 0; r < runs; ++r) {
    ta.push_back(bench::block(a, 1));
    tb.push_back(bench::block(b, 1));
  }
  return {stats(ta), stats(tb)};
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// Largest difference between the paths: output and the gradient of every parameter.
void agreement(std::int64_t len) {
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
  fmt::print("  agreement at L = {}: max |output diff| {:.2e}, max |parameter gradient diff| {:.2e} (largest gradient {:.2e})\n", len,
             max_abs_diff(outs[0], outs[1]), worst_grad, largest);
}

}  // namespace

int main(int argc, char** argv) {
  causal = std::string(argv[argc - 1]) != "--no-causal";
  const int args = argc - (causal ? 0 : 1);
  if (args == 6 && std::string(argv[1]) == "--peak")
    return peak_child(std::stoll(argv[2]), std::stoi(argv[3]) != 0, std::stoi(argv[4]) != 0, std::stoi(argv[5]));
  const int runs = args > 1 ? std::stoi(argv[1]) : 10;
  fmt::print("MultiHeadAttention float32, B = 1, E = {}, H = {}, key padding (last 1/8){}; {} runs per path, alternating\n", kE, kH,
             causal ? " + causal" : "", runs);
  fmt::print("times in ms: median [min, max]; peak = resident MiB one call adds at its peak (fresh process each)\n\n");
  tg::set_num_threads(1);
  agreement(2048);
  for (int threads : {1, 2}) {
    fmt::print("\n{} thread{}\n", threads, threads > 1 ? "s" : "");
    fmt::print("{:>6} {:>10} {:>26} {:>26} {:>10} {:>10}\n", "L", "path", "forward ms", "fwd+bwd ms", "peak fwd", "peak f+b");
    for (std::int64_t len : {2048, 4096}) {
      tg::set_num_threads(threads);
      Setup fused(len, false), weights(len, true);
      const auto [ff, wf] = alternate([&] { fused.forward(); }, [&] { weights.forward(); }, runs);
      const auto [fb, wb] = alternate([&] { fused.forward_backward(); }, [&] { weights.forward_backward(); }, runs);
      for (int path = 0; path < 2; ++path) {
        const Stats& f = path == 0 ? ff : wf;
        const Stats& b = path == 0 ? fb : wb;
        fmt::print("{:>6} {:>10} {:>26} {:>26} {:>10.1f} {:>10.1f}\n", len, path == 0 ? "fused" : "weights",
                   fmt::format("{:.1f} [{:.1f}, {:.1f}]", f.median * 1e3, f.lo * 1e3, f.hi * 1e3),
                   fmt::format("{:.1f} [{:.1f}, {:.1f}]", b.median * 1e3, b.lo * 1e3, b.hi * 1e3),
                   peak_mib(argv[0], len, path == 1, false, threads), peak_mib(argv[0], len, path == 1, true, threads));
      }
      fmt::print("{:>6} {:>10} {:>26} {:>26}\n", len, "ratio", fmt::format("{:.2f}", wf.median / ff.median),
                 fmt::format("{:.2f}", wb.median / fb.median));
    }
  }
}
