// Generation from any model that decodes through a cache: Decoder, or a model of your own that
// offers the two members of CachedModel.
//
//   struct Bigram {                                       // a model generate() can run
//     using Cache = std::int64_t;                         // what it keeps between steps
//     Cache start_cache() const { return 0; }
//     tg::Tensor decode_step(const tg::Tensor& tokens, Cache& cache) const;  // [B, n] -> logits [B, V]
//   };
//   tg::Generator gen(seed);
//   tg::Tensor out = tg::generate(model, prompt, {.new_tokens = 20, .temperature = 0.8, .top_p = 0.9}, gen);
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

struct GenerateOptions {
  std::int64_t new_tokens = 1;  // >= 0
  // How each token is drawn: SampleOptions' fields (train/sampling.hpp), checked by its rule.
  double temperature = 1.0;  // 0: greedy (argmax, ties to the lowest id)
  std::int64_t top_k = 0;    // > 0: sample among the k most likely tokens only (ties at the k-th kept)
  std::uint64_t seed = 0;    // Decoder::generate's generator; generate() draws from the one it is given
  // > 0: attend to at most this many positions. When the cache holds that many, generation
  // restarts from the last restart_after / 2 tokens (a fresh cache, positions from 0 again), so
  // a model trained on windows of this length never sees longer ones; the output may then be
  // longer than a Decoder's max_len. 0: no limit. (Not a sliding window, which never restarts.)
  std::int64_t restart_after = 0;
  double top_p = 1.0;  // < 1: sample within the nucleus of this probability only (after top_k)
};

// A model generate() can run: start_cache() gives an empty cache (M::Cache) for a new batch,
// and decode_step(tokens, cache) reads int64 tokens [B, n], n >= 1, the positions that follow
// those in the cache, keeps them in the cache and returns the logits [B, V] of the position after
// the last. Decoder is one. A model whose cache holds a bounded number of positions says so with
// max_positions() (an int64, 0: no limit), and generate() then checks the prompt and
// new_tokens against it (or restart_after) before any step, as Decoder::generate does.
template <class M>
concept CachedModel = requires(const M& model, const Tensor& tokens, typename M::Cache& cache) {
  { model.start_cache() } -> std::convertible_to<typename M::Cache>;
  { model.decode_step(tokens, cache) } -> std::convertible_to<Tensor>;
};

namespace detail {
// The positions a model's cache holds at most: `most` (0: no limit), named `name` in errors.
struct PositionLimit {
  std::int64_t most = 0;
  const char* name = "";
};
// generate()'s loop, the model reached through `restart` (a fresh cache) and `step`
// (decode_step on it); `fn` names the caller in errors.
Tensor generate_tokens(const char* fn, const Tensor& prompt, const GenerateOptions& options, Generator& gen, PositionLimit limit,
                       const std::function<void()>& restart, const std::function<Tensor(const Tensor&)>& step);
}  // namespace detail

// Continues each row of `prompt` (int64 [B, T0], T0 >= 1) by options.new_tokens tokens, running
// the prompt through the model once and then one position per step, each token drawn by
// sample() with the options' temperature, top_k and top_p from `gen` (options.seed is not read).
// Returns [B, T0 + new_tokens]. Records nothing; a module's dropout follows its mode, so call
// eval() first.
template <CachedModel M>
Tensor generate(const M& model, const Tensor& prompt, const GenerateOptions& options, Generator& gen) {
  detail::PositionLimit limit{0, "the model's max_positions()"};
  if constexpr (requires { { model.max_positions() } -> std::convertible_to<std::int64_t>; }) limit.most = model.max_positions();
  typename M::Cache cache = model.start_cache();
  return detail::generate_tokens(
      "generate", prompt, options, gen, limit, [&] { cache = model.start_cache(); },
      [&](const Tensor& tokens) -> Tensor { return model.decode_step(tokens, cache); });
}

}  // namespace tapegrad
