// The README's short tour, verbatim between the markers (a test compares the two, and another
// runs this program: it exits non-zero if the gradient check fails).
// README:begin
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;

int main() {
  fmt::print("{} thread(s): tg::set_num_threads(n) or OMP_NUM_THREADS to change\n", tg::num_threads());

  // A leaf, a few recorded ops, backward: w.grad() holds dloss/dw.
  tg::Tensor w = tg::randn({4, 3}, /*seed=*/1).set_requires_grad();
  tg::Tensor x = tg::tensor({{1, 2, 3, 4}});
  tg::Tensor loss = tg::mean(tg::pow(tg::tanh(tg::matmul(x, w)) - 0.5, 2.0));
  tg::backward(loss);
  fmt::print("dloss/dw, {} {}:\n{}\n", w.grad().shape(), w.grad().dtype(), w.grad());

  // Attention under a causal mask and a key no query may see (true = allowed): query 0 is
  // left with no key at all, so its weights, its output and its gradients are exactly 0.
  tg::Tensor q = tg::randn({2, 5, 8}, 2, tg::float64).set_requires_grad();
  tg::Tensor k = tg::randn({2, 5, 8}, 3, tg::float64).set_requires_grad();
  tg::Tensor v = tg::randn({2, 5, 4}, 4, tg::float64).set_requires_grad();
  tg::Tensor allowed = tg::logical_and(tg::causal_mask(5, 5), tg::mask({{false, true, true, true, true}}));
  auto [out, weights] = tg::scaled_dot_product_attention(q, k, v, allowed);
  fmt::print("query 0's output: {}\n", tg::select(out, 1, 0).detach());

  // Every gradient of it against float64 central differences.
  auto attend = [&](const std::vector<tg::Tensor>& in) {
    return std::vector{tg::scaled_dot_product_attention(in[0], in[1], in[2], allowed).output};
  };
  tg::GradcheckResult check = tg::gradcheck(attend, {q, k, v});
  fmt::print("{}\n", check.report());

  // The layer owns its weights; with need_weights it returns them too, [B, heads, Q, K].
  tg::MultiHeadAttention mha({.query_dim = 16, .heads = 4, .seed = 7});
  tg::AttentionResult r = mha.forward(tg::randn({2, 5, 16}, 5), {.masking = {.causal = true}, .need_weights = true});
  fmt::print("output {}, weights {}\n", r.output.shape(), r.weights.shape());
  return check.ok ? 0 : 1;
}
// README:end
