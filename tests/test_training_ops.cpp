// The training ops beyond what the op table checks: exact edge-case semantics (empty rows,
// ignored targets, ties and NaN, p = 1), identities, and bad inputs named precisely.
#define BOOST_TEST_MODULE training_ops
#include <limits>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

BOOST_AUTO_TEST_SUITE(clone_op)

BOOST_AUTO_TEST_CASE(owns_its_storage_and_passes_the_gradient) {
  const Tensor x = tg::tensor({{1, 2, 3}, {4, 5, 6}}, tg::float64).set_requires_grad();
  for (const Tensor& source : {x, tg::transpose(x, 0, 1)}) {
    const Tensor c = tg::clone(source);
    BOOST_TEST(!c.shares_storage_with(x));
    BOOST_TEST(c.is_contiguous());
    BOOST_TEST(c.to_vector<double>() == source.to_vector<double>());
    tg::backward(tg::sum(tg::mul(c, c)));
  }
  // d/dx sum(x^2) twice (once through the transpose) = 4x
  check_close(x.grad(), {4, 8, 12, 16, 20, 24}, 0, "dx");
}

BOOST_AUTO_TEST_CASE(a_clone_can_be_updated_in_place_while_the_original_is_saved) {
  const Tensor x = tg::tensor({1, 2}, tg::float64).set_requires_grad();
  const Tensor y = tg::mul(x, x);  // saves x
  {
    tg::NoGradGuard no_grad;
    const Tensor c = tg::clone(x);
    tg::add_(c, tg::scalar(1.0, tg::float64));
    check_close(c, {2, 3}, 0, "clone updated");
  }
  tg::backward(tg::sum(y));
  check_close(x.grad(), {2, 4}, 0, "gradient of the original");
}

BOOST_AUTO_TEST_SUITE_END()
