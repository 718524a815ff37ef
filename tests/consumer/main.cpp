// An outside program that uses the installed tapegrad. The same file is built twice by ./dev test:
// through find_package(tapegrad) (CMakeLists.txt here) and with plain g++ and pkg-config
// (Makefile here). Every call is checked against a value known in advance, so a package that
// compiles and links but computes nothing sensible still fails; the exit status is the number of
// failed checks.
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include <fmt/ranges.h>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;

namespace {

int failures = 0;

void check(std::string_view what, const std::vector<double>& got, const std::vector<double>& want, double tol) {
  bool ok = got.size() == want.size();
  for (std::size_t i = 0; ok && i < got.size(); ++i) ok = std::abs(got[i] - want[i]) <= tol;
  fmt::print("  {:<38} {::.7g} (expected {::.7g}, tolerance {:g})  {}\n", what, got, want, tol, ok ? "ok" : "MISMATCH");
  if (!ok) ++failures;
}

}  // namespace

int main() {
  fmt::print("consumer of the installed tapegrad:\n");

  // A tensor from a literal: shape and values as written.
  const tg::Tensor x = tg::tensor({{1, 1}});
  tg::Tensor w = tg::tensor({{1, 2}, {3, 4}}).set_requires_grad();
  const auto& shape = w.shape();
  check("tensor({{1, 2}, {3, 4}}) shape", {double(shape.at(0)), double(shape.at(1))}, {2, 2}, 0);
  check("tensor({{1, 2}, {3, 4}}) values", w.to_vector<double>(), {1, 2, 3, 4}, 0);

  // loss = mean((x w)^2) with x w = [4, 6]: loss = 26, and dloss/dw[i][j] = x[i] (x w)[j], so
  // dloss/dw = [[4, 6], [4, 6]].
  // The float32 matmul runs on oneDNN, so this also proves libdnnl is linked and works.
  const tg::Tensor loss = tg::mean(tg::pow(tg::matmul(x, w), 2.0));
  tg::backward(loss);
  check("loss = mean((x w)^2)", {loss.item()}, {26}, 0);
  check("dloss/dw", w.grad().to_vector<double>(), {4, 6, 4, 6}, 0);
  tg::clear_tape();

  // attention([[1, 0]], [[1, 0], [0, 1]], [[10], [20]]): scaled scores [1/sqrt(2), 0], weights
  // [0.6698, 0.3302], output 13.3024; the gradient of the output with respect to v is the weights.
  tg::Tensor v = tg::tensor({{10}, {20}}).set_requires_grad();
  auto [out, weights] = tg::scaled_dot_product_attention(tg::tensor({{1, 0}}), tg::tensor({{1, 0}, {0, 1}}), v);
  const double w0 = 1 / (1 + std::exp(-1 / std::sqrt(2.0)));
  check("scaled_dot_product_attention output", out.to_vector<double>(), {13.3024}, 1e-4);
  check("attention weights", weights.to_vector<double>(), {w0, 1 - w0}, 1e-6);
  tg::backward(out);
  check("d output / d v", v.grad().to_vector<double>(), {w0, 1 - w0}, 1e-6);
  tg::clear_tape();

  // A causal mask with offset -1 leaves query 0 without any key: its row is exactly zero.
  const std::vector<bool> allowed = tg::causal_mask(2, 2, -1).to_vector<bool>();
  check("causal_mask(2, 2, -1)", std::vector<double>(allowed.begin(), allowed.end()), {0, 0, 1, 0}, 0);
  const tg::Tensor masked = tg::attention(tg::tensor({{1, 0}, {0, 1}}), tg::tensor({{1, 0}, {0, 1}}),
                                          tg::tensor({{10}, {20}}), tg::causal_mask(2, 2, -1));
  check("attention with an empty query row", masked.to_vector<double>(), {0, 10}, 0);

  // The public finite-difference checker agrees with the tape on float64 attention.
  const tg::GradcheckResult gc = tg::gradcheck(
      [](const std::vector<tg::Tensor>& in) {
        auto [o, a] = tg::scaled_dot_product_attention(in[0], in[1], in[2]);
        return std::vector<tg::Tensor>{o, a};
      },
      {tg::randn({3, 4}, 1, tg::float64).set_requires_grad(), tg::randn({5, 4}, 2, tg::float64).set_requires_grad(),
       tg::randn({5, 2}, 3, tg::float64).set_requires_grad()});
  tg::clear_tape();
  check("gradcheck(attention) passes", {gc.ok ? 1.0 : 0.0}, {1}, 0);

  fmt::print("consumer: {}\n", failures == 0 ? "every check passed" : fmt::format("{} check(s) FAILED", failures));
  return failures;
}
