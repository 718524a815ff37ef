// Links against the installed tapegrad and takes one gradient.
#include <tapegrad/tapegrad.hpp>

int main() {
  namespace tg = tapegrad;
  tg::Tensor w = tg::tensor({{1, 2}, {3, 4}}).set_requires_grad();
  tg::backward(tg::sum(tg::matmul(tg::ones({1, 2}), w)));
  const bool ok = w.grad().to_vector<float>() == std::vector<float>{1, 1, 1, 1};
  fmt::print("consumer: find_package(tapegrad) and tapegrad::tapegrad work: {}\n", ok ? "yes" : "NO");
  return ok ? 0 : 1;
}
