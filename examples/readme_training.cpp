// The training loop shown in the README, verbatim between the markers (a test compares the two).
// It trains a small decoder-only transformer to sort 6 digits and prints its held-out accuracy.
// README:begin
#include <algorithm>

#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;

// A batch of "digits | sorted digits": inputs, and next-token targets on the sorted half only.
std::pair<tg::Tensor, tg::Tensor> sorting_batch(tg::Generator& gen, std::int64_t batch, std::int64_t n) {
  std::vector<std::int64_t> x, y;
  for (std::int64_t b = 0; b < batch; ++b) {
    std::vector<std::int64_t> seq(n);
    for (auto& d : seq) d = static_cast<std::int64_t>(gen.uniform() * 10);
    std::vector<std::int64_t> sorted = seq;
    std::sort(sorted.begin(), sorted.end());
    seq.push_back(10);  // the separator
    seq.insert(seq.end(), sorted.begin(), sorted.end());
    for (std::int64_t t = 0; t < 2 * n; ++t) {
      x.push_back(seq[t]);
      y.push_back(t >= n ? seq[t + 1] : -100);  // -100: ignored by cross_entropy
    }
  }
  return {tg::from_vector(std::span<const std::int64_t>(x), {batch, 2 * n}),
          tg::from_vector(std::span<const std::int64_t>(y), {batch, 2 * n})};
}

int main() {
  tg::Decoder model({.vocab = 11, .max_len = 13, .dim = 48, .heads = 4, .layers = 2, .seed = 1});
  tg::AdamW opt(model.named_parameters(), {.lr = 3e-3});
  tg::Generator gen(2);
  for (int step = 0; step < 800; ++step) {
    auto [x, y] = sorting_batch(gen, 64, 6);
    tg::Tensor loss = tg::cross_entropy(model.forward(x), y);
    tg::backward(loss);
    tg::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    if (step % 100 == 0) fmt::print("step {} loss {:.4f}\n", step, loss.item());
  }
  model.eval();
  auto [x, y] = sorting_batch(gen, 500, 6);
  tg::Tensor prompt = tg::slice(x, 1, 0, 7), answer = tg::slice(y, 1, 6, 12);
  tg::Tensor out = tg::slice(model.generate(prompt, {.new_tokens = 6, .temperature = 0}), 1, 7, 13);
  tg::Tensor right = tg::sum(tg::eq(out, answer).to(tg::float64), {1});  // digits right per row
  double exact = tg::mean(tg::eq(right, tg::scalar(6.0, tg::float64)).to(tg::float64)).item();
  fmt::print("held-out exact-sequence accuracy: {:.1f}%\n", 100 * exact);
  return exact > 0.9 ? 0 : 1;
}
// README:end
