// Section "bf16": bfloat16 compute (MatmulPrecisionGuard(bfloat16): the layers' products round
// their operands to bfloat16) against float32 on the attention issue's large and long shapes,
// the MultiHeadAttention layer (causal), both paths, alternating; then the large shape's output
// against float64 (relative 2-norm error and largest difference). "dnnl x" is the same ratio for
// oneDNN's own primitives alone on the forward's product shapes (the four projections, the
// scores and the weighted sum of values; bfloat16 in, float32 out), timed just before the layer:
// what the products alone gain on this CPU, the ceiling of the layer's speed-up.
#include <cmath>
#include <memory>

#include <tapegrad/tapegrad.hpp>

#include "raw_dnnl.hpp"
#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

struct Case {
  const char* name;
  std::int64_t b, q, e, h;
};

// The forward's products of MultiHeadAttention on this shape, as raw oneDNN primitives.
struct Products {
  std::vector<std::unique_ptr<RawDnnl>> p;
  Products(const Case& c, bool bf16) {
    const std::int64_t d = c.e / c.h;
    for (int i = 0; i < 4; ++i) p.push_back(std::make_unique<RawDnnl>(1, c.b * c.q, c.e, c.e, bf16));
    p.push_back(std::make_unique<RawDnnl>(c.b * c.h, c.q, d, c.q, bf16));
    p.push_back(std::make_unique<RawDnnl>(c.b * c.h, c.q, c.q, d, bf16));
  }
  void run() {
    for (auto& x : p) x->run();
  }
};

}  // namespace

void section_bf16(Report& report, const Options& options) {
  auto& table = report.table("bf16", "bfloat16 against float32, MultiHeadAttention (causal): ms median (min-max); x = float32's time / bfloat16's; "
                             "dnnl x: the same for oneDNN's primitives alone on the forward's product shapes",
                             {{"threads", "th", 0, 2},
                              {"shape", "shape", 0, 6},
                              {"path", "path", 0, 7},
                              {"float32_forward_ms", "f32 fwd ms", 1, 20},
                              {"bfloat16_forward_ms", "bf16 fwd ms", 1, 20},
                              {"forward_speedup", "fwd x", 2, 5},
                              {"float32_forward_backward_ms", "f32 f+b ms", 1, 20},
                              {"bfloat16_forward_backward_ms", "bf16 f+b ms", 1, 20},
                              {"forward_backward_speedup", "f+b x", 2, 5},
                              {"dnnl_speedup", "dnnl x", 2, 6},
                              {"float32_peak_mib", "f32 peak", 1, 8},
                              {"bfloat16_peak_mib", "bf16 peak", 1, 9}});
  const std::vector<Case> cases = options.quick ? std::vector<Case>{{"small", 2, 64, 64, 4}}
                                                : std::vector<Case>{{"large", 4, 512, 512, 8}, {"long", 1, 2048, 256, 4}};
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    for (const Case& c : cases) {
      tg::MultiHeadAttention layer({.query_dim = c.e, .heads = c.h, .seed = 1});
      const Tensor x = tg::randn({c.b, c.q, c.e}, 2);
      Products raw32(c, false), raw16(c, true);
      for (bool weights : {true, false}) {
        const auto fwd = [&](tg::MatmulPrecision p) {
          return [&, p] {
            tg::MatmulPrecisionGuard guard(p);
            tg::NoGradGuard no_grad;
            layer.forward(x, {.masking = {.causal = true}, .need_weights = weights});
          };
        };
        const auto fwd_bwd = [&](tg::MatmulPrecision p) {
          return [&, p] {
            tg::MatmulPrecisionGuard guard(p);
            layer.zero_grad();
            const Tensor out = layer.forward(x, {.masking = {.causal = true}, .need_weights = weights}).output;
            tg::backward({out}, {tg::ones_like(out)});
            tg::clear_tape();
          };
        };
        const auto exact = tg::MatmulPrecision::exact, bf16 = tg::MatmulPrecision::bfloat16;
        const double peak32 = peak_mib_of(fwd_bwd(exact)), peak16 = peak_mib_of(fwd_bwd(bf16));
        const auto raw = measure({[&] { raw32.run(); }, [&] { raw16.run(); }}, options.runs, options.seconds);
        after_references();
        const auto mine = measure({fwd(exact), fwd(bf16), fwd_bwd(exact), fwd_bwd(bf16)}, options.runs, options.seconds);
        const Stats t[] = {mine[0], mine[1], mine[2], mine[3], raw[0], raw[1]};
        table.add({static_cast<std::int64_t>(threads), std::string(c.name), std::string(weights ? "weights" : "fused"), t[0], t[1],
                   t[0].median / t[1].median, t[2], t[3], t[2].median / t[3].median, t[4].median / t[5].median, peak32, peak16});
      }
    }
  }
  // Accuracy of the first shape's output (weights path), float32 and bfloat16, against float64.
  const Case& c = cases.front();
  auto& error = report.table("bf16_error", fmt::format("{} shape's output against float64 (weights path, causal)", c.name),
                             {{"precision", "precision", 0, 9}, {"relative_error", "rel. 2-norm error", -2, 17}, {"max_abs_error", "max abs", -2, 9}});
  tg::set_num_threads(options.threads.front());
  tg::MultiHeadAttention l64({.query_dim = c.e, .heads = c.h, .dtype = tg::float64, .seed = 1});
  tg::MultiHeadAttention l32({.query_dim = c.e, .heads = c.h, .seed = 1});
  const Tensor x64 = tg::randn({c.b, c.q, c.e}, 2, tg::float64);
  tg::NoGradGuard no_grad;
  const auto want = l64.forward(x64, {.masking = {.causal = true}}).output.to_vector<double>();
  for (bool bf16 : {false, true}) {
    tg::MatmulPrecisionGuard guard(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
    const auto got = l32.forward(x64.to(tg::float32), {.masking = {.causal = true}, .need_weights = true}).output.to_vector<double>();
    double num = 0, den = 0, worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double d = got[i] - want[i];
      num += d * d;
      den += want[i] * want[i];
      worst = std::max(worst, std::abs(d));
    }
    error.add({std::string(bf16 ? "bfloat16" : "float32"), std::sqrt(num / den), worst});
  }
}

}  // namespace bench
