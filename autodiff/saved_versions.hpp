// Internal: the tape's check that nothing a backward reads was written in place after its op
// was recorded (each node's SavedVersion list, node.hpp), and the test seam that bends it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "autodiff/node.hpp"

namespace tapegrad::detail {

// What `t` is to an op with these inputs and outputs, for the error message (kind and index).
SavedVersion::Kind describe(const Tensor& t, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                            std::uint32_t& index);

// GraphError naming the op and the tensor when one of `saved` (op `name`'s list) that still
// exists has changed version since the op was recorded.
void check_saved_versions(const char* name, const std::vector<SavedVersion>& saved);

// Test seam: while one lives, backward on its thread leaves every entry of the nodes' `saved`
// lists on the storage of one tensor out of the version check, as if the ops had not declared
// it. The tests use it to prove that their write-after-record check catches an op that forgets
// a tensor it reads.
class OmitSavedForTesting {
 public:
  explicit OmitSavedForTesting(const Tensor& storage_of);
  ~OmitSavedForTesting();
  OmitSavedForTesting(const OmitSavedForTesting&) = delete;
  OmitSavedForTesting& operator=(const OmitSavedForTesting&) = delete;
  const Storage* const storage;

 private:
  const OmitSavedForTesting* previous_;
};

}  // namespace tapegrad::detail
