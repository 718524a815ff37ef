// Fits a tiny two-layer network to y = sin(3x) + 0.5 by full-batch gradient descent, then checks the
// network's gradients against finite differences with the public gradcheck.
//
// Shapes: x [N, 1] -> h = tanh(x w1 + b1) [N, H] -> y = h w2 + b2 [N, 1].
#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;
using tg::Tensor;

namespace {

Tensor predict(const std::vector<Tensor>& p, const Tensor& x) {
  return tg::matmul(tg::tanh(tg::matmul(x, p[0]) + p[1]), p[2]) + p[3];
}

Tensor mse(const Tensor& prediction, const Tensor& target) { return tg::mean(tg::pow(prediction - target, 2.0)); }

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  CLI::App app{"fit_mlp: a two-layer network fitted to sin(3x) + 0.5, then gradchecked"};
  app.add_option("--threads", threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tg::set_num_threads(threads);
  fmt::print("fit_mlp: {} thread(s) (--threads N to choose)\n", tg::num_threads());
  constexpr int kPoints = 64, kHidden = 16, kSteps = 3000;
  constexpr double kLearningRate = 0.1;

  std::vector<double> xs, ys;
  for (int i = 0; i < kPoints; ++i) {
    xs.push_back(-1.0 + 2.0 * i / (kPoints - 1));
    ys.push_back(std::sin(3.0 * xs.back()) + 0.5);
  }
  const Tensor x = tg::from_vector(xs, {kPoints, 1});
  const Tensor y = tg::from_vector(ys, {kPoints, 1});

  // Seeded initialisation: N(0, 1/fan_in) weights, zero biases.
  tg::Generator gen(2024);
  std::vector<Tensor> params = {tg::randn({1, kHidden}, gen, tg::float64), tg::zeros({kHidden}, tg::float64),
                                tg::randn({kHidden, 1}, gen, tg::float64) / std::sqrt(double(kHidden)),
                                tg::zeros({1}, tg::float64)};
  for (auto& p : params) p.set_requires_grad();
  std::vector<Tensor> initial;  // copies: the loop below updates params in place
  for (const auto& p : params) initial.push_back(tg::clone(p).detach().set_requires_grad());

  double first_loss = 0, loss_value = 0;
  for (int step = 0; step <= kSteps; ++step) {
    const Tensor loss = mse(predict(params, x), y);
    loss_value = loss.item();
    if (step == 0) first_loss = loss_value;
    if (step % 500 == 0) fmt::print("step {:5d}  loss {:.6f}\n", step, loss_value);
    tg::backward(loss);
    for (auto& p : params) {
      tg::add_(p, p.grad(), -kLearningRate);  // in place and unrecorded: not part of the model
      p.zero_grad();
    }
  }  // each step's graph is freed with its loss
  fmt::print("loss fell from {:.4f} to {:.6f}\n\n", first_loss, loss_value);

  // Were the gradients we trained with right? Compare with central differences at the starting
  // point, where they are large (at the trained minimum they are all close to zero).
  const auto report = tg::gradcheck(
      [&](const std::vector<Tensor>& p) { return std::vector<Tensor>{mse(predict(p, x), y)}; }, initial);
  fmt::print("{}\n", report.report());
  return report.ok && loss_value < 0.1 * first_loss ? 0 : 1;
}
