// The write-after-record check: record a graph, write into one tensor it was built from, run
// backward. Either backward refuses with the promised GraphError (the op declared the tensor as
// saved) or every gradient is exactly that of an untouched run (its backward never reads it). A
// gradient that changed without an error is an op reading a tensor it did not declare.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <tapegrad/tapegrad.hpp>

namespace tg_test {

// One recorded run: `record` builds it from scratch, with the same values on every call.
struct Recording {
  std::vector<tapegrad::Tensor> outputs;      // backward starts from those that require grad
  std::vector<tapegrad::Tensor> grad_leaves;  // whose .grad is compared
  std::vector<std::pair<std::string, tapegrad::Tensor>> writable;  // named for the messages
};

// What one write did: backward refused it, the gradients stayed exactly the same, or they
// changed without an error. `declared`: some recorded node lists the written tensor (or a tensor
// on its storage) as saved.
enum class Outcome { caught, harmless, wrong };
struct Write {
  std::string name;
  Outcome outcome;
  bool declared;
  std::string message;  // the GraphError's, when caught
};

// Writes into t as a user reusing a buffer would: a leaf through copy_ with every element changed
// (floating x -> 1.25 x + 0.5, bool negated, int64 ids v >= 0 -> (v + 1) mod (max + 1), so they
// stay valid), an
// op's output through data<T>() (its element 0 plus 1).
void write_into(const tapegrad::Tensor& t);

// Runs `record` once clean and once per writable tensor with elements, written between forward
// and backward; the upstream gradients are drawn from `seed`. With `omit_written`, backward
// leaves the written tensor's saved entries out of its version check (OmitSavedForTesting): a
// declared tensor that the backward really reads must then give `wrong`.
std::vector<Write> write_after_record(const std::function<Recording()>& record, std::uint64_t seed, bool omit_written = false);

}  // namespace tg_test
