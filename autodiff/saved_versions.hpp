// Internal: the tape's check that nothing a backward reads was written in place after its op
// was recorded (each node's SavedVersion list, node.hpp), and the test seam that bends it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "autodiff/node.hpp"

namespace tapegrad::detail {

// What `t` is to an op with these inputs and outputs, for the error message (kind and index).
SavedVersion::Kind describe(const Tensor& t, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                            std::uint32_t& index);

// GraphError naming the op and the tensor when one of `saved` (op `name`'s list) that still
// exists has changed version since the op was recorded.
void check_saved_versions(const char* name, const std::vector<SavedVersion>& saved);

// Test seam: while one lives, backward on its thread leaves some entries of the nodes' `saved`
// lists out of the version check, as if the ops had not declared them: entry `index` of ops
// named `op`, or every entry on the storage of one tensor. The tests use it to prove that their
// write-after-record check catches an op that forgets a tensor it reads.
class OmitSavedForTesting {
 public:
  OmitSavedForTesting(std::string op, std::size_t index);
  explicit OmitSavedForTesting(const Tensor& storage_of);
  ~OmitSavedForTesting();
  OmitSavedForTesting(const OmitSavedForTesting&) = delete;
  OmitSavedForTesting& operator=(const OmitSavedForTesting&) = delete;
  bool omits(const char* op, std::size_t index, const Storage* storage) const {
    return storage_ != nullptr ? storage == storage_ : index == index_ && op == op_;
  }

 private:
  std::string op_;
  std::size_t index_ = 0;
  const Storage* storage_ = nullptr;
  const OmitSavedForTesting* previous_;
};

}  // namespace tapegrad::detail
