// The GPT-2-shaped step's products, and its chain limit: what oneDNN's own products cost where a
// step finds their operands. The hot limit times each product on operands it has just used; a
// step never reads its weights that way, since the update streams every weight, gradient and
// moment (2.6 GB in float32) through the caches between one use of a weight and the next. The
// cold limit is the other extreme: every operand in memory, activations too, which a step has
// just written. The chain runs the step's products in the step's order on the step's buffers
// (each weight, weight gradient and saved activation its own; each product's output an operand
// of the next ones, as in a step; the ops between them left out) after a pass that evicts them.
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "gpt2_shape.hpp"
#include "raw_dnnl.hpp"
#include "report.hpp"
#include "runtime/parallel.hpp"

namespace bench {

std::vector<Product> step_products(const Gpt2& s) {
  const std::int64_t rows = s.b * s.t, c = s.dim, bh = s.b * s.heads, d = s.dim / s.heads;
  std::vector<Product> all;
  auto linear = [&](std::int64_t k, std::int64_t n, std::int64_t count) {
    all.push_back({1, rows, k, n, false, false, count});
    all.push_back({1, rows, n, k, false, true, count});
    all.push_back({1, k, rows, n, true, false, count});
  };
  linear(c, c, 4 * s.layers);  // q, k, v, out
  linear(c, 4 * c, s.layers);
  linear(4 * c, c, s.layers);
  linear(c, s.vocab, 1);
  all.push_back({bh, s.t, d, s.t, false, true, 2 * s.layers});  // S, dA
  all.push_back({bh, s.t, s.t, d, false, false, 2 * s.layers});  // O, dq
  all.push_back({bh, s.t, s.t, d, true, false, 2 * s.layers});  // dv, dk
  return all;
}

namespace {

// oneDNN primitives run on named buffers. Every buffer holds zeros: the bits do not matter to
// the time, only where they are.
class Chain {
 public:
  explicit Chain(bool bf16) : bf16_(bf16) { omp_set_num_threads(tapegrad::num_threads()); }

  // [batch] m x k @ k x n into c; a is stored [k, m] per batch when ta, b [n, k] when tb.
  void product(std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n, bool ta, bool tb, const std::string& a,
               const std::string& b, const std::string& c) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt in = bf16_ ? dt::bf16 : dt::f32;
    const dnnl::memory::desc da({batch, m, k}, in, ta ? tag::acb : tag::abc), db({batch, k, n}, in, tb ? tag::acb : tag::abc),
        dc({batch, m, n}, dt::f32, tag::abc);
    const auto key = std::tuple{batch, m, k, n, ta, tb};
    auto it = prims_.find(key);
    if (it == prims_.end()) it = prims_.emplace(key, dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(da, db, dc), engine_))).first;
    steps_.push_back({&it->second, dnnl::memory(da, engine_, operand(a, batch * m * k)), dnnl::memory(db, engine_, operand(b, batch * k * n)),
                      dnnl::memory(dc, engine_, floats(c, batch * m * n))});
  }

  double run() {
    omp_set_num_threads(tapegrad::num_threads());
    const auto t0 = clock_type::now();
    for (auto& s : steps_) s.prim->execute(stream_, {{DNNL_ARG_SRC, s.a}, {DNNL_ARG_WEIGHTS, s.b}, {DNNL_ARG_DST, s.c}});
    stream_.wait();
    return since(t0);
  }
  std::int64_t size() const { return static_cast<std::int64_t>(steps_.size()); }

 private:
  struct Step {
    dnnl::matmul* prim;
    dnnl::memory a, b, c;
  };

  // In bfloat16 a weight (named W...) is read from its own bfloat16 copy, as tapegrad keeps one
  // per weight; an activation where the step wrote it (its float32 buffer's first half).
  void* operand(const std::string& name, std::int64_t count) {
    if (!bf16_ || name[0] != 'W') return floats(name, bf16_ ? (count + 1) / 2 : count);
    auto& buf = halves_[name];
    if (buf.empty()) buf.assign(static_cast<std::size_t>(count), 0);
    if (static_cast<std::int64_t>(buf.size()) < count) throw std::logic_error(fmt::format("chain: buffer {} is too small", name));
    return buf.data();
  }
  void* floats(const std::string& name, std::int64_t count) {
    auto& buf = floats_[name];
    if (buf.empty()) buf.assign(static_cast<std::size_t>(count), 0.0f);
    if (static_cast<std::int64_t>(buf.size()) < count) throw std::logic_error(fmt::format("chain: buffer {} is too small", name));
    return buf.data();
  }

  bool bf16_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool>, dnnl::matmul> prims_;
  std::map<std::string, std::vector<float>> floats_;
  std::map<std::string, std::vector<std::uint16_t>> halves_;
  std::vector<Step> steps_;
};

// The step's products in its order. Where an op stands between two products (a LayerNorm, GELU,
// the softmax, a residual sum), its output is taken at its input's place, which the step has
// just written too.
void add_step(Chain& chain, const Gpt2& s) {
  const std::int64_t rows = s.b * s.t, c = s.dim, f = 4 * s.dim, bh = s.b * s.heads, t = s.t, d = s.dim / s.heads;
  auto at = [](const char* name, std::int64_t layer) { return fmt::format("{}.{}", name, layer); };
  std::vector<std::string> block_in;  // each block's first LayerNorm output, which its q, k, v read
  std::string x = "embedded";
  for (std::int64_t l = 0; l < s.layers; ++l) {
    block_in.push_back(x);
    for (const char* p : {"q", "k", "v"}) chain.product(1, rows, c, c, false, false, x, at(fmt::format("W{}", p).c_str(), l), at(p, l));
    chain.product(bh, t, d, t, false, true, at("q", l), at("k", l), at("S", l));  // the softmax's A at S's place
    chain.product(bh, t, t, d, false, false, at("S", l), at("v", l), at("O", l));
    chain.product(1, rows, c, c, false, false, at("O", l), at("Wo", l), at("attn", l));  // the second LayerNorm's output here
    chain.product(1, rows, c, f, false, false, at("attn", l), at("W1", l), at("h", l));  // GELU's output at h's place
    chain.product(1, rows, f, c, false, false, at("h", l), at("W2", l), at("mlp", l));
    x = at("mlp", l);
  }
  chain.product(1, rows, c, s.vocab, false, false, x, "Whead", "logits");
  // Backward: cross-entropy's gradient at the logits' place.
  chain.product(1, rows, s.vocab, c, false, true, "logits", "Whead", "dx");
  chain.product(1, c, rows, s.vocab, true, false, x, "logits", "dWhead");
  std::string g = "dx";
  for (std::int64_t l = s.layers - 1; l >= 0; --l) {
    chain.product(1, rows, c, f, false, true, g, at("W2", l), at("dh", l));  // GELU's gradient at its place
    chain.product(1, f, rows, c, true, false, at("h", l), g, at("dW2", l));
    chain.product(1, rows, f, c, false, true, at("dh", l), at("W1", l), at("dattn", l));
    chain.product(1, c, rows, f, true, false, at("attn", l), at("dh", l), at("dW1", l));
    chain.product(1, rows, c, c, false, true, at("dattn", l), at("Wo", l), at("dO", l));
    chain.product(1, c, rows, c, true, false, at("O", l), at("dattn", l), at("dWo", l));
    chain.product(bh, t, t, d, true, false, at("S", l), at("dO", l), at("dv", l));
    chain.product(bh, t, d, t, false, true, at("dO", l), at("v", l), at("dS", l));  // the softmax's gradient at its place
    chain.product(bh, t, t, d, false, false, at("dS", l), at("k", l), at("dq", l));
    chain.product(bh, t, t, d, true, false, at("dS", l), at("q", l), at("dk", l));
    for (const char* p : {"q", "k", "v"}) {
      const std::string dp = fmt::format("d{}", p);
      chain.product(1, rows, c, c, false, true, at(dp.c_str(), l), at(fmt::format("W{}", p).c_str(), l), at(fmt::format("dx{}", p).c_str(), l));
      chain.product(1, c, rows, c, true, false, block_in[static_cast<std::size_t>(l)], at(dp.c_str(), l), at(fmt::format("dW{}", p).c_str(), l));
    }
    g = at("dxq", l);  // the three summed, with the residual's, at the first one's place
  }
}

}  // namespace

void evict_caches(bool quick) {
  // Kept between calls, so that the writes are not dead stores to a buffer about to be freed.
  static std::vector<float> flush;
  flush.resize(quick ? std::size_t{1} << 18 : std::size_t{64} << 20, 1.0f);
  for (float& v : flush) v *= 1.0001f;
}

double chain_limit(const Gpt2& s, bool bf16, bool quick) {
  Chain chain(bf16);
  add_step(chain, s);
  std::int64_t expected = 0;
  for (const Product& p : step_products(s)) expected += p.count;
  if (chain.size() != expected) throw std::logic_error(fmt::format("chain: {} products, step_products counts {}", chain.size(), expected));
  chain.run();  // first touches and oneDNN's first-run costs
  std::vector<double> times;
  for (int pass = 0; pass < (quick ? 1 : 3); ++pass) {
    evict_caches(quick);
    times.push_back(chain.run());
  }
  after_references();
  return stats_of(times).median;
}

UpdateStreams::UpdateStreams(std::int64_t parameters)
    : p_(static_cast<std::size_t>(parameters), 1.0f), g_(p_.size(), 1e-3f), m_(p_.size(), 0.0f), v_(p_.size(), 0.0f) {}

double UpdateStreams::operator()() {
  float *p = p_.data(), *m = m_.data(), *v = v_.data();
  const float* g = g_.data();
  const auto t0 = clock_type::now();
  tapegrad::detail::parallel_for(static_cast<std::int64_t>(p_.size()), 1, [=](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      m[i] += g[i];
      v[i] += g[i];
      p[i] += m[i] - v[i];
    }
  });
  asm volatile("" : : "r"(p), "r"(m), "r"(v) : "memory");  // the stores must happen
  return since(t0);
}

}  // namespace bench
