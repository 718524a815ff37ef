// Matmul throughput: tapegrad::matmul against the raw oneDNN primitive and a naive loop, in one
// run; then the overhead of one recorded elementwise op (forward + backward) on 8 elements.
//
// Each figure is the best of 7 timed blocks after a warm-up (on a shared, noisy machine the
// minimum is the steadiest estimate of what the code costs); the blocks of tapegrad and of the
// raw primitive alternate, so both see the same machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include <tapegrad/tapegrad.hpp>

#include "bench_support.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {
using bench::RawDnnl;
using bench::seconds_per_call;

void naive(const float* a, const float* b, float* c, std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n) {
  for (std::int64_t p = 0; p < batch; ++p)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float acc = 0;
        for (std::int64_t q = 0; q < k; ++q) acc += a[(p * m + i) * k + q] * b[(p * k + q) * n + j];
        c[(p * m + i) * n + j] = acc;
      }
}

struct Shape3 {
  const char* name;
  std::int64_t batch, m, k, n;
};

void bench_matmul() {
  fmt::print("matmul, float32 (bfloat16 native on this CPU: {})\n", tg::bfloat16_native() ? "yes" : "no");
  fmt::print("{:<28} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "shape [batch] MxK @ KxN", "tapegrad", "oneDNN", "naive", "bf16", "tg/dnnl");
  fmt::print("{:<28} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "ratio");
  const std::vector<Shape3> shapes = {
      {"64^3", 1, 64, 64, 64},           {"128^3", 1, 128, 128, 128},       {"256^3", 1, 256, 256, 256},
      {"512^3", 1, 512, 512, 512},       {"1024^3", 1, 1024, 1024, 1024},   {"scores [64] 128x32@32x128", 64, 128, 32, 128},
      {"values [64] 128x128@128x32", 64, 128, 128, 32}, {"scores [32] 512x64@64x512", 32, 512, 64, 512},
      {"values [32] 512x512@512x64", 32, 512, 512, 64},
  };
  tg::NoGradGuard no_grad;
  for (const auto& s : shapes) {
    const double flop = 2.0 * s.batch * s.m * s.k * s.n;
    const Tensor a = tg::full({s.batch, s.m, s.k}, 0.5), b = tg::full({s.batch, s.k, s.n}, 0.25);
    RawDnnl raw(s.batch, s.m, s.k, s.n);
    const auto t = seconds_per_call({[&] { tg::matmul(a, b); }, [&] { raw.run(); }});
    const double t_tg = t[0], t_raw = t[1];
    const double t_bf = seconds_per_call([&] { tg::matmul(a, b, tg::MatmulPrecision::bfloat16); });
    std::vector<float> c(static_cast<std::size_t>(s.batch * s.m * s.n));
    const bool small = flop <= 2.0 * 512 * 512 * 512;
    const double t_naive = small ? seconds_per_call([&] { naive(a.data<float>(), b.data<float>(), c.data(), s.batch, s.m, s.k, s.n); }, 0.5) : 0;
    fmt::print("{:<28} {:>10.1f} {:>10.1f} {:>10} {:>10.1f} {:>9.3f}\n", s.name, flop / t_tg * 1e-9, flop / t_raw * 1e-9,
               small ? fmt::format("{:.2f}", flop / t_naive * 1e-9) : std::string("-"), flop / t_bf * 1e-9, t_raw / t_tg);
  }
  // A transposed operand reaches oneDNN by strides; the raw primitive here is the plain layout.
  const Tensor a = tg::full({512, 512}, 0.5), bt = tg::transpose(tg::full({512, 512}, 0.25), 0, 1);
  RawDnnl raw(1, 512, 512, 512);
  const auto tt = seconds_per_call({[&] { tg::matmul(a, bt); }, [&] { raw.run(); }});
  const double t_t = tt[0], t_raw = tt[1];
  fmt::print("{:<28} {:>10.1f} {:>10.1f} {:>10} {:>10} {:>9.3f}\n", "512^3, b transposed view", 2.0 * 512 * 512 * 512 / t_t * 1e-9,
             2.0 * 512 * 512 * 512 / t_raw * 1e-9, "-", "-", t_raw / t_t);
  const Tensor a64 = tg::full({256, 256}, 0.5, tg::float64), b64 = tg::full({256, 256}, 0.25, tg::float64);
  fmt::print("{:<28} {:>10.1f}   (float64, tapegrad's own kernel)\n\n", "256^3 float64",
             2.0 * 256 * 256 * 256 / seconds_per_call([&] { tg::matmul(a64, b64); }) * 1e-9);
}

void bench_overhead() {
  // A chain of recorded muls on 8 elements, then one backward through all of them.
  constexpr int kChain = 1000;
  const Tensor start = tg::ones({8});
  const double t = seconds_per_call([&] {
    Tensor x = tg::ones({8}).set_requires_grad();
    Tensor y = x;
    for (int i = 0; i < kChain; ++i) y = tg::mul(y, start);
    tg::backward({y}, {start});
    tg::clear_tape();
  });
  const double t_fwd = seconds_per_call([&] {
    Tensor x = tg::ones({8}).set_requires_grad();
    Tensor y = x;
    for (int i = 0; i < kChain; ++i) y = tg::mul(y, start);
    tg::clear_tape();
  });
  fmt::print("recorded elementwise op on 8 elements: {:.2f} us forward + backward ({:.2f} us forward alone)\n",
             t / kChain * 1e6, t_fwd / kChain * 1e6);
}

}  // namespace

int main() {
  bench_matmul();
  bench_overhead();
}
