// clone: a recorded copy into fresh storage.
#include "tapegrad/ops/clone.hpp"

#include "ops/op.hpp"

namespace tapegrad {

Tensor clone(const Tensor& x) {
  detail::check_defined("clone", "x", x);
  Tensor out = detail::copy_of(x);
  // dx = g
  detail::record_one("clone", x, out, {}, [](const Tensor& g) { return g; });
  return out;
}

}  // namespace tapegrad
