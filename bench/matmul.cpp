// Section "matmul": tapegrad::matmul against the raw oneDNN primitive and a naive loop, in one
// run; then the fixed cost of one recorded elementwise op (forward + backward) on 8 elements.
// tapegrad's calls and the raw primitive's alternate, so both see the same machine.
#include <tapegrad/tapegrad.hpp>

#include "bench_support.hpp"
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
};

double gflops(double flop, const Stats& s) { return flop / s.median * 1e-9; }

}  // namespace

void section_matmul(Report& report, const Options& options) {
  auto& table = report.table("matmul", "matmul, float32: GFLOP/s (median); tg/dnnl = oneDNN's time / tapegrad's",
                             {{"shape [batch] MxK @ KxN", 0, 28}, {"tapegrad", 1}, {"oneDNN", 1}, {"naive", 2}, {"bf16", 1}, {"tg/dnnl", 3}});
  std::vector<Shape3> shapes = {
      {"64^3", 1, 64, 64, 64},           {"128^3", 1, 128, 128, 128},       {"256^3", 1, 256, 256, 256},
      {"512^3", 1, 512, 512, 512},       {"1024^3", 1, 1024, 1024, 1024},   {"scores [64] 128x32@32x128", 64, 128, 32, 128},
      {"values [64] 128x128@128x32", 64, 128, 128, 32}, {"scores [32] 512x64@64x512", 32, 512, 64, 512},
      {"values [32] 512x512@512x64", 32, 512, 512, 64},
  };
  if (options.quick) shapes.resize(2);
  tg::NoGradGuard no_grad;
  for (const auto& s : shapes) {
    const double flop = 2.0 * s.batch * s.m * s.k * s.n;
    const Tensor a = tg::full({s.batch, s.m, s.k}, 0.5), b = tg::full({s.batch, s.k, s.n}, 0.25);
    RawDnnl raw(s.batch, s.m, s.k, s.n);
    const auto t = measure({[&] { tg::matmul(a, b); }, [&] { raw.run(); }, [&] { tg::matmul(a, b, tg::MatmulPrecision::bfloat16); }});
    std::vector<float> c(static_cast<std::size_t>(s.batch * s.m * s.n));
    const bool small = flop <= 2.0 * 256 * 256 * 256;
    const Cell naive_gflops = small ? Cell(gflops(flop, measure([&] { naive(a.data<float>(), b.data<float>(), c.data(), s.batch, s.m, s.k, s.n); }, 3)))
                                    : Cell(std::string("-"));
    table.add({std::string(s.name), gflops(flop, t[0]), gflops(flop, t[1]), naive_gflops, gflops(flop, t[2]), t[1].median / t[0].median});
  }
  // A transposed operand reaches oneDNN by strides; the raw primitive here is the plain layout.
  const Tensor a = tg::full({512, 512}, 0.5), bt = tg::transpose(tg::full({512, 512}, 0.25), 0, 1);
  RawDnnl raw(1, 512, 512, 512);
  const auto tt = measure({[&] { tg::matmul(a, bt); }, [&] { raw.run(); }});
  const double f512 = 2.0 * 512 * 512 * 512;
  table.add({std::string("512^3, b transposed view"), gflops(f512, tt[0]), gflops(f512, tt[1]), std::string("-"), std::string("-"),
             tt[1].median / tt[0].median});
  const Tensor a64 = tg::full({256, 256}, 0.5, tg::float64), b64 = tg::full({256, 256}, 0.25, tg::float64);
  table.add({std::string("256^3 float64 (own kernel)"), gflops(2.0 * 256 * 256 * 256, measure([&] { tg::matmul(a64, b64); })),
             std::string("-"), std::string("-"), std::string("-"), std::string("-")});
}

void section_overhead(Report& report, const Options&) {
  // A chain of recorded muls on 8 elements, then one backward through all of them.
  constexpr int kChain = 1000;
  const Tensor start = tg::ones({8});
  const auto t = measure({[&] {
                            Tensor x = tg::ones({8}).set_requires_grad();
                            Tensor y = x;
                            for (int i = 0; i < kChain; ++i) y = tg::mul(y, start);
                            tg::backward({y}, {start});
                          },
                          [&] {
                            Tensor x = tg::ones({8}).set_requires_grad();
                            Tensor y = x;
                            for (int i = 0; i < kChain; ++i) y = tg::mul(y, start);
                          }});
  auto& table = report.table("overhead", "the tape's fixed cost: one recorded mul on 8 elements, microseconds per op (median)",
                             {{"forward + backward", 2, 20}, {"forward alone", 2, 16}});
  table.add({t[0].median / kChain * 1e6, t[1].median / kChain * 1e6});
}

}  // namespace bench
