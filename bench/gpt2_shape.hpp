// The GPT-2-shaped step's shape and its products, shared by the gpt2 section and its chain.
#pragma once

#include <cstdint>
#include <vector>

namespace bench {

struct Gpt2 {
  std::int64_t layers, dim, heads, vocab, t, b;
};
constexpr Gpt2 kFull{12, 768, 12, 50257, 64, 4}, kQuick{2, 64, 4, 256, 16, 2};

// A product of the step: count times [batch] m x k @ k x n, operands stored transposed or not.
struct Product {
  std::int64_t batch, m, k, n;
  bool ta, tb;
  std::int64_t count;
};

// Every product of one step: y = x w, dx = g w^T, dw = x^T g for each linear map; for attention,
// S = q k^T and O = A v, then dv = A^T dO, dA = dO v^T, dq = dS k, dk = dS^T q.
std::vector<Product> step_products(const Gpt2& s);

// A pass over 256 MiB (1 MiB when quick) that leaves the caches holding none of a step's
// operands, as the update leaves them.
void evict_caches(bool quick);

// The step's products run by oneDNN alone, in a step's order on a step's buffers, each pass after
// evict_caches: seconds, the median of 3 passes (1 when quick) (gpt2_chain.cpp).
double chain_limit(const Gpt2& s, bool bf16, bool quick);

// The update's memory traffic and nothing else: Adam with float32 moments reads every weight,
// gradient and both moments and writes back the weight and the moments, 28 bytes per parameter.
// One pass moves those seven streams over buffers of the model's size with an add per element,
// on tapegrad's threads: an update at memory speed (the clipping norm's read of the gradients
// is left out, as it could be fused into the backward). A pass: seconds.
class UpdateStreams {
 public:
  explicit UpdateStreams(std::int64_t parameters);
  double operator()();

 private:
  std::vector<float> p_, g_, m_, v_;
};

}  // namespace bench
