// Section "attention": the MultiHeadAttention layer on the weights path (need_weights, key
// padding + causal masks), float32, forward + backward through both outputs, on the attention
// issue's shapes. Roofline: every product of the forward timed as oneDNN's own float32
// primitive on that shape with the same threads, in rounds of its own just before the layer's
// (after_references says why); x3 for forward + backward. The forward's products, D = E / H:
//   q, k, v and output projections: [B*L, E] x [E, E]   (four of them)
//   scores:          B*H x [Q, D] x [D, K]
//   weighted sum:    B*H x [Q, K] x [K, D]
// GFLOP/s counts those products' flops (the causal mask's skipped half included); "%" = the
// roofline's time / tapegrad's.
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

struct Roofline {
  std::vector<std::unique_ptr<RawDnnl>> products;
  explicit Roofline(const Case& c) {
    const std::int64_t d = c.e / c.h;
    for (int i = 0; i < 4; ++i) products.push_back(std::make_unique<RawDnnl>(1, c.b * c.q, c.e, c.e));
    products.push_back(std::make_unique<RawDnnl>(c.b * c.h, c.q, d, c.q));
    products.push_back(std::make_unique<RawDnnl>(c.b * c.h, c.q, c.q, d));
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
        call{.masking = {.key_mask = key_padding(c), .causal = true}, .need_weights = true} {}
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

}  // namespace

void section_attention(Report& report, const Options& options) {
  auto& table = report.table("attention",
                             "multi-head attention (weights path), float32, key padding + causal, need_weights: ms median (min-max); "
                             "% = oneDNN roofline time / tapegrad's",
                             {{"threads", "th", 0, 2},
                              {"shape", "shape", 0, 6},
                              {"dims", "(B, Q=K, E, H)", 0, 17},
                              {"roofline_forward_ms", "roof fwd ms", 3, 26},
                              {"forward_ms", "fwd ms", 3, 26},
                              {"forward_gflops", "GFLOP/s", 1, 7},
                              {"forward_roofline_percent", "fwd %", 1, 6},
                              {"forward_backward_ms", "f+b ms", 3, 26},
                              {"forward_backward_gflops", "GFLOP/s", 1, 7},
                              {"forward_backward_roofline_percent", "f+b %", 1, 6},
                              {"peak_mib", "peak MiB", 1, 8}});
  std::vector<Case> cases = {{"toy", 1, 8, 16, 2}, {"small", 8, 64, 64, 4}, {"medium", 8, 128, 256, 8}, {"large", 4, 512, 512, 8},
                             {"long", 1, 2048, 256, 4}};
  if (options.quick) cases.resize(2);
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    for (const Case& c : cases) {
      Roofline roof(c);
      Step step(c);
      const double peak = peak_mib_of([&] { step.forward_backward(); });
      const Stats roof_t = measure([&] { roof.run(); }, options.runs, options.seconds);
      after_references();
      const auto mine = measure({[&] { step.forward(); }, [&] { step.forward_backward(); }}, options.runs, options.seconds);
      const Stats t[] = {roof_t, mine[0], mine[1]};
      const double flop = 8.0 * c.b * c.q * c.e * c.e + 4.0 * c.b * c.q * c.q * c.e;
      table.add({static_cast<std::int64_t>(threads), std::string(c.name), fmt::format("({}, {}, {}, {})", c.b, c.q, c.e, c.h), t[0], t[1],
                 per_second(flop, t[1]), 100 * t[0].median / t[1].median, t[2], per_second(3 * flop, t[2]),
                 100 * 3 * t[0].median / t[2].median, peak});
    }
  }
  table.note("peak MiB: tensor storage one forward + backward holds at its peak (memory_stats()), above what it held before");
}

}  // namespace bench
