// Internal: an op's backward reading its own output in a create_graph pass.
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// A backward captures its outputs detached (an output holds its node). Called inside the
// backward with such a capture, this gives it back joined to the node whose backward runs (as
// output `slot`) when the pass has create_graph, so that ops on it differentiate through this
// node again; otherwise, and outside a backward, it returns `saved` itself.
Tensor output_with_history(const Tensor& saved, std::int32_t slot = 0);

// True while a create_graph pass runs a node's backward on this thread (grad mode is then on).
bool creating_graph() noexcept;

}  // namespace tapegrad::detail
