// custom_op: an op of your own with a hand-written backward, checked to second order. The part
// between README:begin and README:end is docs/api.md's "Writing your own op" word for word (a
// test compares them); the program exits non-zero unless both checks pass.
#include <cstdio>

#include <tapegrad/tapegrad.hpp>

// README:begin
namespace tg = tapegrad;

// softplus(x) = log(1 + e^x), one tape node with its own backward.
//   forward: y = log(1 + e^x)        backward: dx = g sigmoid(x) = g / (1 + e^-x)
tg::Tensor softplus(const tg::Tensor& x) {
  std::vector<tg::Tensor> out(1);
  {
    // The forward's own ops must not be recorded: the op is this one node, and its outputs
    // must be new tensors that no other node made.
    tg::NoGradGuard no_grad;
    out[0] = tg::log(1.0 + tg::exp(x));
  }
  const std::vector<tg::Tensor> inputs{x};
  tg::record_op("softplus", inputs, out, [x](std::span<const tg::Tensor> g, const std::vector<bool>&) {
    // dx = g / (1 + e^-x): written in recorded ops of the captured input and of g, so that a
    // create_graph pass can differentiate it again (gradients of gradients).
    return std::vector<tg::Tensor>{g[0] / (1.0 + tg::exp(-x))};
  });
  return out[0];
}

int main() {
  const tg::Tensor x = tg::randn({3, 4}, /*seed=*/1, tg::float64).set_requires_grad();
  auto f = [](const std::vector<tg::Tensor>& in) { return std::vector<tg::Tensor>{softplus(in[0])}; };
  const tg::GradcheckResult first = tg::gradcheck(f, {x});       // the backward against finite differences
  const tg::GradcheckResult second = tg::gradgradcheck(f, {x});  // and the backward's own gradient
  std::printf("%s\n%s\n", first.report().c_str(), second.report().c_str());
  return first.ok && second.ok ? 0 : 1;
}
// README:end
