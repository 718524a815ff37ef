// libFuzzer target for the MultiHeadAttention layer: its config and its KV cache; and integers at
// the ends of int64 wherever a layer or the training stack takes one (see integers()).
//
// Config: every field from negative through zero to INT64_MAX. An oracle written here from the
// documented rules (header and docs/api.md) says whether the constructor must throw (a ValueError,
// or a DTypeError for the dtype); a layer that builds must run forward and backward on a small
// input with finite results of the right shapes and Xavier-bounded weights. Layers whose weights
// would need much memory are not built.
//
// KV cache: a sequence of decode steps (1-3 new positions, masks and bias that cover the cached
// length or not, NaN tokens now and then), clear(), copies (constructed and assigned, self
// included), moves and batch-size changes over three caches. Each cache is shadowed by the
// positions it must hold; every decode must equal the layer's full causal forward over the
// shadow plus the new positions (or fail exactly when it fails), a cache that holds positions
// must refuse another batch size, and a failed decode must leave the cache as it was. A shadow
// is a value, so decoding on a copy that shared the original's buffers would show up as a
// mismatch on the next decode of the original.
#include <limits>
#include <optional>

#include "fuzz_support.hpp"

namespace {
using namespace fuzz;

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 48;
constexpr std::int64_t kMaxWeights = std::int64_t{1} << 14;  // elements of all four weights, to build a layer

bool allocatable(std::int64_t rows, std::int64_t cols, tg::DType dtype) {
  if (rows < 0 || cols < 0) return false;
  const __int128 row_bytes = static_cast<__int128>(tg::itemsize(dtype)) * std::max<std::int64_t>(rows, 1);
  return row_bytes <= kMaxBytes && row_bytes * std::max<std::int64_t>(cols, 1) <= kMaxBytes;
}

// What the constructor must do with a config: throw (which error, naming which field) or build
// a layer with these resolved sizes.
struct Expected {
  const char* error = nullptr;  // "ValueError" or "DTypeError"; null when the layer builds
  const char* field = "";
  tg::MultiHeadAttentionConfig resolved{};
  std::int64_t weight_elements = 0;  // meaningful when it builds
};

Expected resolve(tg::MultiHeadAttentionConfig c) {
  auto value_error = [](const char* field) { return Expected{"ValueError", field}; };
  if (c.query_dim < 1) return value_error("config.query_dim");
  if (c.heads < 1) return value_error("config.heads");
  if (c.context_dim < 0) return value_error("config.context_dim");
  if (c.head_dim < 0) return value_error("config.head_dim");
  if (c.value_head_dim < 0) return value_error("config.value_head_dim");
  if (c.out_dim < 0) return value_error("config.out_dim");
  if (!tg::is_floating(c.dtype)) return {"DTypeError", "config.dtype"};
  if (c.context_dim == 0) c.context_dim = c.query_dim;
  if (c.head_dim == 0) {
    if (c.query_dim % c.heads != 0) return value_error("config.heads");
    c.head_dim = c.query_dim / c.heads;
  }
  if (c.value_head_dim == 0) c.value_head_dim = c.head_dim;
  if (c.out_dim == 0) c.out_dim = c.query_dim;
  std::int64_t hd = 0, hdv = 0;
  if (__builtin_mul_overflow(c.heads, c.head_dim, &hd)) return value_error("config.head_dim");
  if (__builtin_mul_overflow(c.heads, c.value_head_dim, &hdv)) return value_error("config.value_head_dim");
  if (!allocatable(c.query_dim, hd, c.dtype)) return value_error("'w_q'");
  if (!allocatable(c.context_dim, hd, c.dtype)) return value_error("'w_k'");
  if (!allocatable(c.context_dim, hdv, c.dtype)) return value_error("'w_v'");
  if (!allocatable(hdv, c.out_dim, c.dtype)) return value_error("'w_o'");
  const __int128 n = static_cast<__int128>(c.query_dim) * hd + static_cast<__int128>(c.context_dim) * (hd + hdv) +
                     static_cast<__int128>(hdv) * c.out_dim;
  return {nullptr, "", c, n > kMaxWeights ? kMax : static_cast<std::int64_t>(n)};
}

void require_finite(const Tensor& t, const char* what) {
  for (double v : values(t))
    if (!std::isfinite(v)) fail("{} is not finite: {}", what, tg::to_string(t));
}

// |a - b| within the tolerance of the dtype, NaN matching NaN and an infinity itself.
void require_close(const Tensor& got, const Tensor& want, const char* what) {
  require(got.shape() == want.shape(), "{}: shape {} differs from the reference's {}", what, got.shape(), want.shape());
  const double tol = got.dtype() == tg::float32 ? 1e-4 : 1e-10;
  const auto g = values(got), w = values(want);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const bool ok = std::isfinite(w[i]) ? std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])) : same_values({g[i]}, {w[i]});
    if (!ok) fail("{}: element {} is {}, the full forward gives {}\ngot {}\nwant {}", what, i, g[i], w[i], tg::to_string(got), tg::to_string(want));
  }
}

struct Fuzzer {
  Input& in;

  std::int64_t field() {
    static constexpr std::int64_t kOdd[] = {-1, -7, std::numeric_limits<std::int64_t>::min(), std::int64_t{1} << 20,
                                            std::int64_t{1} << 31, std::int64_t{1} << 40, std::int64_t{1} << 46,
                                            std::int64_t{3} << 61, kMax};
    return in.in(0, 3) == 0 ? in.pick(kOdd) : in.in<std::int64_t>(0, 9);
  }

  // ---- Config -------------------------------------------------------------------------------

  void config() {
    static constexpr tg::DType kDtypes[] = {tg::float32, tg::float64, tg::int64, tg::bool_};
    // kv_heads, the window, ALiBi and rotary keep their defaults (test_attention_variants covers them).
    tg::MultiHeadAttentionConfig c{.query_dim = field(), .heads = field(), .context_dim = field(), .head_dim = field(),
                                   .value_head_dim = field(), .out_dim = field(), .bias = in.flag(), .dtype = in.pick(kDtypes),
                                   .seed = in.in<std::uint64_t>(0, 3)};
    const Expected e = resolve(c);
    narrate("config query_dim {} heads {} context_dim {} head_dim {} value_head_dim {} out_dim {} bias {} {}: {} {}", c.query_dim, c.heads,
            c.context_dim, c.head_dim, c.value_head_dim, c.out_dim, c.bias, c.dtype, e.error ? e.error : "builds", e.field);
    if (e.error) {
      const std::string msg = std::string(e.error) == "DTypeError"
                                  ? expect_error<tg::DTypeError>("MultiHeadAttention", [&] { tg::MultiHeadAttention layer(c); })
                                  : expect_error<tg::ValueError>("MultiHeadAttention", [&] { tg::MultiHeadAttention layer(c); });
      require(msg.find("MultiHeadAttention") != std::string::npos && msg.find(e.field) != std::string::npos,
              "the constructor's error does not name the layer and {}: {}", e.field, msg);
      return;
    }
    if (e.weight_elements > kMaxWeights) return;  // valid, but too large to build here
    tg::MultiHeadAttention layer(c);
    const auto& r = e.resolved;
    require(layer.config().context_dim == r.context_dim && layer.config().head_dim == r.head_dim &&
                layer.config().value_head_dim == r.value_head_dim && layer.config().out_dim == r.out_dim,
            "the layer resolved its config differently");
    const auto params = layer.parameters();
    require(params.size() == (c.bias ? 8u : 4u), "the layer has {} parameters", params.size());
    for (std::size_t i = 0; i < 4; ++i) {  // Xavier-uniform: |w| <= sqrt(6 / (fan_in + fan_out))
      const double a = std::sqrt(6.0 / static_cast<double>(params[i].size(0) + params[i].size(1)));
      for (double v : values(params[i])) require(std::abs(v) <= a * (1 + 1e-6), "weight {} holds {} beyond +-{}", i, v, a);
    }
    const std::int64_t b = in.in(1, 2), q = in.in(1, 3), k = in.in(1, 3);
    if (static_cast<__int128>(b) * r.heads * q * k > (1 << 14)) return;  // the weights [B, H, Q, K]
    const Tensor x = in.tensor({b, q, r.query_dim}, r.dtype).set_requires_grad();
    const bool self = r.context_dim == r.query_dim && in.flag();
    const Tensor ctx = self ? x : in.tensor({b, k, r.context_dim}, r.dtype).set_requires_grad();
    auto [out, w] = layer.forward(x, ctx, {.masking = {.causal = in.flag()}, .need_weights = true});
    require(out.shape() == Shape{b, q, r.out_dim}, "output shape {}", out.shape());
    require(w.shape() == Shape{b, r.heads, q, ctx.size(1)}, "weights shape {}", w.shape());
    require_finite(out, "the output");
    tg::backward(tg::sum(out));
    for (std::size_t i = 0; i < params.size(); ++i) {
      require(params[i].grad().shape() == params[i].shape(), "gradient {} has shape {}", i, params[i].grad().shape());
      require_finite(params[i].grad(), "a parameter's gradient");
    }
    require_finite(x.grad(), "the query's gradient");
  }

  // ---- KV cache -----------------------------------------------------------------------------

  struct Shadow {
    std::vector<Tensor> steps;  // the positions the cache must hold, as decoded
    std::int64_t length = 0, batch = 0;
  };

  // A mask or bias for n new queries over k keys (or a wrong size, now and then).
  Tensor mask(Shape s) {
    if (in.in(0, 7) == 0) s.back() = std::max<std::int64_t>(s.back() - in.in<std::int64_t>(1, 2), 1);
    return in.mask(s);
  }

  tg::MhaCall call(std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t k, tg::DType dtype) {
    tg::MhaCall c;
    if (in.flag()) c.masking.key_mask = mask({b, k});
    if (in.flag()) c.masking.query_mask = mask({b, n});
    if (in.in(0, 3) == 0) c.masking.mask = mask(in.flag() ? Shape{n, k} : Shape{b, h, n, k});
    if (in.in(0, 3) == 0) {
      Shape s = in.flag() ? Shape{1, h, 1, k} : Shape{b, h, n, k};
      if (in.in(0, 7) == 0) s.back() += 1;
      c.bias = in.tensor(s, dtype);
      if (in.flag() && c.bias.numel() > 0) {  // -inf entries mask too
        Tensor cut = tg::full(s, -INFINITY, dtype);
        c.bias = tg::where(in.mask(s), c.bias, cut);
      }
    }
    c.need_weights = in.flag();
    return c;
  }

  void kv_cache() {
    const std::int64_t heads = in.in(1, 3);
    tg::MultiHeadAttentionConfig c{.query_dim = heads * in.in(1, 2), .heads = heads, .context_dim = in.in(0, 7) == 0 ? in.in(1, 4) : 0,
                                   .head_dim = in.in(0, 2), .value_head_dim = in.in(0, 3), .out_dim = in.in(0, 3), .bias = in.flag(),
                                   .dtype = in.float_dtype(), .seed = in.in<std::uint64_t>(0, 9)};
    const tg::MultiHeadAttention layer(c);
    const auto& r = layer.config();
    const bool self = r.context_dim == r.query_dim;
    std::vector<tg::KVCache> caches(3);
    std::vector<Shadow> shadows(3);
    auto slot = [&] { return in.in<std::size_t>(0, 2); };
    const int commands = in.in(1, 12);
    for (int step = 0; step < commands; ++step) {
      const int what = in.in(0, 9);
      const std::size_t i = slot(), j = slot();
      narrate("cache command {} on {} (length {}) and {} (length {})", what, i, shadows[i].length, j, shadows[j].length);
      switch (what) {
        case 0:
          caches[i].clear();
          shadows[i] = {};
          break;
        case 1:
          caches[j] = caches[i];  // self-assignment included
          shadows[j] = shadows[i];
          break;
        case 2: {
          tg::KVCache copy(caches[i]);
          caches[j] = std::move(copy);
          shadows[j] = shadows[i];
          require(copy.length() == 0 && copy.capacity() == 0, "a moved-from cache still holds {} positions", copy.length());
          break;
        }
        case 3:
          caches[j] = std::move(caches[i]);  // self-move included: a no-op
          if (i != j) {
            shadows[j] = shadows[i];
            shadows[i] = {};
            require(caches[i].length() == 0 && caches[i].capacity() == 0, "a moved-from cache still holds {} positions", caches[i].length());
          }
          break;
        default: decode(layer, caches[i], shadows[i], self);
      }
      for (std::size_t s = 0; s < caches.size(); ++s)
        require(caches[s].length() == shadows[s].length && caches[s].capacity() >= caches[s].length(),
                "cache {} has length {} (capacity {}), expected {}", s, caches[s].length(), caches[s].capacity(), shadows[s].length);
    }
  }

  void decode(const tg::MultiHeadAttention& layer, tg::KVCache& cache, Shadow& shadow, bool self) {
    const auto& r = layer.config();
    const std::int64_t b = shadow.length > 0 && in.in(0, 7) != 0 ? shadow.batch : in.in(1, 3), n = in.in(1, 3);
    const std::int64_t k = shadow.length + n;
    Tensor x = in.tensor({b, n, r.query_dim}, r.dtype);
    if (in.in(0, 7) == 0) {  // a NaN token: changes only the outputs of queries that attend to it
      std::vector<double> v = values(x);
      v[in.in<std::size_t>(0, v.size() - 1)] = NAN;
      x = tg::from_vector(v, x.shape()).to(r.dtype);
    }
    const tg::MhaCall call = this->call(b, r.heads, n, k, r.dtype);
    const std::int64_t before = cache.length();
    if (!self) {
      expect_error<tg::ValueError>("decode with context_dim != query_dim", [&] { layer.decode(x, cache, call); });
      return require(cache.length() == before, "a refused decode changed the cache");
    }
    if (shadow.length > 0 && b != shadow.batch) {
      expect_error<tg::ShapeError>("decode of another batch size", [&] { layer.decode(x, cache, call); });
      return require(cache.length() == before, "a refused decode changed the cache");
    }
    // The reference: the full causal forward of the new queries over every position.
    std::vector<Tensor> all = shadow.steps;
    all.push_back(x);
    tg::MhaCall full = call;
    full.masking.causal = true;
    full.masking.causal_offset = shadow.length;
    std::optional<tg::AttentionResult> want;
    try {
      tg::NoGradGuard off;
      want = layer.forward(x, tg::concat(all, 1), full);
    } catch (const tg::Error& e) {
      narrate("the reference forward fails: {}", e.what());
    }
    if (!want) {
      expect_error<tg::Error>("decode where the full forward fails", [&] { layer.decode(x, cache, call); });
      return require(cache.length() == before, "a failed decode changed the cache");
    }
    tg::AttentionResult got;
    try {
      got = layer.decode(x, cache, call);
    } catch (const tg::Error& e) {
      fail("decode failed where the full forward succeeds: {}", e.what());
    }
    require(!got.output.requires_grad(), "decode recorded on the tape");
    require_close(got.output, want->output, "decode's output");
    require(got.weights.defined() == call.need_weights, "decode returned weights {} with need_weights {}", got.weights.defined(), call.need_weights);
    if (call.need_weights) require_close(got.weights, want->weights, "decode's weights");
    shadow.steps.push_back(x);
    shadow.length += n;
    shadow.batch = b;
  }

  // ---- Integers at the extremes, wherever the layers and the training stack take one ----
  // Each call gets a value from the ends of int64 (or a small one) for an offset, a length, a
  // count or a step, and must either return what a small oracle says or throw a tapegrad error:
  // under UndefinedBehaviorSanitizer an overflow anywhere on the way is a finding.

  std::int64_t extreme() {
    static constexpr std::int64_t kEnds[] = {std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::min() + 1,
                                             -(std::int64_t{1} << 62), -1, 0, 1, 2, 7, std::int64_t{1} << 31, std::int64_t{1} << 62,
                                             kMax - 1, kMax};
    return in.flag() ? in.pick(kEnds) : in.in<std::int64_t>(-9, 9);
  }

  void integers() {
    switch (in.in(0, 4)) {
      case 0: {  // a position offset: rows offset .. offset + T - 1 of an 8-row table
        const tg::LearnedPositions pos({.max_len = 8, .dim = 2, .dtype = tg::float64, .seed = 1});
        const std::int64_t t = in.in(0, 3), offset = extreme();
        const bool fits = offset >= 0 && offset <= 8 && t <= 8 - offset;
        narrate("positions T {} offset {}: {}", t, offset, fits ? "fits" : "refused");
        const Tensor x = tg::zeros({1, t, 2}, tg::float64);
        if (!fits) return (void)expect_error<tg::ShapeError>("positions out of the table", [&] { pos.forward(x, offset); });
        require(same_values(values(pos.forward(x, offset)), values(tg::slice(pos.table, 0, offset, offset + t))), "positions: wrong rows");
        return;
      }
      case 1: {  // causal_mask with any offset against j <= i + offset in 128 bits
        const std::int64_t q = in.in(0, 4), k = in.in(0, 4), offset = extreme();
        const auto m = tg::causal_mask(q, k, offset).to_vector<bool>();
        for (std::int64_t i = 0; i < q; ++i)
          for (std::int64_t j = 0; j < k; ++j)
            require(m[static_cast<std::size_t>(i * k + j)] == (static_cast<__int128>(j) <= static_cast<__int128>(i) + offset),
                    "causal_mask({}, {}, {}) wrong at ({}, {})", q, k, offset, i, j);
        return;
      }
      case 2: {  // a warm-up + cosine schedule, then a step
        const std::int64_t warmup = extreme(), total = extreme(), step = extreme();
        if (warmup < 0 || total < warmup) return (void)expect_error<tg::ValueError>("WarmupCosine", [&] { tg::WarmupCosine(1.0, warmup, total); });
        const tg::WarmupCosine schedule(1.0, warmup, total, 0.1);
        if (step < 0) return (void)expect_error<tg::ValueError>("WarmupCosine step", [&] { schedule(step); });
        const double lr = schedule(step);
        require(std::isfinite(lr) && lr >= 0 && lr <= 1.0 + 1e-12, "WarmupCosine({}, {})({}) = {}", warmup, total, step, lr);
        return;
      }
      case 3: {  // an optimizer's step count from load_state, then a step
        Tensor w = tg::ones({2}, tg::float64).set_requires_grad();
        tg::AdamW opt({{"w", w}});
        const std::int64_t steps = extreme();
        if (steps < 0) return (void)expect_error<tg::ValueError>("load_state", [&] { opt.load_state(opt.state(), steps); });
        opt.load_state(opt.state(), steps);
        tg::backward(tg::sum(w * w));
        if (steps == kMax) return (void)expect_error<tg::ValueError>("a step past the largest count", [&] { opt.step(); });
        opt.step();
        require(opt.steps() == steps + 1, "steps() {} after one step from {}", opt.steps(), steps);
        return;
      }
      default: {  // generation lengths, top_k and windows
        tg::Decoder model({.vocab = 5, .max_len = 6, .dim = 2, .heads = 1, .seed = 2});
        model.eval();
        const Tensor prompt = tg::tensor({{1, 2}}, tg::int64);
        const tg::GenerateOptions o{.new_tokens = extreme(), .temperature = in.flag() ? 0.0 : 1.0, .top_k = extreme(), .restart_after = extreme()};
        narrate("generate new_tokens {} top_k {} restart_after {}", o.new_tokens, o.top_k, o.restart_after);
        // Long runs are valid but slow: only the short ones run, the rest must fail before a step.
        const bool valid_window = o.restart_after == 0 || (o.restart_after >= 3 && o.restart_after <= 6);
        const bool fits = o.new_tokens >= 0 && o.top_k >= 0 && valid_window && (o.restart_after > 0 || o.new_tokens <= 4);
        if (fits && o.new_tokens > 16) return;
        if (!fits) {
          const bool quick_refusal = o.new_tokens < 0 || o.top_k < 0 || !valid_window || o.new_tokens > kMax - 2 || o.restart_after == 0;
          if (quick_refusal) expect_error<tg::ValueError>("generate", [&] { model.generate(prompt, o); });
          return;
        }
        require(model.generate(prompt, o).size(1) == 2 + o.new_tokens, "generate returned the wrong length");
      }
    }
  }

  // The first byte: odd for the config, 0 for the KV cache (as the seeds were written when these
  // two were a flag), any other even value for the integers.
  void run() {
    const auto mode = in.in<std::uint8_t>(0, 255);
    if (mode % 2 == 1) config();
    else if (mode == 0) kv_cache();
    else integers();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return run_one(data, size, [](Input& in) { Fuzzer{in}.run(); });
}
