// Section "variants": what the attention variants of small language models cost and save.
// 1. Training-shaped calls: MultiHeadAttention float32 on the fused path (need_weights = false),
//    B = 1, E = 256, H = 4, causal, forward + backward from the output, for the full causal
//    attention and with a sliding window, grouped-query heads (kv_heads 1) and ALiBi. A window
//    of W keys makes the cost per token O(W): its time grows linearly in L where the full
//    attention's grows quadratically. "x" = the full attention's time / this.
// 2. Decoding: MultiHeadAttention::decode one token at a time up to a cache length, B = 1: the
//    KV cache's bytes (kv_heads * (D + Dv) floats per position; a window keeps O(W) positions)
//    and the time per token at the end (each decode appends its token; L is the length before).
#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

constexpr std::int64_t kE = 256, kH = 4, kWindow = 256;

struct Variant {
  const char* name;
  std::int64_t kv_heads = 0, window = 0;
  tg::Alibi alibi = tg::Alibi::none;
};

const Variant kVariants[] = {{"full"}, {"window 256", 0, kWindow}, {"kv_heads 1", 1, 0}, {"alibi", 0, 0, tg::Alibi::fixed}};

tg::MultiHeadAttention layer_for(const Variant& v) {
  return tg::MultiHeadAttention({.query_dim = kE, .heads = kH, .kv_heads = v.kv_heads, .seed = 1, .window = v.window, .alibi = v.alibi});
}

void training_calls(Table& table, int threads, const Options& options) {
  const std::vector<std::int64_t> lengths = options.quick ? std::vector<std::int64_t>{256} : std::vector<std::int64_t>{1024, 2048, 4096};
  for (std::int64_t len : lengths) {
    const Tensor x = tg::randn({1, len, kE}, 2);
    std::vector<tg::MultiHeadAttention> layers;
    for (const Variant& v : kVariants) layers.push_back(layer_for(v));
    std::vector<std::function<void()>> calls;
    for (auto& layer : layers)
      calls.push_back([&layer, &x] {
        layer.zero_grad();
        const Tensor out = layer.forward(x, {.masking = {.causal = true}}).output;
        tg::backward({out}, {tg::ones_like(out)});
        tg::clear_tape();
      });
    const auto t = measure(calls, std::min(options.runs, 5), options.seconds);
    for (std::size_t i = 0; i < layers.size(); ++i)
      table.add({static_cast<std::int64_t>(threads), len, std::string(kVariants[i].name), t[i], t[0].median / t[i].median,
                 1e6 * t[i].median / static_cast<double>(len)});
  }
}

void decoding(Table& table, int threads, const Options& options) {
  const std::int64_t len = options.quick ? 64 : 2048;
  for (const Variant& v : kVariants) {
    const tg::MultiHeadAttention layer = layer_for(v);
    const Tensor x = tg::randn({1, len, kE}, 3);
    tg::KVCache cache;
    tg::NoGradGuard no_grad;
    for (std::int64_t i = 0; i + 1 < len; ++i) layer.decode(tg::slice(x, 1, i, i + 1), cache);
    const Tensor last = tg::slice(x, 1, len - 1, len);
    // the last token again and again: each call appends one position (L grows by the calls, a
    // few dozen, against 2048)
    const Stats s = measure([&] { layer.decode(last, cache); }, options.runs, options.seconds);
    const double bytes = 4.0 * static_cast<double>(cache.capacity() * (cache.key_width() + cache.value_width()));
    table.add({static_cast<std::int64_t>(threads), len, std::string(v.name), cache.held(), bytes / (1 << 20), s});
  }
}

}  // namespace

void section_variants(Report& report, const Options& options) {
  auto& train = report.table("variants",
                             fmt::format("attention variants, training-shaped: MultiHeadAttention float32 fused (need_weights = false), "
                                         "B = 1, E = {}, H = {}, causal, forward + backward; ms median (min-max); x = full's time / this",
                                         kE, kH),
                             {{"threads", "th", 0, 2},
                              {"length", "L", 0, 5},
                              {"variant", "variant", 0, 10},
                              {"forward_backward_ms", "f+b ms", 1, 22},
                              {"speedup", "x", 2, 6},
                              {"us_per_token", "us/token", 1, 9}});
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    training_calls(train, threads, options);
  }
  auto& decode = report.table("variants_decode",
                              fmt::format("attention variants, decoding: MultiHeadAttention::decode of one token, B = 1, E = {}, H = {}, "
                                          "at cache length L; the cache's keys and values as held (MiB of capacity); ms median (min-max)",
                                          kE, kH),
                              {{"threads", "th", 0, 2},
                               {"length", "L", 0, 5},
                               {"variant", "variant", 0, 10},
                               {"held_positions", "held", 0, 6},
                               {"cache_mib", "cache MiB", 2, 9},
                               {"decode_ms", "token ms", 3, 22}});
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    decoding(decode, threads, options);
  }
}

}  // namespace bench
