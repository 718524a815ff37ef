// Every tensor a backward reads is declared saved, on every attention path and in every layer:
// a write into any tensor argument (q, k, v, the bias, each mask, ids, parameters, outputs)
// between forward and backward is refused with a GraphError or changes no gradient. And the
// check can fail: with the written tensor's declarations left out, each declared tensor's write
// changes a gradient instead (the op table's entries get the same two checks in test_op_graph).
#define BOOST_TEST_MODULE saved_tensors
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <functional>
#include <numeric>

#include "ops/attention_core.hpp"
#include "support.hpp"
#include "write_after_record.hpp"

namespace tg = tapegrad;
namespace bdata = boost::unit_test::data;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {

// A case: a name and a function that records it from scratch.
struct Case {
  std::string name;
  std::function<Recording()> record;
};
std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// Both checks on one case: no silent write, and each declaration needed.
void check_case(const Case& c) {
  for (const Write& w : write_after_record(c.record, 11, false)) {
    BOOST_CHECK_MESSAGE(w.outcome != Outcome::wrong, c.name << ": writing " << w.name << " after recording changed a gradient without an error");
    if (w.outcome == Outcome::caught)
      BOOST_CHECK_MESSAGE(w.message.find("modified in place") != std::string::npos, c.name << ": " << w.message);
  }
  for (const Write& w : write_after_record(c.record, 11, true)) {
    if (!w.declared) continue;
    BOOST_CHECK_MESSAGE(w.outcome == Outcome::wrong,
                        c.name << ": " << w.name << " is declared saved, but with the declaration left out its write changed no gradient");
  }
}

Tensor leaf(const Shape& s, std::uint64_t seed, tg::DType dtype, bool grad = true) {
  return tg::randn(s, seed, tg::float64).to(dtype).detach().set_requires_grad(grad);
}
Tensor bools(const Shape& s, std::uint64_t seed, double p_true) { return tg::lt(tg::rand(s, seed), tg::scalar(p_true)); }

// The attention paths, chosen as attention_core chooses them (small scores: the weights path,
// its bfloat16 form, the fused tiles) or called directly on small blocks (the pipelined weights
// path and the fused path on its blocks, which attention_core takes only for large scores).
enum class Path { weights, weights_bf16, tiles, tiles_bf16, blocks, blocks_bf16, fused_blocks, fused_blocks_bf16 };
struct PathCase {
  const char* name;
  Path path;
  tg::DType dtype;
  bool bias_grad;
};

Case attention_case(const PathCase& p) {
  return {p.name, [p] {
            const std::int64_t B = 2, H = 2, Q = 6, K = 7, D = 3, Dv = 2;
            Recording r;
            const Tensor q = leaf({B, H, Q, D}, 1, p.dtype), k = leaf({B, H, K, D}, 2, p.dtype), v = leaf({B, H, K, Dv}, 3, p.dtype);
            const Tensor bias = leaf({1, H, Q, K}, 4, p.dtype, p.bias_grad);
            tg::AttentionMasking mask{.mask = bools({B, 1, Q, K}, 5, 0.85), .key_mask = bools({B, K}, 6, 0.8), .query_mask = bools({B, Q}, 7, 0.85), .causal = true, .causal_offset = 1};
            const bool bf16 = p.path == Path::weights_bf16 || p.path == Path::tiles_bf16 || p.path == Path::blocks_bf16 ||
                              p.path == Path::fused_blocks_bf16;
            const tg::MatmulPrecisionGuard precision(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
            const bool weights = p.path == Path::weights || p.path == Path::weights_bf16 || p.path == Path::blocks ||
                                 p.path == Path::blocks_bf16;
            const tg::detail::AttentionArgs args{"attention", q, k, v, bias, weights};
            tg::AttentionResult out;
            if (p.path == Path::blocks || p.path == Path::blocks_bf16 || p.path == Path::fused_blocks || p.path == Path::fused_blocks_bf16) {
              out = tg::detail::attention_core(args, mask, weights ? tg::detail::AttentionPath::blocks : tg::detail::AttentionPath::fused_blocks, 4);
            } else {
              out = tg::detail::attention_core(args, mask);
            }
            r.outputs = {out.output, out.weights};
            r.grad_leaves = {q, k, v, bias};
            r.writable = {{"q", q}, {"k", k}, {"v", v}, {"bias", bias}, {"allowed", mask.mask}, {"key_mask", mask.key_mask},
                          {"query_mask", mask.query_mask}, {"output", out.output}};
            if (out.weights.defined()) r.writable.emplace_back("weights", out.weights);
            return r;
          }};
}

std::vector<Case> attention_cases() {
  const std::vector<PathCase> paths{
      {"weights float64", Path::weights, tg::float64, true},
      {"weights float32", Path::weights, tg::float32, true},
      {"weights bfloat16", Path::weights_bf16, tg::float32, true},
      {"fused tiles float64", Path::tiles, tg::float64, true},
      {"fused tiles float32", Path::tiles, tg::float32, true},
      {"fused tiles bfloat16", Path::tiles_bf16, tg::float32, true},
      {"pipelined weights", Path::blocks, tg::float32, true},
      {"pipelined weights bfloat16", Path::blocks_bf16, tg::float32, true},
      {"fused blocks, constant bias", Path::fused_blocks, tg::float32, false},
      {"fused blocks, learned bias", Path::fused_blocks, tg::float32, true},
      {"fused blocks bfloat16", Path::fused_blocks_bf16, tg::float32, false},
  };
  std::vector<Case> out;
  for (const PathCase& p : paths) out.push_back(attention_case(p));
  return out;
}

// A layer's case: its inputs (floating ones get gradients), its parameters and its outputs.
Recording layer_recording(tg::Module& m, std::vector<std::pair<std::string, Tensor>> inputs, std::vector<Tensor> outputs) {
  Recording r;
  r.outputs = std::move(outputs);
  for (const auto& [name, t] : inputs) {
    r.writable.emplace_back(name, t);
    if (t.requires_grad()) r.grad_leaves.push_back(t);
  }
  for (const auto& [name, p] : m.named_parameters()) {
    r.writable.emplace_back(name, p);
    r.grad_leaves.push_back(p);
  }
  for (std::size_t k = 0; k < r.outputs.size(); ++k) r.writable.emplace_back(fmt::format("output {}", k), r.outputs[k]);
  return r;
}

Tensor ids(const Shape& s, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int64_t> v;
  tg::Generator gen(seed);
  for (std::int64_t i = 0, n = std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>()); i < n; ++i) v.push_back(static_cast<std::int64_t>(gen.uniform() * static_cast<double>(vocab)));
  return tg::from_vector(v, s);
}

std::vector<Case> layer_cases() {
  const tg::DType f64 = tg::float64;
  std::vector<Case> out;
  out.push_back({"Linear", [=] {
                   tg::Linear m({.in = 3, .out = 4, .dtype = f64, .seed = 1});
                   const Tensor x = leaf({2, 3}, 2, f64);
                   return layer_recording(m, {{"x", x}}, {m.forward(x)});
                 }});
  out.push_back({"Embedding", [=] {
                   tg::Embedding m({.vocab = 5, .dim = 3, .dtype = f64, .seed = 1});
                   const Tensor i = ids({2, 4}, 5, 2);
                   return layer_recording(m, {{"ids", i}}, {m.forward(i)});
                 }});
  out.push_back({"LayerNorm", [=] {
                   tg::LayerNorm m({.dim = 4, .dtype = f64});
                   const Tensor x = leaf({3, 4}, 2, f64);
                   return layer_recording(m, {{"x", x}}, {m.forward(x)});
                 }});
  for (auto act : {tg::Activation::gelu, tg::Activation::relu})
    for (tg::DType dtype : {tg::float32, tg::float64})
      out.push_back({fmt::format("FeedForward {} {}", act == tg::Activation::gelu ? "gelu" : "relu", dtype), [=] {
                       tg::FeedForward m({.dim = 3, .hidden = 5, .activation = act, .dtype = dtype, .seed = 1});
                       const Tensor x = leaf({2, 2, 3}, 2, dtype);
                       return layer_recording(m, {{"x", x}}, {m.forward(x)});
                     }});
  out.push_back({"LearnedPositions", [=] {
                   tg::LearnedPositions m({.max_len = 6, .dim = 3, .dtype = f64, .seed = 1});
                   const Tensor x = leaf({2, 4, 3}, 2, f64);
                   return layer_recording(m, {{"x", x}}, {m.forward(x, 1)});
                 }});
  for (bool need_weights : {false, true})
    for (tg::DType dtype : {tg::float32, tg::float64})
      out.push_back({fmt::format("MultiHeadAttention need_weights={} {}", need_weights, dtype), [=] {
                       tg::MultiHeadAttention m({.query_dim = 4, .heads = 2, .context_dim = 3, .dtype = dtype, .seed = 1});
                       const Tensor x = leaf({2, 5, 4}, 2, dtype), c = leaf({2, 6, 3}, 3, dtype), bias = leaf({2, 1, 5, 6}, 4, dtype);
                       const tg::MhaMasks masks{.key_mask = bools({2, 6}, 5, 0.8), .query_mask = bools({2, 5}, 6, 0.85),
                                                .attention_mask = bools({1, 2, 5, 6}, 7, 0.85)};
                       auto [o, w] = m.forward(x, c, {.masking = {.mask = masks.attention_mask, .key_mask = masks.key_mask, .query_mask = masks.query_mask, .causal = true, .causal_offset = 1},
                                                          .bias = bias,
                                                          .need_weights = need_weights});
                       return layer_recording(m,
                                              {{"query", x}, {"context", c}, {"bias", bias}, {"key_mask", masks.key_mask},
                                               {"query_mask", masks.query_mask}, {"attention_mask", masks.attention_mask}},
                                              {o, w});
                     }});
  out.push_back({"TransformerBlock with a key mask", [=] {
                   tg::TransformerBlock m({.dim = 4, .heads = 2, .hidden = 6, .dtype = f64, .seed = 1});
                   const Tensor x = leaf({2, 5, 4}, 2, f64), keys = bools({2, 5}, 3, 0.8);
                   return layer_recording(m, {{"x", x}, {"key_mask", keys}}, {m.forward(x, keys)});
                 }});
  out.push_back({"Decoder and its loss", [=] {
                   tg::Decoder m({.vocab = 7, .max_len = 6, .dim = 4, .heads = 2, .layers = 2, .hidden = 6, .dtype = f64, .seed = 1});
                   const Tensor i = ids({2, 5}, 7, 2), targets = ids({2, 5}, 7, 3);
                   const Tensor logits = m.forward(i);
                   return layer_recording(m, {{"ids", i}, {"targets", targets}}, {tg::cross_entropy(logits, targets), logits});
                 }});
  return out;
}

}  // namespace

BOOST_DATA_TEST_CASE(every_attention_path, bdata::make(attention_cases()), c) { check_case(c); }

BOOST_DATA_TEST_CASE(every_layer, bdata::make(layer_cases()), c) { check_case(c); }
