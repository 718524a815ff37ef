// Multi-head attention throughput: forward (no recording) and forward + backward, float32,
// returning per-head weights, on the shapes of the attention issue. Each time is turned into
// GFLOP/s and into the fraction of the matmul roofline: the same FLOPs at the oneDNN float32
// matmul throughput measured in this run.
//
// FLOPs per forward, with D = E / H: 2 B Q E^2 (q) + 2 B K E^2 (k) + 2 B K E^2 (v)
// + 2 B Q E^2 (output projection) + 2 B H Q K D (scores) + 2 B H Q K D (weighted sum);
// forward + backward counts 3x (the backward is about twice the forward).
#include <thread>

#include <tapegrad/tapegrad.hpp>

#include "bench_support.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

struct Case {
  const char* name;
  std::int64_t b, q, e, h;
};

// Best oneDNN float32 matmul throughput of a few large shapes, in GFLOP/s.
double dnnl_peak() {
  double best = 0;
  for (std::int64_t n : {512, 1024}) {
    bench::RawDnnl raw(1, n, n, n);
    best = std::max(best, 2.0 * n * n * n / bench::seconds_per_call([&] { raw.run(); }) * 1e-9);
  }
  return best;
}

}  // namespace

int main() {
  const double peak = dnnl_peak();
  fmt::print("multi-head attention, float32, {} threads; oneDNN float32 matmul peak this run: {:.1f} GFLOP/s\n\n",
             std::thread::hardware_concurrency(), peak);
  fmt::print("{:<8} {:>18} {:>11} {:>9} {:>9} {:>13} {:>9} {:>9}\n", "", "(B, Q=K, E, H)", "fwd ms", "GFLOP/s", "roofline",
             "fwd+bwd ms", "GFLOP/s", "roofline");
  const std::vector<Case> cases = {{"toy", 1, 8, 16, 2}, {"small", 8, 64, 64, 4}, {"medium", 8, 128, 256, 8},
                                   {"large", 4, 512, 512, 8}, {"long", 1, 2048, 256, 4}};
  for (const auto& c : cases) {
    const double d = static_cast<double>(c.e / c.h);
    const double fwd_flop = 2.0 * c.b * c.q * c.e * c.e * 4 + 2.0 * 2.0 * c.b * c.h * c.q * c.q * d;
    tg::MultiHeadAttention layer({.query_dim = c.e, .heads = c.h, .seed = 1});
    const Tensor x = tg::randn({c.b, c.q, c.e}, 2);
    const double t_fwd = bench::seconds_per_call([&] {
      tg::NoGradGuard no_grad;
      layer.forward(x);
    });
    const double t_both = bench::seconds_per_call([&] {
      auto [out, attn] = layer.forward(x);
      tg::backward({out, attn}, {tg::ones_like(out), tg::zeros_like(attn)});
      tg::clear_tape();
    });
    const double g_fwd = fwd_flop / t_fwd * 1e-9, g_both = 3 * fwd_flop / t_both * 1e-9;
    fmt::print("{:<8} {:>18} {:>11.3f} {:>9.1f} {:>9.3f} {:>13.3f} {:>9.1f} {:>9.3f}\n", c.name,
               fmt::format("({}, {}, {}, {})", c.b, c.q, c.e, c.h), t_fwd * 1e3, g_fwd, g_fwd / peak, t_both * 1e3, g_both,
               g_both / peak);
  }
}
