// Section "matmul": tapegrad::matmul against the raw oneDNN primitive on the same shape and
// threads (the primitive timed just before tapegrad), plus a naive loop and bfloat16. Forward +
// backward (both operands' gradients) does 3x the forward's flops; its reference is 3x the
// primitive's time.
#include <tapegrad/tapegrad.hpp>

#include "raw_dnnl.hpp"
#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

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
  bool transposed = false;  // b is a transposed view: it reaches oneDNN by strides
};

}  // namespace

void section_matmul(Report& report, const Options& options) {
  auto& table = report.table(
      "matmul", "matmul, float32: ms median (min-max), GFLOP/s; tg/dnnl = oneDNN's time / tapegrad's; f+b % = 3x oneDNN's time / tapegrad's",
      {{"threads", "th", 0, 2},
       {"shape", "shape [batch] MxK @ KxN", 0, 27},
       {"forward_ms", "fwd ms", 3, 24},
       {"forward_gflops", "GFLOP/s", 1, 8},
       {"onednn_ms", "oneDNN ms", 3, 24},
       {"onednn_gflops", "oneDNN", 1, 7},
       {"forward_ratio", "tg/dnnl", 3, 7},
       {"forward_backward_ms", "f+b ms", 3, 24},
       {"forward_backward_gflops", "GFLOP/s", 1, 8},
       {"forward_backward_roofline", "f+b %", 1, 6},
       {"naive_gflops", "naive", 2, 6},
       {"bfloat16_gflops", "bf16", 1, 7},
       {"peak_mib", "peak MiB", 2, 8}});
  std::vector<Shape3> shapes = {
      {"64^3", 1, 64, 64, 64},
      {"128^3", 1, 128, 128, 128},
      {"256^3", 1, 256, 256, 256},
      {"512^3", 1, 512, 512, 512},
      {"1024^3", 1, 1024, 1024, 1024},
      {"scores [64] 128x32@32x128", 64, 128, 32, 128},
      {"values [64] 128x128@128x32", 64, 128, 128, 32},
      {"scores [32] 512x64@64x512", 32, 512, 64, 512},
      {"values [32] 512x512@512x64", 32, 512, 512, 64},
      {"512^3, b transposed view", 1, 512, 512, 512, true},
  };
  if (options.quick) shapes = {{"64^3", 1, 64, 64, 64}, {"[4] 32x64@64x32, b transposed", 4, 32, 64, 32, true}};
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    for (const auto& s : shapes) {
      const double flop = 2.0 * s.batch * s.m * s.k * s.n;
      const Tensor a = tg::full({s.batch, s.m, s.k}, 0.5).set_requires_grad();
      const Tensor b = (s.transposed ? tg::transpose(tg::full({s.batch, s.n, s.k}, 0.25), 1, 2) : tg::full({s.batch, s.k, s.n}, 0.25))
                           .set_requires_grad();
      const Tensor g = tg::full({s.batch, s.m, s.n}, 1.0);
      RawDnnl raw(s.batch, s.m, s.k, s.n);
      const auto fwd_bwd = [&] {
        tg::backward({tg::matmul(a, b)}, {g});
        Tensor(a).zero_grad();
        Tensor(b).zero_grad();
      };
      const double peak = peak_mib_of(fwd_bwd);
      const Stats raw_t = measure([&] { raw.run(); }, options.runs, options.seconds);
      after_references();
      const auto mine = measure({[&] {
                                   tg::NoGradGuard no_grad;
                                   tg::matmul(a, b);
                                 },
                                 fwd_bwd,
                                 [&] {
                                   tg::NoGradGuard no_grad;
                                   tg::matmul(a, b, tg::MatmulPrecision::bfloat16);
                                 }},
                                options.runs, options.seconds);
      const Stats t[] = {mine[0], raw_t, mine[1], mine[2]};
      Cell naive_gflops;
      if (flop <= 2.0 * 256 * 256 * 256 && !s.transposed) {
        std::vector<float> c(static_cast<std::size_t>(s.batch * s.m * s.n));
        naive_gflops = per_second(flop, measure([&] { naive(a.data<float>(), b.data<float>(), c.data(), s.batch, s.m, s.k, s.n); },
                                                std::min(options.runs, 3), 0));
      }
      table.add({static_cast<std::int64_t>(threads), std::string(s.name), t[0], per_second(flop, t[0]), t[1], per_second(flop, t[1]),
                 t[1].median / t[0].median, t[2], per_second(3 * flop, t[2]), 100 * 3 * t[1].median / t[2].median, naive_gflops,
                 per_second(flop, t[3]), peak});
    }
  }
  // float64: OpenBLAS's dgemm through tapegrad's bands (oneDNN has none on CPU), forward only.
  tg::set_num_threads(options.threads.front());
  const std::int64_t n64 = options.quick ? 64 : 256;
  const Tensor a64 = tg::full({n64, n64}, 0.5, tg::float64), b64 = tg::full({n64, n64}, 0.25, tg::float64);
  const Stats t64 = measure([&] { tg::matmul(a64, b64); }, options.runs, options.seconds);
  table.add({static_cast<std::int64_t>(options.threads.front()), fmt::format("{}^3 float64 (OpenBLAS)", n64), t64,
             per_second(2.0 * n64 * n64 * n64, t64), Cell(), Cell(), Cell(), Cell(), Cell(), Cell(), Cell(), Cell(), Cell()});
}

}  // namespace bench
