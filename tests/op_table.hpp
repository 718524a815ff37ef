// The op table: every public op registered once, with sample shapes, an independent reference,
// gradcheck settings and error inputs (PyTorch's OpInfo idea). test_ops walks it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "reference.hpp"

namespace tg_test {

enum class Raises { shape, dtype, value, graph, error };  // error: tapegrad::Error itself (an undefined argument)

struct ErrorInput {
  std::string description;
  std::function<void()> call;
  Raises raises;
  std::vector<std::string> fragments;  // each must appear in the message
};

struct OpInfo {
  std::string name;
  // Public functions this entry exercises (the coverage test checks every public op is named).
  std::vector<std::string> covers;
  // Each sample lists the shapes of the floating inputs.
  std::vector<std::vector<tapegrad::Shape>> samples;
  std::function<std::vector<tapegrad::Tensor>(const std::vector<tapegrad::Tensor>&)> op;
  std::function<std::vector<Ref>(const std::vector<Ref>&)> reference;
  bool differentiable = true;
  bool positive = false;  // draw inputs from [0.5, 2] (log, sqrt, div...)
  tapegrad::GradcheckOptions grad{};
  double f32_tol = 2e-5;  // float32 vs float64 agreement, absolute and relative
  std::vector<ErrorInput> errors;
  // Empty when test_ops may replace each input of the first sample by an undefined Tensor and
  // expect the op to name itself and the argument. Otherwise why it cannot (`op` reads the
  // inputs' shapes or dtypes before calling the function, or the function takes no tensor);
  // then `errors` covers each undefined argument instead.
  std::string undefined_inputs_unreachable;
};

const std::vector<OpInfo>& op_table();
std::vector<std::string> op_names();
const OpInfo& find_op(const std::string& name);

// A tensor argument that an entry's op makes itself (a mask, ids, targets, a layer's parameters)
// goes through arg(): while an ArgCollector lives on the thread, it collects them, so that the
// write-after-record test writes into them too. pattern_mask and pattern_ids call it themselves.
tapegrad::Tensor arg(tapegrad::Tensor t);
class ArgCollector {
 public:
  ArgCollector();
  ~ArgCollector();
  ArgCollector(const ArgCollector&) = delete;
  ArgCollector& operator=(const ArgCollector&) = delete;
  std::vector<tapegrad::Tensor> args;

 private:
  ArgCollector* previous_;
};

// While an ArgLayout lives on the thread, arg() hands out the bool and int64 tensors it is
// given (masks, ids, targets, positions) with the same values in non-contiguous memory, so that
// test_ops' transposed and strided layouts reach every input, not only the floating ones.
class ArgLayout {
 public:
  enum Kind { as_made, transposed, strided };
  explicit ArgLayout(Kind kind);
  ~ArgLayout();
  ArgLayout(const ArgLayout&) = delete;
  ArgLayout& operator=(const ArgLayout&) = delete;

 private:
  Kind previous_;
};

// The same values in non-contiguous memory: dims reversed, made contiguous and reversed back
// (transposed, rank >= 2), or every other element of a buffer twice the size (otherwise).
tapegrad::Tensor relaid(const tapegrad::Tensor& t, ArgLayout::Kind kind);

// A deterministic bool pattern for ops that take a condition or mask.
tapegrad::Tensor pattern_mask(const tapegrad::Shape& shape);
bool pattern_value(std::int64_t flat);
// Deterministic ids in [0, n) (with repeats) for ops that take int64 indices or targets.
tapegrad::Tensor pattern_ids(const tapegrad::Shape& shape, std::int64_t n);
std::int64_t pattern_id(std::int64_t flat, std::int64_t n);

}  // namespace tg_test
