// generate()'s loop over any CachedModel: the prompt once, then one position per step, restarting
// from the tail when options.restart_after is reached (see generate.hpp).
#include "tapegrad/layers/generate.hpp"

#include <vector>

#include "autodiff/check.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/train/sampling.hpp"

namespace tapegrad {
namespace {

// sample() of the model's logits, its refusal named as generate's (the options were checked
// before the first step, so what it refuses is the logits): the caller passed no 'logits'.
std::vector<std::int64_t> sample_step(const char* fn, std::int64_t step, const Tensor& logits, const SampleOptions& o, Generator& gen) {
  try {
    return sample(logits, o, gen).to_vector<std::int64_t>();
  } catch (const DTypeError& e) {
    detail::fail<DTypeError>("{}: the logits the model's decode_step returned at step {} cannot be sampled: {}", fn, step, e.what());
  } catch (const ShapeError& e) {
    detail::fail<ShapeError>("{}: the logits the model's decode_step returned at step {} cannot be sampled: {}", fn, step, e.what());
  } catch (const ValueError& e) {
    detail::fail<ValueError>("{}: the logits the model's decode_step returned at step {} cannot be sampled: {}", fn, step, e.what());
  }
}

}  // namespace

Tensor detail::generate_tokens(const char* fn, const Tensor& prompt, const GenerateOptions& o, Generator& gen, PositionLimit limit,
                               const std::function<void()>& restart, const std::function<Tensor(const Tensor&)>& step) {
  detail::check_dtype(fn, "prompt", prompt, DType::int64);
  if (prompt.dim() != 2 || prompt.size(1) < 1)
    fail<ShapeError>("{}: argument 'prompt' must be [B, T0] with T0 >= 1, got shape {}", fn, shape_str(prompt.shape()));
  if (o.restart_after < 0 || o.restart_after == 1)
    fail<ValueError>("{}: options.restart_after must be 0 (no limit) or at least 2, got {}", fn, o.restart_after);
  if (o.restart_after > 0 && prompt.size(1) >= o.restart_after)
    fail<ValueError>("{}: the prompt's {} positions must be fewer than options.restart_after = {}", fn, prompt.size(1), o.restart_after);
  if (o.new_tokens < 0) fail<ValueError>("{}: options.new_tokens must be >= 0, got {}", fn, o.new_tokens);
  if (limit.most > 0 && o.restart_after > limit.most)
    fail<ValueError>("{}: options.restart_after must be at most {} = {}, got {}", fn, limit.name, limit.most, o.restart_after);
  if (limit.most > 0 && o.restart_after == 0 && o.new_tokens > limit.most - prompt.size(1))
    fail<ValueError>("{}: the prompt's {} positions plus options.new_tokens = {} must fit {} = {} (or set options.restart_after)", fn,
                     prompt.size(1), o.new_tokens, limit.name, limit.most);
  const SampleOptions sampling{.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p};
  check_sample_options(fn, sampling);
  // The result [B, T0 + new_tokens] must be possible before any step runs.
  std::int64_t total = 0;
  if (__builtin_add_overflow(prompt.size(1), o.new_tokens, &total))
    fail<ValueError>("{}: the prompt's {} positions plus options.new_tokens = {} overflow int64", fn, prompt.size(1), o.new_tokens);
  try {
    check_shape(fn, "the result [B, T0 + new_tokens]", {prompt.size(0), total}, DType::int64);
  } catch (const ShapeError&) {
    fail<ValueError>("{}: the result [B, T0 + options.new_tokens] = [{}, {}] would be more than can be allocated", fn,
                     prompt.size(0), total);
  }
  NoGradGuard no_grad;
  const std::int64_t batch = prompt.size(0), t0 = prompt.size(1);
  const std::vector<std::int64_t> ids = prompt.to_vector<std::int64_t>();
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(batch));  // each grows by a token a step
  for (std::int64_t b = 0; b < batch; ++b) rows[b].assign(ids.begin() + b * t0, ids.begin() + (b + 1) * t0);
  Tensor input = prompt;
  std::int64_t cached = 0;  // positions in the model's cache
  for (std::int64_t n = 0; n < o.new_tokens; ++n) {
    if (o.restart_after > 0 && cached + input.size(1) > o.restart_after) {
      // Full: start again from the last restart_after / 2 tokens of each row.
      const std::int64_t keep = o.restart_after / 2;
      std::vector<std::int64_t> tail;
      for (const auto& r : rows) tail.insert(tail.end(), r.end() - keep, r.end());
      input = from_vector(tail, {batch, keep});
      restart();
      cached = 0;
    }
    const Tensor logits = step(input);
    if (!logits.defined() || logits.dim() != 2 || logits.size(0) != batch)
      fail<ShapeError>("{}: the model's decode_step must return logits [B = {}, V], got {}", fn, batch,
                       logits.defined() ? shape_str(logits.shape()) : "an undefined tensor");
    cached += input.size(1);
    const std::vector<std::int64_t> next = sample_step(fn, n, logits, sampling, gen);
    for (std::int64_t b = 0; b < batch; ++b) rows[b].push_back(next[b]);
    input = from_vector(next, {batch, 1});
  }
  std::vector<std::int64_t> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return from_vector(out, {batch, total});
}

}  // namespace tapegrad
