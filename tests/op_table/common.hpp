// Internal to the op table: the helpers its family files share (sample shapes, error inputs,
// entry builders for the common kinds of op).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/ranges.h>

#include "op_table.hpp"

namespace tg_test::table {
namespace tg = tapegrad;
using tg::Shape;
using tg::Tensor;
using Ins = std::vector<Tensor>;
using Outs = std::vector<Tensor>;
using Refs = std::vector<Ref>;


// Functions, not globals: the table is built while Boost.Test registers its data test cases,
// during static initialisation, when another file's globals may not exist yet.
// Zero-size samples include a long dim: its strides multiply the other sizes all the same.
constexpr std::int64_t kLong = std::int64_t{1} << 20;
inline std::vector<std::vector<Shape>> unary_shapes() { return {{{3, 4}}, {{2, 3, 4}}, {{5}}, {{}}, {{1, 4}}, {{0, 3}}, {{0, kLong}}}; }
inline std::vector<std::vector<Shape>> binary_shapes() {
  return {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{1}, {2, 3}}, {{}, {3}}, {{0, 3}, {3}}, {{kLong, 0}, {0}}};
}

// Shapes whose sizes, 0 counted as 1, pass the 2^48 addressable bytes.
inline const Shape kHugeEmpty{0, std::int64_t{1} << 62, 4};
// Two views that broadcast to [2^25, 2^25]: 2^50 elements, too many for any dtype.
inline Tensor huge_column(tg::DType dtype = tg::float32) { return tg::expand(tg::zeros({1, 1}, dtype), {std::int64_t{1} << 25, 1}); }
inline Tensor huge_row(tg::DType dtype = tg::float32) { return tg::expand(tg::zeros({1, 1}, dtype), {1, std::int64_t{1} << 25}); }
inline ErrorInput result_too_large(const std::string& name, std::function<void()> call) {
  return {"result too large to address", std::move(call), Raises::shape, {name, "result shape", "[33554432, 33554432]", "addressed"}};
}

inline Tensor f32(const Shape& s) { return tg::zeros(s, tg::float32); }

// x [..., L, C] with the rows i where flagged(i) replaced by `value` (selected: the gradient
// there is exactly 0, as is the numeric derivative).
template <class Flag> Tensor with_rows(const Tensor& x, Flag flagged, double value) {
  std::vector<bool> rows;
  for (std::int64_t i = 0; i < x.size(-2); ++i) rows.push_back(flagged(i));
  return tg::where(tg::from_bools(rows, {x.size(-2), 1}), tg::scalar(value, x.dtype()), x);
}
inline Tensor f64(const Shape& s) { return tg::zeros(s, tg::float64); }

// `call` passes an undefined Tensor as argument `arg` of `fn`.
inline ErrorInput undefined_arg(const std::string& fn, const std::string& arg, std::function<void()> call) {
  return {"undefined '" + arg + "'", std::move(call), Raises::error, {fn + ": argument '" + arg + "'", "undefined"}};
}

inline ErrorInput bad_dtype_unary(const std::string& name, std::function<Tensor(const Tensor&)> f) {
  return {"integer input", [f] { f(tg::zeros({2, 3}, tg::int64)); }, Raises::dtype, {name, "'x'", "int64", "[2, 3]"}};
}

inline OpInfo unary(std::string name, std::function<Tensor(const Tensor&)> f, std::function<double(double)> ref,
             bool positive = false) {
  OpInfo info;
  info.name = name;
  info.covers = {name};
  info.samples = unary_shapes();
  info.op = [f](const Ins& in) { return Outs{f(in[0])}; };
  info.reference = [ref](const Refs& in) { return Refs{ref_map(in, [ref](const auto& x) { return ref(x[0]); })}; };
  info.positive = positive;
  info.errors = {bad_dtype_unary(name, f), undefined_arg(name, "x", [f] { f(Tensor()); })};
  return info;
}

inline std::vector<ErrorInput> binary_errors(const std::string& name, std::function<Tensor(const Tensor&, const Tensor&)> f) {
  return {
      {"shapes that do not broadcast", [f] { f(f32({3, 4}), f32({5})); }, Raises::shape, {name, "'b'", "[5]", "'a'", "[3, 4]"}},
      {"float32 with float64", [f] { f(f32({2}), f64({2})); }, Raises::dtype, {name, "float32", "float64", "same dtype"}},
      {"bool input", [f] { f(tg::zeros({2}, tg::bool_), f32({2})); }, Raises::dtype, {name, "'a'", "bool"}},
      result_too_large(name, [f] { f(huge_column(), huge_row()); }),
  };
}

inline OpInfo binary(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, std::function<double(double, double)> ref,
              bool positive = false) {
  OpInfo info;
  info.name = name;
  info.covers = {name};
  info.samples = binary_shapes();
  info.op = [f](const Ins& in) { return Outs{f(in[0], in[1])}; };
  info.reference = [ref](const Refs& in) { return Refs{ref_map(in, [ref](const auto& x) { return ref(x[0], x[1]); })}; };
  info.positive = positive;
  info.errors = binary_errors(name, f);
  return info;
}

inline OpInfo with_scalar(std::string name, std::function<Tensor(const Tensor&, double)> f, std::function<double(double, double)> ref) {
  OpInfo info;
  info.name = name + "_scalar";
  info.covers = {name};
  info.samples = unary_shapes();
  info.op = [f](const Ins& in) { return Outs{f(in[0], 1.75)}; };
  info.reference = [ref](const Refs& in) { return Refs{ref_map(in, [ref](const auto& x) { return ref(x[0], 1.75); })}; };
  info.errors = {{"bool input", [f] { f(tg::zeros({2}, tg::bool_), 1.0); }, Raises::dtype, {name, "'a'", "bool"}}};
  return info;
}

inline OpInfo compare(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, std::function<bool(double, double)> ref) {
  OpInfo info;
  info.name = name;
  info.covers = {name};
  info.differentiable = false;
  // The inputs as given, then rounded (trunc(2x)) so that ties are common and eq/le/ge see
  // both outcomes.
  info.samples = {{{3, 4}, {3, 4}}, {{2, 1, 4}, {3, 1}}, {{}, {3}}};
  info.op = [f](const Ins& in) {
    const Tensor raw = f(in[0], in[1]);
    auto rounded = [](const Tensor& x) { return tg::to(tg::to(tg::mul(x, 2.0), tg::int64), x.dtype()); };
    return Outs{tg::to(raw, in[0].dtype()), tg::to(f(rounded(in[0]), rounded(in[1])), in[0].dtype())};
  };
  info.reference = [ref](const Refs& in) {
    return Refs{ref_map(in, [ref](const auto& x) { return ref(x[0], x[1]) ? 1.0 : 0.0; }),
                ref_map(in, [ref](const auto& x) { return ref(std::trunc(2 * x[0]), std::trunc(2 * x[1])) ? 1.0 : 0.0; })};
  };
  info.errors = {{"mixed dtypes", [f] { f(f32({2}), f64({2})); }, Raises::dtype, {name, "'a'", "'b'", "same dtype"}},
                 {"shapes that do not broadcast", [f] { f(f32({2}), f32({3})); }, Raises::shape, {name, "[2]", "[3]"}},
                 result_too_large(name, [f] { f(huge_column(), huge_row()); })};
  return info;
}

inline OpInfo logic(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, std::function<bool(bool, bool)> ref) {
  OpInfo info;
  info.name = name;
  info.covers = {name};
  info.differentiable = false;
  info.samples = {{{3, 4}, {3, 4}}, {{2, 1, 4}, {3, 1}}};
  info.op = [f](const Ins& in) {
    const Tensor zero = tg::scalar(0.0, in[0].dtype());
    return Outs{tg::to(f(tg::gt(in[0], zero), tg::gt(in[1], zero)), in[0].dtype())};
  };
  info.reference = [ref](const Refs& in) {
    return Refs{ref_map(in, [ref](const auto& x) { return ref(x[0] > 0, x[1] > 0) ? 1.0 : 0.0; })};
  };
  info.errors = {{"float input", [f] { f(f32({2}), tg::zeros({2}, tg::bool_)); }, Raises::dtype, {name, "'a'", "bool", "float32"}},
                 result_too_large(name, [f] { f(huge_column(tg::bool_), huge_row(tg::bool_)); }),
                 undefined_arg(name, "a", [f] { f(Tensor(), tg::mask({true})); }),
                 undefined_arg(name, "b", [f] { f(tg::mask({true}), Tensor()); })};
  info.undefined_inputs_unreachable = "op makes its bool inputs with gt";
  return info;
}

inline double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
inline double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// A reduction entry for one (dims, keepdim) choice over several shapes.
inline OpInfo reduction_case(std::string name, std::function<Tensor(const Tensor&, const tg::Dims&, bool)> f,
                      std::function<double(const std::vector<double>&)> ref, tg::Dims dims, bool keepdim,
                      std::vector<std::vector<Shape>> samples) {
  OpInfo info;
  info.name = fmt::format("{}(dims={}, keepdim={})", name, dims, keepdim);
  info.covers = {name};
  info.samples = std::move(samples);
  info.op = [f, dims, keepdim](const Ins& in) { return Outs{f(in[0], dims, keepdim)}; };
  info.reference = [ref, dims, keepdim](const Refs& in) { return Refs{ref_reduce(in[0], dims, keepdim, ref)}; };
  info.errors = {
      {"dim out of range", [f] { f(f32({2, 3}), {2}, false); }, Raises::shape, {name, "'dims'", "rank 2"}},
      {"dim named twice", [f] { f(f32({2, 3}), {1, -1}, false); }, Raises::shape, {name, "'dims'", "twice", "[2, 3]"}},
      {"integer input", [f] { f(tg::zeros({2}, tg::int64), {0}, false); }, Raises::dtype, {name, "'x'", "int64"}},
  };
  return info;
}

inline OpInfo view_op(std::string name, std::vector<std::string> covers, std::vector<std::vector<Shape>> samples,
               std::function<Tensor(const Tensor&)> f, std::function<Ref(const Ref&)> ref, std::vector<ErrorInput> errors) {
  OpInfo info;
  info.name = std::move(name);
  info.covers = std::move(covers);
  info.samples = std::move(samples);
  info.op = [f](const Ins& in) { return Outs{f(in[0])}; };
  info.reference = [ref](const Refs& in) { return Refs{ref(in[0])}; };
  info.errors = std::move(errors);
  return info;
}

inline Ref ref_reshape(const Ref& r, Shape s) { return {std::move(s), r.v}; }

inline Ref ref_permute(const Ref& r, const std::vector<std::int64_t>& dims) {
  Shape shape;
  for (auto d : dims) shape.push_back(r.shape[static_cast<std::size_t>(d)]);
  return ref_gather(r, shape, [&](const std::vector<std::int64_t>& out) {
    std::vector<std::int64_t> in(out.size());
    for (std::size_t i = 0; i < dims.size(); ++i) in[static_cast<std::size_t>(dims[i])] = out[i];
    return in;
  });
}

// One adder per family file, called in this order by op_table().
void add_elementwise(std::vector<OpInfo>& t);
void add_reductions(std::vector<OpInfo>& t);
void add_views(std::vector<OpInfo>& t);
void add_softmax(std::vector<OpInfo>& t);
void add_attention(std::vector<OpInfo>& t);
void add_matmul(std::vector<OpInfo>& t);
void add_indexing(std::vector<OpInfo>& t);
void add_losses(std::vector<OpInfo>& t);
void add_normalization(std::vector<OpInfo>& t);
void add_rotary(std::vector<OpInfo>& t);
void add_attention_paths(std::vector<OpInfo>& t);

}  // namespace tg_test::table
