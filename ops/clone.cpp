// clone: a recorded copy into fresh storage.
#include "tapegrad/ops/clone.hpp"

#include "ops/op.hpp"

namespace tapegrad {

Tensor clone(const Tensor& x) {
  detail::check_defined("clone", "x", x);
  Tensor out = detail::copy_of(x);
  // dx = g
  detail::record("clone", {x}, out, {}, [](std::span<const Tensor> g, const std::vector<bool>&) {
    return std::vector<Tensor>{g[0]};
  });
  return out;
}

}  // namespace tapegrad
