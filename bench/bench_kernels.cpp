// Elementwise ops and reductions against the machine's memory bandwidth, measured in the same
// run by a plain copy loop over the same byte count (one tensor's bytes read, the same written),
// on the same number of threads (1, then 2).
//
// Each figure is the median of 15 timed blocks after a warm-up, with the min-max spread; a
// block is as many calls as take about 2 ms. "best" compares the minima instead of the medians. Kernel blocks and copy blocks alternate, so a
// kernel's fraction of copy bandwidth compares two things that saw the same machine.
//
// Bytes moved (B = bytes of one float32 [N, C] tensor, R = 4 N bytes (a result reduced over
// dim -1), C = 4 C bytes (the bias row, or a result reduced over dim 0), M = N C bytes (a bool
// mask)): forward = inputs read + output written; backward = upstream gradient read + tensors
// the backward keeps read + input gradients written (kernels() lists each op's sums). Work a kernel
// repeats (reading the upstream gradient twice, say) is not counted: the figure is what an
// ideal kernel would have to move, so a lower GB/s means avoidable traffic or compute.
//
//   ./build/bench/bench_kernels [--threads N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tapegrad/tapegrad.hpp>

#include "autodiff/parallel.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

using clock_type = std::chrono::steady_clock;

struct Stats {
  double median = 0, min = 0, max = 0;  // seconds per call
};

double block(const std::function<void()>& f, int reps) {
  const auto t0 = clock_type::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(clock_type::now() - t0).count() / reps;
}

int calibrate(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();  // warm-up: allocator, pages, caches
  int reps = 1;
  while (reps < (1 << 20) && block(f, reps) * reps < 2e-3) reps *= 2;
  return reps;
}

Stats summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// Times f and copy in alternating blocks; returns {f, copy}.
std::pair<Stats, Stats> measure(const std::function<void()>& f, const std::function<void()>& copy) {
  constexpr int kRuns = 15;
  const int rf = calibrate(f), rc = calibrate(copy);
  std::vector<double> tf, tc;
  for (int r = 0; r < kRuns; ++r) {
    tf.push_back(block(f, rf));
    tc.push_back(block(copy, rc));
  }
  return {summarise(tf), summarise(tc)};
}

struct Kernel {
  std::string name;
  std::function<Tensor(const Tensor&)> op;  // of the leaf x (other operands captured)
  std::vector<Tensor> others;               // leaves that also get gradients
  double fwd_bytes, bwd_bytes;
};

struct Row {
  int threads;
  std::string shape, kernel;
  double bytes_fwd, bytes_bwd;
  Stats fwd, fwdbwd, copy_fwd, copy_fwdbwd;
};

std::vector<Kernel> kernels(std::int64_t n, std::int64_t c, tg::Generator& gen) {
  const double B = 4.0 * n * c, R = 4.0 * n, C = 4.0 * c, M = 1.0 * n * c;  // M: bool mask bytes
  const Tensor y = tg::randn({n, c}, gen).set_requires_grad();
  const Tensor bias = tg::randn({c}, gen).set_requires_grad();
  const Tensor cond = tg::gt(tg::randn({n, c}, gen), tg::zeros({}));
  std::vector<Kernel> k;
  k.push_back({"add", [y](const Tensor& x) { return tg::add(x, y); }, {y}, 3 * B, 3 * B});
  k.push_back({"add bias [N,C]+[C]", [bias](const Tensor& x) { return tg::add(x, bias); }, {bias}, 2 * B + C, 2 * B + C});
  k.push_back({"mul", [y](const Tensor& x) { return tg::mul(x, y); }, {y}, 3 * B, 5 * B});
  k.push_back({"relu", [](const Tensor& x) { return tg::relu(x); }, {}, 2 * B, 3 * B});
  k.push_back({"gelu", [](const Tensor& x) { return tg::gelu(x); }, {}, 2 * B, 3 * B});
  k.push_back({"exp", [](const Tensor& x) { return tg::exp(x); }, {}, 2 * B, 3 * B});
  k.push_back({"tanh", [](const Tensor& x) { return tg::tanh(x); }, {}, 2 * B, 3 * B});
  k.push_back({"where", [cond, y](const Tensor& x) { return tg::where(cond, x, y); }, {y}, 3 * B + M, 3 * B + M});
  k.push_back({"sum dim -1", [](const Tensor& x) { return tg::sum(x, {-1}); }, {}, B + R, R + B});
  k.push_back({"mean dim -1", [](const Tensor& x) { return tg::mean(x, {-1}); }, {}, B + R, R + B});
  k.push_back({"max dim -1", [](const Tensor& x) { return tg::max(x, {-1}); }, {}, B + R, R + B + R + B});
  k.push_back({"sum dim 0", [](const Tensor& x) { return tg::sum(x, {0}); }, {}, B + C, C + B});
  k.push_back({"mean dim 0", [](const Tensor& x) { return tg::mean(x, {0}); }, {}, B + C, C + B});
  k.push_back({"max dim 0", [](const Tensor& x) { return tg::max(x, {0}); }, {}, B + C, C + B + C + B});
  return k;
}

void run_shape(int threads, std::int64_t n, std::int64_t c, std::vector<Row>& rows) {
  tg::Generator gen(7);
  Tensor x = tg::randn({n, c}, gen).set_requires_grad();
  // The copy loop: one tensor's bytes read and written, split over the same threads as the ops.
  const std::int64_t count = n * c;
  std::vector<float> src(static_cast<std::size_t>(count), 1.5f), dst(src.size());
  const auto copy = [&] {
    tg::detail::parallel_for(count, 1, [&](std::int64_t b, std::int64_t e) {
      const float* s = src.data();
      float* d = dst.data();
      for (std::int64_t i = b; i < e; ++i) d[i] = s[i];
    });
  };
  const std::string shape = fmt::format("[{}, {}]", n, c);
  for (Kernel& k : kernels(n, c, gen)) {
    const Tensor probe = k.op(x);
    const Tensor g = tg::full(probe.shape(), 0.5);
    tg::clear_tape();
    const auto fwd = [&] {
      tg::NoGradGuard no_grad;
      k.op(x);
    };
    const auto fwdbwd = [&] {
      tg::backward({k.op(x)}, {g});
      x.grad();
      x.zero_grad();
      for (Tensor& o : k.others) o.zero_grad();
      tg::clear_tape();
    };
    const auto [tf, cf] = measure(fwd, copy);
    const auto [tb, cb] = measure(fwdbwd, copy);
    rows.push_back({threads, shape, k.name, k.fwd_bytes, k.bwd_bytes, tf, tb, cf, cb});
  }
}

double gbs(double bytes, double seconds) { return bytes / seconds * 1e-9; }
void print(const std::vector<Row>& rows, const std::vector<double>& copy_bytes) {
  // frac: median kernel GB/s over median copy GB/s; best: the same with both minima (on a busy
  // machine the steadier estimate of what the code itself costs).
  fmt::print("{:>3} {:<12} {:<20} {:>9} {:>17} {:>7} {:>5} {:>5} {:>9} {:>17} {:>7} {:>5} {:>5} {:>8}\n", "thr", "shape", "kernel",
             "fwd ms", "min-max", "GB/s", "frac", "best", "f+b ms", "min-max", "GB/s", "frac", "best", "copyGB/s");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double copy_f = gbs(copy_bytes[i], r.copy_fwd.median), copy_b = gbs(copy_bytes[i], r.copy_fwdbwd.median);
    const double f = gbs(r.bytes_fwd, r.fwd.median), fb = gbs(r.bytes_fwd + r.bytes_bwd, r.fwdbwd.median);
    const double best_f = r.copy_fwd.min / r.fwd.min * r.bytes_fwd / copy_bytes[i];
    const double best_fb = r.copy_fwdbwd.min / r.fwdbwd.min * (r.bytes_fwd + r.bytes_bwd) / copy_bytes[i];
    fmt::print("{:>3} {:<12} {:<20} {:>9.4f} {:>17} {:>7.1f} {:>5.2f} {:>5.2f} {:>9.4f} {:>17} {:>7.1f} {:>5.2f} {:>5.2f} {:>8.1f}\n", r.threads,
               r.shape, r.kernel, r.fwd.median * 1e3, fmt::format("{:.4f}-{:.4f}", r.fwd.min * 1e3, r.fwd.max * 1e3), f, f / copy_f,
               best_f, r.fwdbwd.median * 1e3, fmt::format("{:.4f}-{:.4f}", r.fwdbwd.min * 1e3, r.fwdbwd.max * 1e3), fb,
               fb / copy_b, best_fb, (copy_f + copy_b) / 2);
  }
}

nlohmann::json to_json(const std::vector<Row>& rows, const std::vector<double>& copy_bytes) {
  const auto stats = [](const Stats& s) { return nlohmann::json{{"median_ms", s.median * 1e3}, {"min_ms", s.min * 1e3}, {"max_ms", s.max * 1e3}}; };
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double copy_f = gbs(copy_bytes[i], r.copy_fwd.median), copy_b = gbs(copy_bytes[i], r.copy_fwdbwd.median);
    const double f = gbs(r.bytes_fwd, r.fwd.median), fb = gbs(r.bytes_fwd + r.bytes_bwd, r.fwdbwd.median);
    out.push_back({{"threads", r.threads},
                   {"shape", r.shape},
                   {"kernel", r.kernel},
                   {"bytes_forward", r.bytes_fwd},
                   {"bytes_backward", r.bytes_bwd},
                   {"forward", stats(r.fwd)},
                   {"forward_backward", stats(r.fwdbwd)},
                   {"forward_gbs", f},
                   {"forward_backward_gbs", fb},
                   {"copy_gbs_forward", copy_f},
                   {"copy_gbs_forward_backward", copy_b},
                   {"forward_fraction_of_copy", f / copy_f},
                   {"forward_backward_fraction_of_copy", fb / copy_b},
                   {"forward_fraction_of_copy_best", r.copy_fwd.min / r.fwd.min * r.bytes_fwd / copy_bytes[i]},
                   {"forward_backward_fraction_of_copy_best",
                    r.copy_fwdbwd.min / r.fwdbwd.min * (r.bytes_fwd + r.bytes_bwd) / copy_bytes[i]}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts{1, 2};
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) thread_counts = {std::atoi(argv[++i])};
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  // [4096, 4096]: 64 MiB per tensor, past the last-level cache, so the copy loop measures main
  // memory; [1024, 1024]: 4 MiB, past the L2 caches but inside a large L3, so the copy runs at
  // cache speed (a much higher bar for compute-heavy kernels); [544, 256] ([32 * 17, 256],
  // 544 KiB) is the size of a small model's activations, for information.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes{{4096, 4096}, {1024, 1024}, {32 * 17, 256}};
  std::vector<Row> rows;
  std::vector<double> copy_bytes;
  for (int t : thread_counts) {
    tg::set_num_threads(t);
    for (const auto& [n, c] : shapes) {
      run_shape(t, n, c, rows);
      copy_bytes.resize(rows.size(), 2.0 * 4.0 * n * c);  // the copy loop reads and writes B
    }
  }
  print(rows, copy_bytes);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << to_json(rows, copy_bytes).dump(2) << "\n";
  }
}
