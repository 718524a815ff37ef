// The next token from a model's logits: greedy, or a draw with a temperature, top-k and top-p
// (nucleus) sampling, as PyTorch and Hugging Face's generate() define them.
//
//   tg::Generator gen(seed);
//   tg::Tensor next = tg::sample(logits, {.temperature = 0.8, .top_k = 40, .top_p = 0.95}, gen);  // [B, V] -> int64 [B]
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

struct SampleOptions {
  double temperature = 1.0;  // finite, >= 0; 0: greedy (top_k and top_p then change nothing)
  // >= 0; k > 0 keeps the tokens whose logit is at least the k-th largest (ties at the k-th kept,
  // as Hugging Face's TopKLogitsWarper); 0: off.
  std::int64_t top_k = 0;
  // In (0, 1]; below 1 keeps the smallest set of most likely tokens whose probability (after
  // top_k) reaches top_p: with the tokens in order, most likely first and equal logits by lower
  // id, a token stays when the tokens before it hold less than top_p, so the most likely always
  // stays. Unlike top_k, a tie across the boundary is cut by id: of logits {0, 0, 0} with
  // top_p = 0.5, ids 0 and 1 stay and id 2 goes. 1: off.
  double top_p = 1.0;
};

// The one check of SampleOptions, with `fn` naming the caller: sample, generate, Decoder::generate
// (null: "check_sample_options").
void check_sample_options(const char* fn, const SampleOptions& options);

// One token id per row of `logits` (float32 or float64; [V] -> int64 [], [B, V] -> int64 [B]).
// At temperature 0 the argmax, ties to the lowest id, drawing nothing; otherwise a draw from
// softmax(logits / temperature) restricted by top_k, then top_p, with one gen.uniform() per row,
// rows in order. A logit may be -inf (never drawn), not NaN or +inf, and every row needs a
// finite one. Records nothing.
Tensor sample(const Tensor& logits, const SampleOptions& options, Generator& gen);

}  // namespace tapegrad
