#include "op_table.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <tuple>

#include <fmt/ranges.h>

namespace tg_test {
namespace tg = tapegrad;
using tg::Shape;
using tg::Tensor;
using Ins = std::vector<Tensor>;
using Outs = std::vector<Tensor>;
using Refs = std::vector<Ref>;

namespace {
thread_local ArgCollector* collector = nullptr;
}  // namespace

ArgCollector::ArgCollector() : previous_(collector) { collector = this; }
ArgCollector::~ArgCollector() { collector = previous_; }

Tensor arg(Tensor t) {
  if (collector != nullptr) collector->args.push_back(t);
  return t;
}

bool pattern_value(std::int64_t flat) { return (flat * 7) % 3 != 0; }

Tensor pattern_mask(const Shape& shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<bool> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(pattern_value(i));
  return arg(tg::from_bools(v, shape));
}

std::int64_t pattern_id(std::int64_t flat, std::int64_t n) { return (flat * 5 + 2) % n; }

Tensor pattern_ids(const Shape& shape, std::int64_t n) {
  std::int64_t count = 1;
  for (auto s : shape) count *= s;
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < count; ++i) v.push_back(pattern_id(i, n));
  return arg(tg::from_vector(std::span<const std::int64_t>(v), shape));
}

namespace {

// Functions, not globals: Boost.Test builds the table while registering data test cases, during
// static initialisation, when another file's globals may not exist yet.
// Zero-size samples include a long dim: its strides multiply the other sizes all the same.
constexpr std::int64_t kLong = std::int64_t{1} << 20;
std::vector<std::vector<Shape>> unary_shapes() { return {{{3, 4}}, {{2, 3, 4}}, {{5}}, {{}}, {{1, 4}}, {{0, 3}}, {{0, kLong}}}; }
std::vector<std::vector<Shape>> binary_shapes() {
  return {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{1}, {2, 3}}, {{}, {3}}, {{0, 3}, {3}}, {{kLong, 0}, {0}}};
}

// Shapes whose sizes, 0 counted as 1, pass the 2^48 addressable bytes.
const Shape kHugeEmpty{0, std::int64_t{1} << 62, 4};
// Two views that broadcast to [2^25, 2^25]: 2^50 elements, too many for any dtype.
Tensor huge_column(tg::DType dtype = tg::float32) { return tg::expand(tg::zeros({1, 1}, dtype), {std::int64_t{1} << 25, 1}); }
Tensor huge_row(tg::DType dtype = tg::float32) { return tg::expand(tg::zeros({1, 1}, dtype), {1, std::int64_t{1} << 25}); }
ErrorInput result_too_large(const std::string& name, std::function<void()> call) {
  return {"result too large to address", std::move(call), Raises::shape, {name, "result shape", "[33554432, 33554432]", "addressed"}};
}

Tensor f32(const Shape& s) { return tg::zeros(s, tg::float32); }

// x [..., L, C] with the rows i where flagged(i) replaced by `value` (selected: the gradient
// there is exactly 0, as is the numeric derivative).
template <class Flag> Tensor with_rows(const Tensor& x, Flag flagged, double value) {
  std::vector<bool> rows;
  for (std::int64_t i = 0; i < x.size(-2); ++i) rows.push_back(flagged(i));
  return tg::where(tg::from_bools(rows, {x.size(-2), 1}), tg::scalar(value, x.dtype()), x);
}
Tensor f64(const Shape& s) { return tg::zeros(s, tg::float64); }

// `call` passes an undefined Tensor as argument `arg` of `fn`.
ErrorInput undefined_arg(const std::string& fn, const std::string& arg, std::function<void()> call) {
  return {"undefined '" + arg + "'", std::move(call), Raises::error, {fn + ": argument '" + arg + "'", "undefined"}};
}

ErrorInput bad_dtype_unary(const std::string& name, std::function<Tensor(const Tensor&)> f) {
  return {"integer input", [f] { f(tg::zeros({2, 3}, tg::int64)); }, Raises::dtype, {name, "'x'", "int64", "[2, 3]"}};
}

OpInfo unary(std::string name, std::function<Tensor(const Tensor&)> f, std::function<double(double)> ref,
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

std::vector<ErrorInput> binary_errors(const std::string& name, std::function<Tensor(const Tensor&, const Tensor&)> f) {
  return {
      {"shapes that do not broadcast", [f] { f(f32({3, 4}), f32({5})); }, Raises::shape, {name, "'b'", "[5]", "'a'", "[3, 4]"}},
      {"float32 with float64", [f] { f(f32({2}), f64({2})); }, Raises::dtype, {name, "float32", "float64", "same dtype"}},
      {"bool input", [f] { f(tg::zeros({2}, tg::bool_), f32({2})); }, Raises::dtype, {name, "'a'", "bool"}},
      result_too_large(name, [f] { f(huge_column(), huge_row()); }),
  };
}

OpInfo binary(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, std::function<double(double, double)> ref,
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

OpInfo with_scalar(std::string name, std::function<Tensor(const Tensor&, double)> f, std::function<double(double, double)> ref) {
  OpInfo info;
  info.name = name + "_scalar";
  info.covers = {name};
  info.samples = unary_shapes();
  info.op = [f](const Ins& in) { return Outs{f(in[0], 1.75)}; };
  info.reference = [ref](const Refs& in) { return Refs{ref_map(in, [ref](const auto& x) { return ref(x[0], 1.75); })}; };
  info.errors = {{"bool input", [f] { f(tg::zeros({2}, tg::bool_), 1.0); }, Raises::dtype, {name, "'a'", "bool"}}};
  return info;
}

OpInfo compare(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, std::function<bool(double, double)> ref) {
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

OpInfo logic(std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, std::function<bool(bool, bool)> ref) {
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

double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// A reduction entry for one (dims, keepdim) choice over several shapes.
OpInfo reduction_case(std::string name, std::function<Tensor(const Tensor&, const tg::Dims&, bool)> f,
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

OpInfo view_op(std::string name, std::vector<std::string> covers, std::vector<std::vector<Shape>> samples,
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

Ref ref_reshape(const Ref& r, Shape s) { return {std::move(s), r.v}; }

Ref ref_permute(const Ref& r, const std::vector<std::int64_t>& dims) {
  Shape shape;
  for (auto d : dims) shape.push_back(r.shape[static_cast<std::size_t>(d)]);
  return ref_gather(r, shape, [&](const std::vector<std::int64_t>& out) {
    std::vector<std::int64_t> in(out.size());
    for (std::size_t i = 0; i < dims.size(); ++i) in[static_cast<std::size_t>(dims[i])] = out[i];
    return in;
  });
}

std::vector<OpInfo> build() {
  std::vector<OpInfo> t;
  // Elementwise binary.
  t.push_back(binary("add", [](auto& a, auto& b) { return tg::add(a, b); }, [](double x, double y) { return x + y; }));
  t.push_back(binary("sub", [](auto& a, auto& b) { return tg::sub(a, b); }, [](double x, double y) { return x - y; }));
  t.push_back(binary("mul", [](auto& a, auto& b) { return tg::mul(a, b); }, [](double x, double y) { return x * y; }));
  t.push_back(binary("div", [](auto& a, auto& b) { return tg::div(a, b); }, [](double x, double y) { return x / y; }, true));
  t.push_back(with_scalar("add", [](auto& a, double s) { return tg::add(a, s); }, [](double x, double s) { return x + s; }));
  t.push_back(with_scalar("sub", [](auto& a, double s) { return tg::sub(a, s); }, [](double x, double s) { return x - s; }));
  t.push_back(with_scalar("mul", [](auto& a, double s) { return tg::mul(a, s); }, [](double x, double s) { return x * s; }));
  t.push_back(with_scalar("div", [](auto& a, double s) { return tg::div(a, s); }, [](double x, double s) { return x / s; }));
  t.push_back(binary("operators", [](auto& a, auto& b) { return (a + b) * (a - b) / (b * b + 1.0) + 2.0 * -a; },
                     [](double x, double y) { return (x + y) * (x - y) / (y * y + 1.0) + 2.0 * -x; }));
  t.back().errors.clear();  // the operators are the named ops above, whose errors are checked there
  t.back().covers = {"operators", "add", "sub", "mul", "div", "neg"};  // errors name the function

  // Elementwise unary.
  t.push_back(unary("neg", [](auto& x) { return tg::neg(x); }, [](double x) { return -x; }));
  t.push_back(unary("exp", [](auto& x) { return tg::exp(x); }, [](double x) { return std::exp(x); }));
  t.push_back(unary("log", [](auto& x) { return tg::log(x); }, [](double x) { return std::log(x); }, true));
  t.push_back(unary("sqrt", [](auto& x) { return tg::sqrt(x); }, [](double x) { return std::sqrt(x); }, true));
  t.push_back(unary("tanh", [](auto& x) { return tg::tanh(x); }, [](double x) { return std::tanh(x); }));
  t.push_back(unary("relu", [](auto& x) { return tg::relu(x); }, [](double x) { return x < 0 ? 0.0 : x; }));
  t.push_back(unary("gelu", [](auto& x) { return tg::gelu(x); },
                    [](double x) { return 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2)); }));
  for (double p : {2.0, 0.0, -1.5, 2.5}) {
    auto info = unary("pow", [p](auto& x) { return tg::pow(x, p); }, [p](double x) { return std::pow(x, p); }, true);
    info.name = fmt::format("pow({})", p);
    info.errors.push_back({"non-finite exponent", [] { tg::pow(f32({2}), std::nan("")); }, Raises::value, {"pow", "'exponent'", "finite"}});
    t.push_back(info);
  }

  // Comparisons and logic (not differentiable: forward and errors only).
  t.push_back(compare("eq", [](auto& a, auto& b) { return tg::eq(a, b); }, [](double x, double y) { return x == y; }));
  t.push_back(compare("ne", [](auto& a, auto& b) { return tg::ne(a, b); }, [](double x, double y) { return x != y; }));
  t.push_back(compare("lt", [](auto& a, auto& b) { return tg::lt(a, b); }, [](double x, double y) { return x < y; }));
  t.push_back(compare("le", [](auto& a, auto& b) { return tg::le(a, b); }, [](double x, double y) { return x <= y; }));
  t.push_back(compare("gt", [](auto& a, auto& b) { return tg::gt(a, b); }, [](double x, double y) { return x > y; }));
  t.push_back(compare("ge", [](auto& a, auto& b) { return tg::ge(a, b); }, [](double x, double y) { return x >= y; }));
  t.push_back(logic("logical_and", [](auto& a, auto& b) { return tg::logical_and(a, b); }, [](bool x, bool y) { return x && y; }));
  t.push_back(logic("logical_or", [](auto& a, auto& b) { return tg::logical_or(a, b); }, [](bool x, bool y) { return x || y; }));
  {
    OpInfo info;
    info.name = "logical_not/any/all";
    info.covers = {"logical_not", "any", "all"};
    info.differentiable = false;
    info.samples = {{{3, 4}}, {{5}}, {{}}};
    info.op = [](const Ins& in) {
      const Tensor m = tg::gt(in[0], tg::scalar(0.0, in[0].dtype()));
      const Tensor n = tg::logical_not(m);
      return Outs{tg::to(n, in[0].dtype()), tg::scalar(tg::any(n) ? 1 : 0, in[0].dtype()),
                  tg::scalar(tg::all(m) ? 1 : 0, in[0].dtype())};
    };
    info.reference = [](const Refs& in) {
      bool any_not = false, all_pos = true;
      for (double v : in[0].v) {
        any_not = any_not || !(v > 0);
        all_pos = all_pos && v > 0;
      }
      return Refs{ref_map(in, [](const auto& x) { return x[0] > 0 ? 0.0 : 1.0; }), Ref{{}, {any_not ? 1.0 : 0.0}},
                  Ref{{}, {all_pos ? 1.0 : 0.0}}};
    };
    info.errors = {{"float input", [] { tg::logical_not(f32({2})); }, Raises::dtype, {"logical_not", "'a'", "bool"}},
                   {"float input", [] { tg::any(f32({2})); }, Raises::dtype, {"any", "'a'", "bool"}},
                   undefined_arg("logical_not", "a", [] { tg::logical_not(Tensor()); }),
                   undefined_arg("any", "a", [] { tg::any(Tensor()); }),
                   undefined_arg("all", "a", [] { tg::all(Tensor()); })};
    info.undefined_inputs_unreachable = "op makes its bool input with gt";
    t.push_back(info);
  }

  // Selection.
  {
    OpInfo info;
    info.name = "where";
    info.covers = {"where"};
    info.samples = {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{}, {3}}};
    info.op = [](const Ins& in) {
      return Outs{tg::where(pattern_mask(tg::broadcast_shapes(in[0].shape(), in[1].shape())), in[0], in[1])};
    };
    info.reference = [](const Refs& in) {
      Ref out = ref_map(in, [](const auto& x) { return x[0]; });
      Ref other = ref_map(in, [](const auto& x) { return x[1]; });
      for (std::size_t i = 0; i < out.v.size(); ++i)
        if (!pattern_value(static_cast<std::int64_t>(i))) out.v[i] = other.v[i];
      return Refs{out};
    };
    info.errors = {{"float condition", [] { tg::where(f32({2}), f32({2}), f32({2})); }, Raises::dtype, {"where", "'cond'", "bool", "float32"}},
                   {"mixed dtypes", [] { tg::where(tg::mask({true}), f32({1}), f64({1})); }, Raises::dtype, {"where", "'a'", "'b'"}},
                   {"condition that does not broadcast", [] { tg::where(tg::zeros({3}, tg::bool_), f32({2}), f32({2})); },
                    Raises::shape, {"where", "'cond'", "[3]", "[2]"}},
                   result_too_large("where", [] { tg::where(tg::mask({true}), huge_column(), huge_row()); }),
                   undefined_arg("where", "cond", [] { tg::where(Tensor(), f32({2}), f32({2})); }),
                   undefined_arg("where", "a", [] { tg::where(tg::mask({true}), Tensor(), f32({2})); }),
                   undefined_arg("where", "b", [] { tg::where(tg::mask({true}), f32({2}), Tensor()); })};
    info.undefined_inputs_unreachable = "op builds the condition from the inputs' shapes";
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "masked_fill";
    info.covers = {"masked_fill"};
    info.samples = {{{3, 4}}, {{2, 3, 4}}, {{5}}};
    info.op = [](const Ins& in) {
      const Shape& s = in[0].shape();
      return Outs{tg::masked_fill(in[0], pattern_mask(Shape(s.end() - 1, s.end())), -3.5)};
    };
    info.reference = [](const Refs& in) {
      Ref out = in[0];
      const std::int64_t last = in[0].shape.back();
      for (std::size_t i = 0; i < out.v.size(); ++i)
        if (pattern_value(static_cast<std::int64_t>(i) % last)) out.v[i] = -3.5;
      return Refs{out};
    };
    info.errors = {{"mask larger than x", [] { tg::masked_fill(f32({4}), tg::zeros({3, 4}, tg::bool_), 0.0); }, Raises::shape,
                    {"masked_fill", "'mask'", "[3, 4]", "[4]"}},
                   {"float mask", [] { tg::masked_fill(f32({4}), f32({4}), 0.0); }, Raises::dtype, {"masked_fill", "'mask'", "bool"}},
                   undefined_arg("masked_fill", "x", [] { tg::masked_fill(Tensor(), tg::mask({true}), 0.0); }),
                   undefined_arg("masked_fill", "mask", [] { tg::masked_fill(f32({4}), Tensor(), 0.0); })};
    info.undefined_inputs_unreachable = "op builds the mask from the input's shape";
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "to";
    info.covers = {"to"};
    info.samples = unary_shapes();
    // There and back through the other float dtype: the values round to float32 on the way.
    info.op = [](const Ins& in) {
      const tg::DType other = in[0].dtype() == tg::float64 ? tg::float32 : tg::float64;
      return Outs{tg::to(tg::to(in[0], other), in[0].dtype())};
    };
    info.reference = [](const Refs& in) {
      return Refs{ref_map(in, [](const auto& x) { return static_cast<double>(static_cast<float>(x[0])); })};
    };
    // The cast is linear, so a large step has no truncation error and keeps float32 rounding
    // (~1e-7 |x|) small next to 2 eps.
    info.grad.eps = 1e-2;
    info.grad.atol = 1e-4;
    info.errors = {undefined_arg("to", "x", [] { tg::to(Tensor(), tg::float32); })};
    info.undefined_inputs_unreachable = "op reads the input's dtype to pick the other one";
    t.push_back(info);
  }

  // Reductions.
  const std::vector<std::vector<Shape>> rs = {{{3, 4}}, {{2, 3, 4}}, {{1, 4}}};
  for (auto [dims, keep] : std::vector<std::pair<tg::Dims, bool>>{{{1}, false}, {{0}, true}, {{-1}, true}, {{}, false}, {{}, true}}) {
    t.push_back(reduction_case("sum", [](auto& x, auto& d, bool k) { return tg::sum(x, d, k); }, sum_of, dims, keep, rs));
    t.push_back(reduction_case("mean", [](auto& x, auto& d, bool k) { return tg::mean(x, d, k); },
                               [](const auto& v) { return sum_of(v) / static_cast<double>(v.size()); }, dims, keep, rs));
    auto mx = reduction_case("max", [](auto& x, auto& d, bool k) { return tg::max(x, d, k); }, max_of, dims, keep, rs);
    mx.errors.push_back({"zero-size reduced dim", [] { tg::max(f32({0, 3}), {0}, false); }, Raises::shape, {"max", "zero-size", "[0, 3]"}});
    t.push_back(mx);
  }
  t.push_back(reduction_case("sum", [](auto& x, auto& d, bool k) { return tg::sum(x, d, k); }, sum_of, {0, 2}, false, {{{2, 3, 4}}, {{2, 0, 4}}}));
  {
    OpInfo info;
    info.name = "sum/mean/max of all";
    info.covers = {"sum", "mean", "max"};
    info.samples = {{{3, 4}}, {{5}}, {{}}};
    info.op = [](const Ins& in) { return Outs{tg::sum(in[0]), tg::mean(in[0]), tg::max(in[0])}; };
    info.reference = [](const Refs& in) {
      return Refs{Ref{{}, {sum_of(in[0].v)}}, Ref{{}, {sum_of(in[0].v) / static_cast<double>(in[0].v.size())}}, Ref{{}, {max_of(in[0].v)}}};
    };
    t.push_back(info);
  }

  // Views.
  t.push_back(view_op("reshape", {"reshape", "flatten"}, {{{3, 4}}, {{2, 3, 4}}, {{12}}, {{0, 4}}},
                      [](auto& x) { return tg::reshape(x, {-1, 2}); }, [](const Ref& r) { return ref_reshape(r, {r.numel() / 2, 2}); },
                      {{"element count mismatch", [] { tg::reshape(f32({3, 4}), {5, 2}); }, Raises::shape, {"reshape", "'shape'", "[5, 2]", "[3, 4]"}},
                       {"two -1", [] { tg::reshape(f32({3, 4}), {-1, -1}); }, Raises::shape, {"reshape", "-1"}},
                       {"zero-size shape too large", [] { tg::reshape(f32({0}), kHugeEmpty); }, Raises::shape, {"reshape", "'shape'", "addressed"}},
                       {"-1 inferred into a shape too large", [] { tg::reshape(f32({0, 4}), {-1, std::int64_t{1} << 62}); }, Raises::shape,
                        {"reshape", "'shape'", "addressed"}}}));
  t.push_back(view_op("flatten", {"flatten"}, {{{3, 4}}, {{2, 3, 4}}, {{}}}, [](auto& x) { return tg::flatten(x); },
                      [](const Ref& r) { return ref_reshape(r, {r.numel()}); }, {}));
  t.push_back(view_op("permute", {"permute", "Tensor::permute"}, {{{2, 3, 4}}, {{1, 3, 2}}, {{2, 0, 3}}},
                      [](auto& x) { return tg::permute(x, {2, 0, 1}); }, [](const Ref& r) { return ref_permute(r, {2, 0, 1}); },
                      {{"wrong length", [] { tg::permute(f32({2, 3}), {0}); }, Raises::shape, {"permute", "'dims'", "[2, 3]"}},
                       {"repeated dim", [] { tg::permute(f32({2, 3}), {1, 1}); }, Raises::shape, {"permute", "repeats", "[2, 3]"}}}));
  t.push_back(view_op("transpose", {"transpose"}, {{{3, 4}}, {{2, 3, 4}}}, [](auto& x) { return tg::transpose(x, 0, -1); },
                      [](const Ref& r) {
                        std::vector<std::int64_t> d(r.shape.size());
                        for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::int64_t>(i);
                        std::swap(d.front(), d.back());
                        return ref_permute(r, d);
                      },
                      {{"dim out of range", [] { tg::transpose(f32({2, 3}), 0, 2); }, Raises::shape, {"transpose", "'dim1'", "rank 2"}}}));
  t.push_back(view_op("slice", {"slice"}, {{{5, 4}}, {{7, 2, 3}}, {{1, 3}}, {{4, 0}}}, [](auto& x) { return tg::slice(x, 0, 1, -1, 2); },
                      [](const Ref& r) {
                        Shape s = r.shape;
                        s[0] = (s[0] - 1 - 1 + 1) / 2;
                        return ref_gather(r, s, [](auto idx) { idx[0] = 1 + 2 * idx[0]; return idx; });
                      },
                      {{"zero step", [] { tg::slice(f32({4}), 0, 0, 4, 0); }, Raises::value, {"slice", "'step'", "[4]"}},
                       {"dim out of range", [] { tg::slice(f32({4}), 1, 0, 4); }, Raises::shape, {"slice", "'dim'", "rank 1"}}}));
  t.push_back(view_op("narrow", {"narrow"}, {{{3, 5}}, {{2, 6}}}, [](auto& x) { return tg::narrow(x, 1, 1, 3); },
                      [](const Ref& r) {
                        Shape s = r.shape;
                        s[1] = 3;
                        return ref_gather(r, s, [](auto idx) { idx[1] += 1; return idx; });
                      },
                      {{"past the end", [] { tg::narrow(f32({3, 5}), 1, 3, 3); }, Raises::shape, {"narrow", "start = 3", "length = 3", "size 5", "[3, 5]"}}}));
  t.push_back(view_op("select", {"select"}, {{{3, 4}}, {{2, 3, 4}}}, [](auto& x) { return tg::select(x, 1, -1); },
                      [](const Ref& r) {
                        Shape s = r.shape;
                        const std::int64_t last = s[1] - 1;
                        s.erase(s.begin() + 1);
                        return ref_gather(r, s, [last](auto idx) { idx.insert(idx.begin() + 1, last); return idx; });
                      },
                      {{"index out of range", [] { tg::select(f32({3, 4}), 1, 4); }, Raises::shape, {"select", "'index'", "size 4", "[3, 4]"}}}));
  t.push_back(view_op("expand", {"expand", "broadcast_to"}, {{{3, 1}}, {{1}}, {{4}}, {{2, 1, 4}}},
                      [](auto& x) { return tg::broadcast_to(x, {2, 3, 4}); },
                      [](const Ref& r) {
                        Ref out{{2, 3, 4}, {}};
                        for (std::int64_t i = 0; i < out.numel(); ++i) out.v.push_back(r.at_broadcast(out.unravel(i)));
                        return out;
                      },
                      {{"incompatible size", [] { tg::expand(f32({3, 2}), {3, 4}); }, Raises::shape, {"expand", "[3, 2]", "[3, 4]"}},
                       {"fewer dims", [] { tg::expand(f32({3, 2}), {2}); }, Raises::shape, {"expand", "fewer dims"}},
                       {"zero-size shape too large", [] { tg::expand(f32({0, 1, 1}), kHugeEmpty); }, Raises::shape, {"expand", "result shape", "addressed"}},
                       {"zero-size shape too large", [] { tg::broadcast_to(f32({0, 1, 1}), kHugeEmpty); }, Raises::shape,
                        {"broadcast_to", "result shape", "addressed"}}}));
  t.push_back(view_op("squeeze/unsqueeze", {"squeeze", "unsqueeze"}, {{{3, 1, 4}}, {{1, 1, 2}}},
                      [](auto& x) { return tg::unsqueeze(tg::squeeze(x, 1), -1); },
                      [](const Ref& r) { return ref_reshape(r, {r.shape[0], r.shape[2], 1}); },
                      {{"squeeze a non-1 dim", [] { tg::squeeze(f32({3, 2}), 1); }, Raises::shape, {"squeeze", "size 2", "[3, 2]"}},
                       {"unsqueeze out of range", [] { tg::unsqueeze(f32({3}), 3); }, Raises::shape, {"unsqueeze", "'dim'"}}}));
  t.push_back(view_op("contiguous", {"contiguous", "Tensor::contiguous"}, unary_shapes(), [](auto& x) { return tg::contiguous(x); },
                      [](const Ref& r) { return r; }, {}));

  // Joins.
  {
    OpInfo info;
    info.name = "concat";
    info.covers = {"concat"};
    info.samples = {{{2, 3}, {4, 3}, {1, 3}}, {{2, 1, 2}, {2, 3, 2}, {2, 2, 2}}, {{2, 3}, {0, 3}, {1, 3}}};
    info.op = [](const Ins& in) { return Outs{tg::concat(in, -2)}; };  // dim 0 of the rank-2 samples, 1 of the rank-3
    info.reference = [](const Refs& in) {
      const std::size_t d = in[0].shape.size() == 2 ? 0 : 1;
      Shape s = in[0].shape;
      s[d] = 0;
      for (const auto& r : in) s[d] += r.shape[d];
      Ref out{s, {}};
      for (std::int64_t i = 0; i < out.numel(); ++i) {
        auto idx = out.unravel(i);
        std::size_t k = 0;
        while (idx[d] >= in[k].shape[d]) idx[d] -= in[k++].shape[d];
        out.v.push_back(in[k].v[static_cast<std::size_t>(in[k].ravel(idx))]);
      }
      return Refs{out};
    };
    info.errors = {{"mismatched shapes", [] { tg::concat({f32({2, 3}), f32({2, 4})}, 0); }, Raises::shape, {"concat", "'tensors[1]'", "[2, 4]", "[2, 3]"}},
                   {"no tensors", [] { tg::concat({}, 0); }, Raises::value, {"concat", "'tensors'", "empty"}},
                   {"mixed dtypes", [] { tg::concat({f32({2}), f64({2})}, 0); }, Raises::dtype, {"concat", "'tensors[1]'", "float64"}},
                   {"zero-size result too large", [] { tg::concat({f32({0, std::int64_t{1} << 46}), f32({0, std::int64_t{1} << 46})}, 1); },
                    Raises::shape, {"concat", "result shape", "addressed"}}};
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "stack";
    info.covers = {"stack"};
    info.samples = {{{2, 3}, {2, 3}}, {{4}, {4}, {4}}, {{0}, {0}}};
    info.op = [](const Ins& in) { return Outs{tg::stack(in, -1)}; };
    info.reference = [](const Refs& in) {
      Shape s = in[0].shape;
      s.push_back(static_cast<std::int64_t>(in.size()));
      Ref out{s, {}};
      for (std::int64_t i = 0; i < out.numel(); ++i) {
        auto idx = out.unravel(i);
        const auto k = static_cast<std::size_t>(idx.back());
        idx.pop_back();
        out.v.push_back(in[k].v[static_cast<std::size_t>(in[k].ravel(idx))]);
      }
      return Refs{out};
    };
    info.errors = {{"mismatched shapes", [] { tg::stack({f32({2, 3}), f32({3, 2})}, 0); }, Raises::shape, {"stack", "'tensors[1]'", "[3, 2]", "[2, 3]"}},
                   {"mixed dtypes", [] { tg::stack({f32({2}), f64({2})}, 0); }, Raises::dtype, {"stack", "'tensors[1]'", "float64"}},
                   {"zero-size result too large", [] { tg::stack({f32({0, std::int64_t{1} << 46}), f32({0, std::int64_t{1} << 46})}, 0); },
                    Raises::shape, {"stack", "result shape", "addressed"}}};
    t.push_back(info);
  }

  // Masked softmax over the last dim, with the mask pattern broadcast from the last dim.
  {
    OpInfo info;
    info.name = "masked_softmax";
    info.covers = {"masked_softmax"};
    info.samples = {{{3, 5}}, {{2, 3, 4}}, {{6}}, {{4, 1}}, {{2, 0}}};
    info.op = [](const Ins& in) {
      const Tensor plain = tg::masked_softmax(in[0]);
      const Shape& s = in[0].shape();
      return Outs{plain, tg::masked_softmax(in[0], pattern_mask(Shape(s.end() - 1, s.end())))};
    };
    info.reference = [](const Refs& in) {
      const Ref& s = in[0];
      const std::int64_t k = s.shape.back();
      Ref plain = s, masked = s;
      for (std::int64_t r = 0; k > 0 && r < s.numel() / k; ++r) {
        for (bool use_mask : {false, true}) {
          Ref& out = use_mask ? masked : plain;
          double m = -1e300, z = 0;
          bool any = false;
          for (std::int64_t j = 0; j < k; ++j)
            if (!use_mask || pattern_value(j)) m = std::max(m, s.v[static_cast<std::size_t>(r * k + j)]), any = true;
          for (std::int64_t j = 0; j < k; ++j) {
            const bool on = !use_mask || pattern_value(j);
            out.v[static_cast<std::size_t>(r * k + j)] = on ? std::exp(s.v[static_cast<std::size_t>(r * k + j)] - m) : 0.0;
            z += out.v[static_cast<std::size_t>(r * k + j)];
          }
          for (std::int64_t j = 0; j < k; ++j) out.v[static_cast<std::size_t>(r * k + j)] = any ? out.v[static_cast<std::size_t>(r * k + j)] / z : 0.0;
        }
      }
      return Refs{plain, masked};
    };
    info.errors = {{"integer scores", [] { tg::masked_softmax(tg::zeros({2}, tg::int64)); }, Raises::dtype, {"masked_softmax", "'scores'", "int64"}},
                   {"float mask", [] { tg::masked_softmax(f32({2}), f32({2})); }, Raises::dtype, {"masked_softmax", "'allowed'", "bool"}},
                   {"mask larger than scores", [] { tg::masked_softmax(f32({2}), tg::zeros({3, 2}, tg::bool_)); }, Raises::shape,
                    {"masked_softmax", "'allowed'", "[3, 2]", "[2]"}},
                   {"rank 0 scores", [] { tg::masked_softmax(f32({})); }, Raises::shape, {"masked_softmax", "rank >= 1"}}};
    t.push_back(info);
  }

  // Attention. The reference is plain loops (ref_matmul and a masked softmax written here);
  // the PyTorch cross-check (test_torch_reference) is a second, fully independent reference.
  {
    OpInfo info;
    info.name = "scaled_dot_product_attention";
    info.covers = {"scaled_dot_product_attention", "attention"};
    info.samples = {{{3, 4}, {5, 4}, {5, 2}}, {{2, 3, 4}, {1, 5, 4}, {5, 3}}, {{1, 1}, {1, 1}, {1, 1}}, {{2, 2, 3, 2}, {2, 1, 4, 2}, {4, 1}},
                    {{3, 2}, {0, 2}, {0, 4}}, {{0, 2}, {3, 2}, {3, 1}}};
    // Outputs 3 and 4 run again with NaN in the masked keys' k and the empty rows' q and inf in
    // the masked keys' v: they must equal outputs 0 and 1, gradients included. Outputs 2 and 5 are
    // attention(), the fused path (need_weights = false), clean and poisoned.
    info.op = [](const Ins& in) {
      const std::int64_t q = in[0].size(-2), k = in[1].size(-2);
      const Tensor mask = arg(tg::logical_and(tg::causal_mask(q, k, 1), pattern_mask({k})));
      auto [out, w] = tg::scaled_dot_product_attention(in[0], in[1], in[2], mask);
      const auto masked_key = [](std::int64_t j) { return !pattern_value(j); };
      const auto empty_row = [k](std::int64_t i) {
        for (std::int64_t j = 0; j < k && j <= i + 1; ++j)
          if (pattern_value(j)) return false;
        return true;
      };
      const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
      const Tensor q_p = with_rows(in[0], empty_row, nan), k_p = with_rows(in[1], masked_key, nan), v_p = with_rows(in[2], masked_key, inf);
      auto [out_p, w_p] = tg::scaled_dot_product_attention(q_p, k_p, v_p, mask);
      return Outs{out, w, tg::attention(in[0], in[1], in[2], mask), out_p, w_p, tg::attention(q_p, k_p, v_p, mask)};
    };
    info.reference = [](const Refs& in) {
      const Ref& q = in[0];
      const Ref& k = in[1];
      const std::int64_t nq = q.shape[q.shape.size() - 2], nk = k.shape[k.shape.size() - 2], d = q.shape.back();
      Ref kt = ref_gather(k, [&] { Shape s = k.shape; std::swap(s[s.size() - 1], s[s.size() - 2]); return s; }(),
                          [](auto idx) { std::swap(idx[idx.size() - 1], idx[idx.size() - 2]); return idx; });
      Ref w = ref_matmul(q, kt);
      for (std::int64_t r = 0; nk > 0 && r < w.numel() / nk; ++r) {
        const std::int64_t i = r % nq;
        double m = -1e300, z = 0;
        auto on = [&](std::int64_t j) { return j <= i + 1 && pattern_value(j); };
        bool any = false;
        for (std::int64_t j = 0; j < nk; ++j)
          if (on(j)) m = std::max(m, w.v[static_cast<std::size_t>(r * nk + j)] / std::sqrt(double(d))), any = true;
        for (std::int64_t j = 0; j < nk; ++j) {
          double& x = w.v[static_cast<std::size_t>(r * nk + j)];
          x = on(j) ? std::exp(x / std::sqrt(double(d)) - m) : 0.0;
          z += x;
        }
        for (std::int64_t j = 0; j < nk; ++j) w.v[static_cast<std::size_t>(r * nk + j)] = any ? w.v[static_cast<std::size_t>(r * nk + j)] / z : 0.0;
      }
      const Ref out = ref_matmul(w, in[2]);
      return Refs{out, w, out, out, w, out};
    };
    info.errors = {{"q of rank 1", [] { tg::scaled_dot_product_attention(f32({3}), f32({2, 3}), f32({2, 1})); }, Raises::shape,
                    {"scaled_dot_product_attention", "'q'", "rank >= 2"}},
                   {"mixed dtypes", [] { tg::scaled_dot_product_attention(f32({1, 3}), f64({2, 3}), f32({2, 1})); }, Raises::dtype,
                    {"scaled_dot_product_attention", "'q'", "'k'"}},
                   {"zero width D", [] { tg::attention(f32({2, 0}), f32({3, 0}), f32({3, 2})); }, Raises::shape, {"attention", "D must be >= 1", "[2, 0]"}}};
    for (const std::string fn : {"scaled_dot_product_attention", "attention"})
      for (std::size_t missing = 0; missing < 3; ++missing)
        info.errors.push_back(undefined_arg(fn, std::string(1, "qkv"[missing]), [fn, missing] {
          std::vector<Tensor> qkv{f32({2, 3}), f32({4, 3}), f32({4, 1})};
          qkv[missing] = Tensor();
          if (fn == "attention") tg::attention(qkv[0], qkv[1], qkv[2]);
          else tg::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]);
        }));
    info.undefined_inputs_unreachable = "op builds the mask from q's and k's sizes";
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "causal_mask";
    info.covers = {"causal_mask"};
    info.differentiable = false;
    info.samples = {{{3, 4}}, {{4, 2}}, {{1, 1}}};
    info.op = [](const Ins& in) {
      return Outs{tg::to(tg::causal_mask(in[0].size(0), in[0].size(1), -1), in[0].dtype()),
                  tg::to(tg::causal_mask(in[0].size(0), in[0].size(1), 2), in[0].dtype())};
    };
    info.reference = [](const Refs& in) {
      Ref a{in[0].shape, {}}, b{in[0].shape, {}};
      for (std::int64_t n = 0; n < a.numel(); ++n) {
        const auto idx = a.unravel(n);
        a.v.push_back(idx[1] <= idx[0] - 1 ? 1.0 : 0.0);
        b.v.push_back(idx[1] <= idx[0] + 2 ? 1.0 : 0.0);
      }
      return Refs{a, b};
    };
    info.errors = {{"negative size", [] { tg::causal_mask(2, -1); }, Raises::value, {"causal_mask", "'keys'", "-1"}},
                   {"too large", [] { tg::causal_mask(std::int64_t{1} << 40, std::int64_t{1} << 40); }, Raises::shape,
                    {"causal_mask", "result shape", "addressed"}}};
    info.undefined_inputs_unreachable = "causal_mask takes no tensor (op reads its sizes from the input)";
    t.push_back(info);
  }
  {
    // Property: multihead_attention equals the heads computed one by one with
    // scaled_dot_product_attention, concatenated and projected, with suppressed queries zeroed.
    OpInfo info;
    info.name = "multihead_attention";
    info.covers = {"multihead_attention"};
    info.samples = {{{2, 3, 4}, {2, 5, 3}, {4, 4}, {3, 4}, {3, 6}, {6, 2}}, {{1, 1, 2}, {1, 2, 2}, {2, 2}, {2, 2}, {2, 2}, {2, 3}}};
    auto masks = [](const Ins& in) {
      const std::int64_t b = in[0].size(0), q = in[0].size(1), k = in[1].size(1);
      return tg::MhaMasks{.key_mask = pattern_mask({b, k}), .query_mask = arg(tg::logical_not(pattern_mask({b, q})))};
    };
    // Outputs 2 and 3 run again with NaN in the masked queries' rows and -inf in the padding
    // keys' context rows: they must equal outputs 0 and 1, gradients included. Outputs 4 and 5 are
    // the fused path (need_weights = false), clean and poisoned.
    info.op = [masks](const Ins& in) {
      const tg::MhaMasks m = masks(in);
      auto [out, attn] = tg::multihead_attention({in[0], in[1]}, {in[2], in[3], in[4], in[5]}, m, 2, true, 2);
      const Tensor query = tg::where(tg::unsqueeze(tg::logical_not(m.query_mask), -1), tg::scalar(std::nan(""), in[0].dtype()), in[0]);
      const Tensor context = tg::where(tg::unsqueeze(tg::logical_not(m.key_mask), -1),
                                       tg::scalar(-std::numeric_limits<double>::infinity(), in[1].dtype()), in[1]);
      auto [out_p, attn_p] = tg::multihead_attention({query, context}, {in[2], in[3], in[4], in[5]}, m, 2, true, 2);
      const Tensor fused = tg::multihead_attention({in[0], in[1]}, {in[2], in[3], in[4], in[5]}, m, 2, true, 2, false).output;
      const Tensor fused_p = tg::multihead_attention({query, context}, {in[2], in[3], in[4], in[5]}, m, 2, true, 2, false).output;
      return Outs{out, attn, out_p, attn_p, fused, fused_p};
    };
    info.reference = [](const Refs& in) {
      // Written out with plain loops: b, h, i, j indices, D = cols(w_q) / 2, Dv = cols(w_v) / 2.
      const Ref &x = in[0], &c = in[1], &wq = in[2], &wk = in[3], &wv = in[4], &wo = in[5];
      const std::int64_t B = x.shape[0], Q = x.shape[1], K = c.shape[1], H = 2, D = wq.shape[1] / 2, Dv = wv.shape[1] / 2,
                         Cout = wo.shape[1];
      const Ref q = ref_matmul(x, wq), k = ref_matmul(c, wk), v = ref_matmul(c, wv);
      Ref attn{{B, H, Q, K}, std::vector<double>(static_cast<std::size_t>(B * H * Q * K), 0.0)};
      Ref merged{{B, Q, H * Dv}, std::vector<double>(static_cast<std::size_t>(B * Q * H * Dv), 0.0)};
      Ref out{{B, Q, Cout}, std::vector<double>(static_cast<std::size_t>(B * Q * Cout), 0.0)};
      auto at = [](const Ref& r, std::int64_t a, std::int64_t b2, std::int64_t c2) { return r.v[static_cast<std::size_t>((a * r.shape[1] + b2) * r.shape[2] + c2)]; };
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < Q; ++i) {
          bool active = false;
          for (std::int64_t h = 0; h < H; ++h) {
            auto allowed = [&](std::int64_t j) { return pattern_value(b * K + j) && !pattern_value(b * Q + i) && j <= i + 2; };
            std::vector<double> s(static_cast<std::size_t>(K), 0.0);
            double m = -1e300, z = 0;
            for (std::int64_t j = 0; j < K; ++j) {
              for (std::int64_t e = 0; e < D; ++e) s[static_cast<std::size_t>(j)] += at(q, b, i, h * D + e) * at(k, b, j, h * D + e);
              s[static_cast<std::size_t>(j)] /= std::sqrt(double(D));
              if (allowed(j)) m = std::max(m, s[static_cast<std::size_t>(j)]), active = true;
            }
            for (std::int64_t j = 0; j < K; ++j) z += allowed(j) ? std::exp(s[static_cast<std::size_t>(j)] - m) : 0.0;
            for (std::int64_t j = 0; j < K; ++j) {
              const double a = allowed(j) ? std::exp(s[static_cast<std::size_t>(j)] - m) / z : 0.0;
              attn.v[static_cast<std::size_t>(((b * H + h) * Q + i) * K + j)] = a;
              for (std::int64_t e = 0; e < Dv; ++e)
                merged.v[static_cast<std::size_t>((b * Q + i) * H * Dv + h * Dv + e)] += a * at(v, b, j, h * Dv + e);
            }
          }
          for (std::int64_t o = 0; o < Cout && active; ++o)
            for (std::int64_t e = 0; e < H * Dv; ++e)
              out.v[static_cast<std::size_t>((b * Q + i) * Cout + o)] += merged.v[static_cast<std::size_t>((b * Q + i) * H * Dv + e)] * wo.v[static_cast<std::size_t>(e * Cout + o)];
        }
      return Refs{out, attn, out, attn, out, out};
    };
    info.errors = {{"zero heads", [] { tg::multihead_attention({f32({1, 1, 2}), f32({1, 1, 2})}, {f32({2, 2}), f32({2, 2}), f32({2, 2}), f32({2, 2})}, {}, 0); },
                    Raises::value, {"multihead_attention", "'heads'", "0"}},
                   {"zero width D", [] { tg::multihead_attention({f32({1, 1, 2}), f32({1, 1, 2})}, {f32({2, 0}), f32({2, 0}), f32({2, 2}), f32({2, 2})}); },
                    Raises::shape, {"multihead_attention", "D must be >= 1", "'w_q'", "[2, 0]"}}};
    const std::vector<std::string> fields{"query", "context", "w_q", "w_k", "w_v", "w_o"};
    for (std::size_t missing = 0; missing < fields.size(); ++missing)
      info.errors.push_back(undefined_arg("multihead_attention", fields[missing], [missing] {
        std::vector<Tensor> t{f32({1, 1, 2}), f32({1, 1, 2}), f32({2, 2}), f32({2, 2}), f32({2, 2}), f32({2, 2})};
        t[missing] = Tensor();
        tg::multihead_attention({t[0], t[1]}, {t[2], t[3], t[4], t[5]});
      }));
    info.undefined_inputs_unreachable = "op builds the masks from the inputs' sizes";
    t.push_back(info);
  }
  {
    // The layer: forward on its own seeded weights equals multihead_attention with them.
    OpInfo info;
    info.name = "MultiHeadAttention";
    info.covers = {"MultiHeadAttention"};
    info.samples = {{{2, 4, 6}}, {{1, 1, 6}}};
    auto layer = [](tg::DType dtype) { return tg::MultiHeadAttention({.query_dim = 6, .heads = 3, .head_dim = 2, .value_head_dim = 1, .out_dim = 5, .dtype = dtype, .seed = 7}); };
    info.op = [layer](const Ins& in) {
      tg::MultiHeadAttention l = layer(in[0].dtype());
      for (const Tensor& p : l.parameters()) arg(p);
      auto [out, attn] = l.forward(in[0], {.causal = true, .need_weights = true});
      return Outs{out, attn};
    };
    info.reference = [layer](const Refs& in) {
      const auto w = layer(tg::float64).weights();
      tg::NoGradGuard no_grad;
      const Tensor x = tg::from_vector(in[0].v, in[0].shape);
      auto [out, attn] = tg::multihead_attention({x, x}, w, {}, 3, true);
      return Refs{Ref::of(out), Ref::of(attn)};
    };
    info.errors = {{"heads not dividing", [] { tg::MultiHeadAttention({.query_dim = 5, .heads = 2}); }, Raises::value, {"MultiHeadAttention", "heads"}},
                   {"query_dim too large to allocate", [] { tg::MultiHeadAttention({.query_dim = std::numeric_limits<std::int64_t>::max()}); },
                    Raises::value, {"MultiHeadAttention", "'w_q'", "config.query_dim", "more than can be allocated"}},
                   {"heads * head_dim overflowing", [] { tg::MultiHeadAttention({.query_dim = 4, .heads = std::int64_t{1} << 33, .head_dim = std::int64_t{1} << 33}); },
                    Raises::value, {"MultiHeadAttention", "config.heads * config.head_dim", "overflows"}},
                   undefined_arg("MultiHeadAttention::forward", "x", [] { tg::MultiHeadAttention({.query_dim = 2}).forward(Tensor()); }),
                   undefined_arg("MultiHeadAttention::forward", "query", [] { tg::MultiHeadAttention({.query_dim = 2}).forward(Tensor(), f32({1, 1, 2})); }),
                   undefined_arg("MultiHeadAttention::forward", "context", [] { tg::MultiHeadAttention({.query_dim = 2}).forward(f32({1, 1, 2}), Tensor()); })};
    info.undefined_inputs_unreachable = "op makes the layer in the input's dtype";
    t.push_back(info);
  }

  {
    // Property: decoding one position at a time through a KVCache equals the full causal forward.
    OpInfo info;
    info.name = "KVCache decode";
    info.covers = {"KVCache"};
    info.differentiable = false;  // decode records nothing
    info.samples = {{{2, 5, 4}}, {{1, 1, 4}}};
    info.op = [](const Ins& in) {
      tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .value_head_dim = 3, .dtype = in[0].dtype(), .seed = 3});
      tg::KVCache cache;
      std::vector<Tensor> steps;
      for (std::int64_t t = 0; t < in[0].size(1); ++t) steps.push_back(layer.decode(tg::slice(in[0], 1, t, t + 1), cache).output);
      return Outs{tg::concat(steps, 1)};
    };
    info.reference = [](const Refs& in) {
      tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .value_head_dim = 3, .dtype = tg::float64, .seed = 3});
      const Tensor x = tg::from_vector(in[0].v, in[0].shape);
      return Refs{Ref::of(layer.forward(x, x, {.causal = true}).output)};
    };
    info.errors = {{"query of the wrong width", [] {
                      tg::KVCache cache;
                      tg::MultiHeadAttention({.query_dim = 4}).decode(f32({1, 1, 3}), cache);
                    }, Raises::shape, {"MultiHeadAttention::decode", "'query'", "[1, 1, 3]"}},
                   undefined_arg("MultiHeadAttention::decode", "query", [] {
                     tg::KVCache cache;
                     tg::MultiHeadAttention({.query_dim = 4}).decode(Tensor(), cache);
                   })};
    info.undefined_inputs_unreachable = "op makes the layer in the input's dtype";
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "broadcast_shapes";
    info.covers = {"broadcast_shapes"};
    info.samples = {{{3, 1}, {1, 4}}, {{2, 1, 4}, {3, 1}}, {{}, {2}}};
    info.op = [](const Ins& in) {
      const Shape s = tg::broadcast_shapes(in[0].shape(), in[1].shape());
      return Outs{tg::expand(in[0], s) + tg::expand(in[1], s)};
    };
    info.reference = [](const Refs& in) { return Refs{ref_map(in, [](const auto& x) { return x[0] + x[1]; })}; };
    info.errors = {{"shapes that do not broadcast", [] { tg::broadcast_shapes({2, 3}, {4}); }, Raises::shape, {"broadcast_shapes", "[2, 3]", "[4]"}},
                   {"negative size", [] { tg::broadcast_shapes({-5}, {1}); }, Raises::shape, {"broadcast_shapes", "'a'", "[-5]", "negative"}},
                   {"negative size against 1", [] { tg::broadcast_shapes({3}, {-1}); }, Raises::shape, {"broadcast_shapes", "'b'", "[-1]"}}};
    info.undefined_inputs_unreachable = "broadcast_shapes takes shapes, not tensors";
    t.push_back(info);
  }

  // Matmul.
  {
    OpInfo info;
    info.name = "matmul";
    info.covers = {"matmul", "bfloat16_native"};  // bfloat16 results: test_matmul
    info.samples = {{{3, 4}, {4, 5}}, {{1, 1}, {1, 1}}, {{1, 7}, {7, 1}}, {{2, 3, 4}, {4, 2}}, {{2, 1, 3, 4}, {5, 4, 2}}, {{0, 3}, {3, 2}}, {{2, 0}, {0, 3}}};
    info.op = [](const Ins& in) { return Outs{tg::matmul(in[0], in[1])}; };
    info.reference = [](const Refs& in) { return Refs{ref_matmul(in[0], in[1])}; };
    info.errors = {{"rank 1", [] { tg::matmul(f32({3}), f32({3, 2})); }, Raises::shape, {"matmul", "'a'", "rank >= 2", "[3]"}},
                   {"inner dims differ", [] { tg::matmul(f32({2, 3}), f32({4, 2})); }, Raises::shape, {"matmul", "'a'", "[2, 3]", "'b'", "[4, 2]"}},
                   {"batch dims do not broadcast", [] { tg::matmul(f32({2, 2, 3}), f32({3, 3, 2})); }, Raises::shape, {"matmul", "batch", "[2]", "[3]"}},
                   {"mixed dtypes", [] { tg::matmul(f32({2, 2}), f64({2, 2})); }, Raises::dtype, {"matmul", "float32", "float64"}},
                   {"bfloat16 on float64", [] { tg::matmul(f64({2, 2}), f64({2, 2}), tg::MatmulPrecision::bfloat16); }, Raises::dtype,
                    {"matmul", "bfloat16", "float64"}},
                   {"K = 0 with a result too large", [] { tg::matmul(f32({std::int64_t{1} << 32, 0}), f32({0, std::int64_t{1} << 32})); },
                    Raises::shape, {"matmul", "result shape", "[4294967296, 4294967296]", "addressed"}},
                   {"batch dims broadcast too large", [] { tg::matmul(tg::expand(f64({1, 1, 1, 2}), {std::int64_t{1} << 25, 1, 1, 2}),
                                                                      tg::expand(f64({1, 1, 2, 1}), {1, std::int64_t{1} << 25, 2, 1})); },
                    Raises::shape, {"matmul", "result shape", "addressed"}}};
    t.push_back(info);
  }

  {
    // Bias and no bias; x of rank 1, 2 and 3; zero-size rows, K and N.
    OpInfo info;
    info.name = "linear";
    info.covers = {"linear"};
    info.samples = {{{3, 4}, {4, 5}, {5}}, {{2, 3, 4}, {4, 2}, {2}}, {{4}, {4, 3}, {3}}, {{1, 1}, {1, 1}, {1}},
                    {{0, 3}, {3, 2}, {2}}, {{2, 0}, {0, 3}, {3}}, {{2, 3}, {3, 0}, {0}}};
    info.op = [](const Ins& in) { return Outs{tg::linear(in[0], in[1], in[2]), tg::linear(in[0], in[1])}; };
    info.reference = [](const Refs& in) {
      const std::int64_t k = in[1].shape[0], n = in[1].shape[1];
      std::int64_t m = 1;  // the rows of x
      for (std::size_t d = 0; d + 1 < in[0].shape.size(); ++d) m *= in[0].shape[d];
      Ref rows = in[0];
      rows.shape = {m, k};
      Ref product = ref_matmul(rows, in[1]);
      Shape out_shape = in[0].shape;
      out_shape.back() = n;
      product.shape = out_shape;
      Ref with_bias = product;
      for (std::size_t i = 0; i < with_bias.v.size(); ++i) with_bias.v[i] += in[2].v[i % static_cast<std::size_t>(n)];
      return Refs{with_bias, product};
    };
    info.errors = {{"weight of rank 1", [] { tg::linear(f32({2, 3}), f32({3})); }, Raises::shape, {"linear", "'weight'", "[K, N]", "[3]"}},
                   {"x's last dim is not K", [] { tg::linear(f32({2, 3}), f32({4, 5})); }, Raises::shape,
                    {"linear", "'x'", "[2, 3]", "[..., 4]", "'weight'", "[4, 5]"}},
                   {"rank-0 x", [] { tg::linear(f32({}), f32({1, 2})); }, Raises::shape, {"linear", "'x'", "[]"}},
                   {"bias of the wrong width", [] { tg::linear(f32({2, 3}), f32({3, 4}), f32({3})); }, Raises::shape,
                    {"linear", "'bias'", "[3]", "[4]"}},
                   {"bias of rank 2", [] { tg::linear(f32({2, 3}), f32({3, 4}), f32({1, 4})); }, Raises::shape, {"linear", "'bias'", "[1, 4]"}},
                   {"mixed dtypes", [] { tg::linear(f32({2, 3}), f64({3, 4})); }, Raises::dtype, {"linear", "'x'", "'weight'", "float32", "float64"}},
                   {"float64 bias", [] { tg::linear(f32({2, 3}), f32({3, 4}), f64({4})); }, Raises::dtype, {"linear", "'bias'", "float64"}},
                   {"integer x", [] { tg::linear(tg::zeros({2, 3}, tg::int64), f32({3, 4})); }, Raises::dtype, {"linear", "'x'", "int64"}},
                   {"bfloat16 on float64", [] { tg::linear(f64({2, 2}), f64({2, 2}), Tensor(), tg::MatmulPrecision::bfloat16); },
                    Raises::dtype, {"linear", "bfloat16", "float64"}}};
    info.undefined_inputs_unreachable = "bias is optional: an undefined one means none";
    info.errors.push_back(undefined_arg("linear", "x", [] { tg::linear(Tensor(), f32({2, 2})); }));
    info.errors.push_back(undefined_arg("linear", "weight", [] { tg::linear(f32({2, 2}), Tensor()); }));
    t.push_back(info);
  }

  // ---- Training ops: clone, indexing, argmax, log_softmax, losses, layer_norm, dropout. ----
  // Ids, targets and masks are made inside each op from the input shapes (deterministic
  // patterns), so the float inputs keep the usual four layouts and the reference sees the same.
  {
    OpInfo info;
    info.name = "clone";
    info.covers = {"clone"};
    info.samples = unary_shapes();
    info.op = [](const Ins& in) { return Outs{tg::clone(in[0])}; };
    info.reference = [](const Refs& in) { return Refs{in[0]}; };
    info.errors = {{"undefined input", [] { tg::clone(Tensor()); }, Raises::any, {"clone", "'x'", "undefined"}}};
    t.push_back(info);
  }
  {
    // Along the first and the last dim, with ids of rank 2, 1 and 0 (rank 0 removes the dim, as
    // numpy.take); ids repeat, so the backward must accumulate. An empty dim takes empty ids.
    OpInfo info;
    info.name = "index_select";
    info.covers = {"index_select"};
    info.samples = {{{5, 3}}, {{2, 4, 3}}, {{4}}, {{1, 2}}, {{0, 3}}, {{3, 0}}};
    auto takes = [](const Shape& x) {
      std::vector<std::tuple<std::size_t, Shape, std::int64_t>> out;  // dim, ids shape, size of dim
      for (const auto& [dim, want] : std::vector<std::pair<std::size_t, Shape>>{{0, {2, 3}}, {x.size() - 1, {4}}, {0, {}}})
        out.emplace_back(dim, x[dim] == 0 ? Shape{0} : want, x[dim]);
      return out;
    };
    info.op = [takes](const Ins& in) {
      Outs outs;
      for (const auto& [d, shape, n] : takes(in[0].shape()))
        outs.push_back(tg::index_select(in[0], static_cast<std::int64_t>(d), pattern_ids(shape, n)));
      return outs;
    };
    info.reference = [takes](const Refs& in) {
      Refs outs;
      for (const auto& [d, shape, n] : takes(in[0].shape))
        outs.push_back(ref_take(in[0], d, shape, pattern_ids(shape, n).to_vector<std::int64_t>()));
      return outs;
    };
    const Tensor ids = tg::tensor({{0, 5}, {1, 2}}, tg::int64);
    info.errors = {{"float ids", [] { tg::index_select(f32({5, 3}), 0, f32({2})); }, Raises::dtype, {"index_select", "'index'", "int64", "float32"}},
                   {"id past the end", [ids] { tg::index_select(f32({5, 3}), 0, ids); }, Raises::value,
                    {"index_select", "'index'", "holds 5 at position [0, 1]", "dim 0", "[5, 3]", "[0, 5)"}},
                   {"negative id", [] { tg::index_select(f32({5, 3}), 1, tg::tensor({0, -1}, tg::int64)); }, Raises::value,
                    {"index_select", "holds -1 at position [1]", "dim 1"}},
                   {"id out of range with an empty result", [] { tg::index_select(f32({0, 3}), 1, tg::tensor({3}, tg::int64)); }, Raises::value,
                    {"index_select", "holds 3 at position [0]"}},
                   {"dim out of range", [] { tg::index_select(f32({5}), 1, tg::tensor({0}, tg::int64)); }, Raises::shape, {"index_select", "'dim'", "rank 1"}},
                   {"undefined x", [ids] { tg::index_select(Tensor(), 0, ids); }, Raises::any, {"index_select", "'x'", "undefined"}}};
    info.undefined_inputs_unreachable = "the op builds its ids from the input's shape";
    info.errors.push_back(undefined_arg("index_select", "x", [] { tg::index_select(Tensor(), 0, tg::zeros({1}, tg::int64)); }));
    info.errors.push_back(undefined_arg("index_select", "index", [] { tg::index_select(f32({2}), 0, Tensor()); }));
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "embedding";
    info.covers = {"embedding"};
    info.samples = {{{5, 3}}, {{1, 4}}, {{4, 0}}, {{0, 2}}};
    auto id_shapes = [](std::int64_t vocabulary) { return vocabulary == 0 ? std::vector<Shape>{{0}} : std::vector<Shape>{{2, 3}, {}}; };
    info.op = [id_shapes](const Ins& in) {
      Outs outs;
      for (const Shape& s : id_shapes(in[0].size(0))) outs.push_back(tg::embedding(in[0], pattern_ids(s, in[0].size(0))));
      return outs;
    };
    info.reference = [id_shapes](const Refs& in) {
      Refs outs;
      for (const Shape& s : id_shapes(in[0].shape[0])) outs.push_back(ref_take(in[0], 0, s, pattern_ids(s, in[0].shape[0]).to_vector<std::int64_t>()));
      return outs;
    };
    info.errors = {{"rank-1 table", [] { tg::embedding(f32({4}), tg::tensor({0}, tg::int64)); }, Raises::shape, {"embedding", "'weight'", "rank 2", "[4]"}},
                   {"id past the vocabulary", [] { tg::embedding(f32({4, 2}), tg::tensor({{1, 2}, {7, 0}}, tg::int64)); }, Raises::value,
                    {"embedding", "'ids'", "holds 7 at position [1, 0]", "'weight'", "[4, 2]", "[0, 4)"}},
                   {"bool ids", [] { tg::embedding(f32({4, 2}), tg::mask({true})); }, Raises::dtype, {"embedding", "'ids'", "int64", "bool"}}};
    info.undefined_inputs_unreachable = "the op builds its ids from the input's shape";
    info.errors.push_back(undefined_arg("embedding", "weight", [] { tg::embedding(Tensor(), tg::zeros({1}, tg::int64)); }));
    info.errors.push_back(undefined_arg("embedding", "ids", [] { tg::embedding(f32({2, 2}), Tensor()); }));
    t.push_back(info);
  }
  {
    // Along the last dim with an index longer than x there and shorter elsewhere, and along dim 0.
    OpInfo info;
    info.name = "gather";
    info.covers = {"gather"};
    info.samples = {{{3, 4}}, {{2, 3, 4}}, {{5}}, {{1, 3}}, {{2, 0}}, {{0, 3}}};
    auto index_shape = [](const Shape& x, std::size_t dim, std::int64_t along) {
      Shape s = x;
      for (std::size_t d = 0; d < s.size(); ++d) s[d] = d == dim ? (x[d] == 0 ? 0 : along) : (x[d] > 1 ? x[d] - 1 : x[d]);
      return s;
    };
    auto dims = [](const Shape& x) { return std::vector<std::pair<std::size_t, std::int64_t>>{{x.size() - 1, 5}, {0, 2}}; };
    info.op = [index_shape, dims](const Ins& in) {
      Outs outs;
      for (const auto& [d, along] : dims(in[0].shape()))
        outs.push_back(tg::gather(in[0], static_cast<std::int64_t>(d), pattern_ids(index_shape(in[0].shape(), d, along), in[0].size(static_cast<std::int64_t>(d)))));
      return outs;
    };
    info.reference = [index_shape, dims](const Refs& in) {
      Refs outs;
      for (const auto& [d, along] : dims(in[0].shape)) {
        const Shape s = index_shape(in[0].shape, d, along);
        outs.push_back(ref_take_along(in[0], d, s, pattern_ids(s, in[0].shape[d]).to_vector<std::int64_t>()));
      }
      return outs;
    };
    info.errors = {{"index of another rank", [] { tg::gather(f32({2, 3}), 1, tg::tensor({0}, tg::int64)); }, Raises::shape, {"gather", "'index'", "[1]", "rank", "[2, 3]"}},
                   {"index larger outside dim", [] { tg::gather(f32({2, 3}), 1, tg::zeros({3, 1}, tg::int64)); }, Raises::shape,
                    {"gather", "'index'", "[3, 1]", "[2, 3]", "dim 0", "3 > 2"}},
                   {"id out of range", [] { tg::gather(f32({2, 3}), 1, tg::tensor({{0, 1}, {3, 0}}, tg::int64)); }, Raises::value,
                    {"gather", "'index'", "holds 3 at position [1, 0]", "[0, 3)"}},
                   {"float index", [] { tg::gather(f32({2, 3}), 0, f32({2, 3})); }, Raises::dtype, {"gather", "'index'", "int64"}}};
    info.undefined_inputs_unreachable = "the op builds its index from the input's shape";
    info.errors.push_back(undefined_arg("gather", "x", [] { tg::gather(Tensor(), 0, tg::zeros({1}, tg::int64)); }));
    info.errors.push_back(undefined_arg("gather", "index", [] { tg::gather(f32({2}), 0, Tensor()); }));
    t.push_back(info);
  }
  {
    // Not differentiable: the int64 indices are compared as floats. On the raw inputs and on
    // trunc(2x), whose many ties must give the first index.
    OpInfo info;
    info.name = "argmax";
    info.covers = {"argmax"};
    info.differentiable = false;
    info.samples = {{{3, 4}}, {{2, 3, 4}}, {{5}}, {{1, 4}}, {{}}, {{0, 3}}};
    // (dim or -1 for all, keepdim) choices whose result exists for shape x.
    auto choices = [](const Shape& x) {
      std::int64_t n = 1;
      for (auto s : x) n *= s;
      std::vector<std::pair<std::int64_t, bool>> out;
      if (n > 0) out.emplace_back(-1, false);
      for (auto [d, keep] : {std::pair<std::int64_t, bool>{static_cast<std::int64_t>(x.size()) - 1, false}, {0, true}}) {
        if (x.empty()) break;
        std::int64_t others = 1;  // elements of the result
        for (std::size_t k = 0; k < x.size(); ++k) others *= static_cast<std::int64_t>(k) == d ? 1 : x[k];
        if (x[static_cast<std::size_t>(d)] > 0 || others == 0) out.emplace_back(d, keep);
      }
      return out;
    };
    info.op = [choices](const Ins& in) {
      Outs outs;
      const Tensor ties = tg::to(tg::to(tg::mul(in[0], 2.0), tg::int64), in[0].dtype());
      for (const Tensor& x : {in[0], ties})
        for (auto [d, keep] : choices(x.shape()))
          outs.push_back(tg::to(d < 0 ? tg::argmax(x) : tg::argmax(x, d, keep), x.dtype()));
      return outs;
    };
    info.reference = [choices](const Refs& in) {
      Refs outs;
      const Ref ties = ref_map(in, [](const auto& v) { return std::trunc(2 * v[0]); });
      for (const Ref& x : {in[0], ties})
        for (auto [d, keep] : choices(x.shape))
          outs.push_back(d >= 0 ? ref_argmax(x, static_cast<std::size_t>(d), keep)
                                : Ref{{}, {static_cast<double>(std::max_element(x.v.begin(), x.v.end()) - x.v.begin())}});
      return outs;
    };
    info.errors = {{"bool input", [] { tg::argmax(tg::mask({true})); }, Raises::dtype, {"argmax", "'x'", "bool"}},
                   {"dim out of range", [] { tg::argmax(f32({2, 3}), 2); }, Raises::shape, {"argmax", "'dim'", "rank 2"}},
                   {"zero-size dim", [] { tg::argmax(f32({2, 0}), 1); }, Raises::shape, {"argmax", "dim 1", "size 0", "[2, 0]"}},
                   {"empty input", [] { tg::argmax(f32({0, 3})); }, Raises::shape, {"argmax", "'x'", "[0, 3]", "empty"}}};
    info.undefined_inputs_unreachable = "the op reads the input's rank to pick its dims";
    info.errors.push_back(undefined_arg("argmax", "x", [] { tg::argmax(Tensor(), 0); }));
    info.errors.push_back(undefined_arg("argmax", "x", [] { tg::argmax(Tensor()); }));
    t.push_back(info);
  }
  {
    // Plain, and with the mask pattern over the last dim. Masked entries are -inf, which no
    // finite difference can handle, so that output is where(mask, y, 0): their gradient must
    // then be exactly what the masked entries' zero upstream gives.
    OpInfo info;
    info.name = "log_softmax";
    info.covers = {"log_softmax"};
    info.samples = {{{3, 5}}, {{2, 3, 4}}, {{6}}, {{4, 1}}, {{2, 0}}};
    info.op = [](const Ins& in) {
      const Tensor mask = pattern_mask(Shape{in[0].shape().back()});
      return Outs{tg::log_softmax(in[0]), tg::where(mask, tg::log_softmax(in[0], mask), tg::scalar(0.0, in[0].dtype()))};
    };
    info.reference = [](const Refs& in) {
      const Ref& s = in[0];
      const std::int64_t k = s.shape.back();
      Ref plain = s, masked = s;
      for (std::int64_t r = 0; k > 0 && r < s.numel() / k; ++r)
        for (bool use_mask : {false, true}) {
          auto on = [&](std::int64_t j) { return !use_mask || pattern_value(j); };
          auto x = [&](std::int64_t j) { return s.v[static_cast<std::size_t>(r * k + j)]; };
          double m = -std::numeric_limits<double>::infinity(), z = 0;
          for (std::int64_t j = 0; j < k; ++j)
            if (on(j)) m = std::max(m, x(j));
          for (std::int64_t j = 0; j < k; ++j)
            if (on(j)) z += std::exp(x(j) - m);
          for (std::int64_t j = 0; j < k; ++j)
            (use_mask ? masked : plain).v[static_cast<std::size_t>(r * k + j)] = on(j) ? x(j) - m - std::log(z) : 0.0;
        }
      return Refs{plain, masked};
    };
    info.errors = {{"integer x", [] { tg::log_softmax(tg::zeros({2}, tg::int64)); }, Raises::dtype, {"log_softmax", "'x'", "int64"}},
                   {"float mask", [] { tg::log_softmax(f32({2}), f32({2})); }, Raises::dtype, {"log_softmax", "'allowed'", "bool"}},
                   {"mask larger than x", [] { tg::log_softmax(f32({2}), tg::zeros({3, 2}, tg::bool_)); }, Raises::shape,
                    {"log_softmax", "'allowed'", "[3, 2]", "[2]"}},
                   {"rank 0 x", [] { tg::log_softmax(f32({})); }, Raises::shape, {"log_softmax", "rank >= 1"}}};
    info.undefined_inputs_unreachable = "the op builds its mask from the input's shape";
    info.errors.push_back(undefined_arg("log_softmax", "x", [] { tg::log_softmax(Tensor()); }));
    t.push_back(info);
  }
  for (const auto& [smoothing, ignore] : std::vector<std::pair<double, std::int64_t>>{{0.0, -100}, {0.2, 1}}) {
    // Every reduction at once. Targets: pattern ids, with every fourth row (and every row when
    // there are no classes) set to ignore_index; ignore_index = 1 also ignores pattern ids of 1.
    OpInfo info;
    info.name = fmt::format("cross_entropy(label_smoothing={}, ignore_index={})", smoothing, ignore);
    info.covers = {"cross_entropy"};
    info.samples = {{{4, 5}}, {{2, 3, 4}}, {{5}}, {{3, 1}}, {{0, 3}}, {{4, 0}}};
    auto targets = [ignore](const Shape& logits) {
      const Shape rows(logits.begin(), logits.end() - 1);
      const std::int64_t classes = logits.back();
      Tensor t = pattern_ids(rows, std::max<std::int64_t>(classes, 1));
      std::vector<std::int64_t> v = t.to_vector<std::int64_t>();
      for (std::size_t r = 0; r < v.size(); ++r)
        if (classes == 0 || r % 4 == 3) v[r] = ignore;
      return tg::from_vector(std::span<const std::int64_t>(v), rows);
    };
    info.op = [targets, smoothing, ignore](const Ins& in) {
      const Tensor t = arg(targets(in[0].shape()));
      Outs outs;
      for (auto reduction : {tg::Reduction::mean, tg::Reduction::sum, tg::Reduction::none})
        outs.push_back(tg::cross_entropy(in[0], t, {.ignore_index = ignore, .label_smoothing = smoothing, .reduction = reduction}));
      return outs;
    };
    info.reference = [targets, smoothing, ignore](const Refs& in) {
      const Ref& x = in[0];
      const std::int64_t c = x.shape.back();
      const std::vector<std::int64_t> t = targets(x.shape).to_vector<std::int64_t>();
      Ref none{Shape(x.shape.begin(), x.shape.end() - 1), std::vector<double>(t.size(), 0.0)};
      double total = 0, counted = 0;
      for (std::size_t r = 0; r < t.size(); ++r) {
        if (t[r] == ignore) continue;
        auto s = [&](std::int64_t j) { return x.v[r * static_cast<std::size_t>(c) + static_cast<std::size_t>(j)]; };
        double m = -std::numeric_limits<double>::infinity(), z = 0, mean_nll = 0;
        for (std::int64_t j = 0; j < c; ++j) m = std::max(m, s(j));
        for (std::int64_t j = 0; j < c; ++j) z += std::exp(s(j) - m);
        const double lse = m + std::log(z);
        for (std::int64_t j = 0; j < c; ++j) mean_nll += (lse - s(j)) / static_cast<double>(c);
        none.v[r] = (1 - smoothing) * (lse - s(t[r])) + smoothing * mean_nll;
        total += none.v[r];
        ++counted;
      }
      return Refs{Ref{{}, {counted > 0 ? total / counted : 0.0}}, Ref{{}, {total}}, none};
    };
    const Tensor two = tg::tensor({1, 2}, tg::int64);
    info.errors = {{"targets of the wrong shape", [] { tg::cross_entropy(f32({2, 5}), tg::zeros({3}, tg::int64)); }, Raises::shape,
                    {"cross_entropy", "'targets'", "[3]", "[2]", "[2, 5]"}},
                   {"float targets", [] { tg::cross_entropy(f32({2, 5}), f32({2})); }, Raises::dtype, {"cross_entropy", "'targets'", "int64", "float32"}},
                   {"integer logits", [two] { tg::cross_entropy(tg::zeros({2, 5}, tg::int64), two); }, Raises::dtype, {"cross_entropy", "'logits'", "int64"}},
                   {"rank-0 logits", [] { tg::cross_entropy(f32({}), tg::scalar(0.0, tg::int64)); }, Raises::shape, {"cross_entropy", "'logits'", "rank >= 1"}},
                   {"target past the classes", [] { tg::cross_entropy(f32({2, 5}), tg::tensor({0, 5}, tg::int64)); }, Raises::value,
                    {"cross_entropy", "'targets'", "holds 5 at position [1]", "[0, 5)", "ignore_index = -100"}},
                   {"negative target", [] { tg::cross_entropy(f32({2, 2, 5}), tg::tensor({{0, 1}, {-1, 2}}, tg::int64)); }, Raises::value,
                    {"cross_entropy", "holds -1 at position [1, 0]"}},
                   {"label smoothing of 1", [two] { tg::cross_entropy(f32({2, 5}), two, {.label_smoothing = 1.0}); }, Raises::value,
                    {"cross_entropy", "'label_smoothing'", "[0, 1)", "got 1"}},
                   {"NaN label smoothing", [two] { tg::cross_entropy(f32({2, 5}), two, {.label_smoothing = std::nan("")}); }, Raises::value,
                    {"cross_entropy", "'label_smoothing'", "nan"}},
                   {"unknown reduction", [two] { tg::cross_entropy(f32({2, 5}), two, {.reduction = static_cast<tg::Reduction>(7)}); }, Raises::value,
                    {"cross_entropy", "'reduction'", "7"}}};
    info.undefined_inputs_unreachable = "the op builds its targets from the logits' shape";
    info.errors.push_back(undefined_arg("cross_entropy", "logits", [] { tg::cross_entropy(Tensor(), tg::zeros({1}, tg::int64)); }));
    info.errors.push_back(undefined_arg("cross_entropy", "targets", [] { tg::cross_entropy(f32({1, 2}), Tensor()); }));
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "mse_loss";
    info.covers = {"mse_loss"};
    info.samples = {{{3, 4}, {3, 4}}, {{5}, {5}}, {{}, {}}, {{2, 1, 3}, {2, 1, 3}}, {{2, 0}, {2, 0}}};
    info.op = [](const Ins& in) {
      return Outs{tg::mse_loss(in[0], in[1]), tg::mse_loss(in[0], in[1], tg::Reduction::sum), tg::mse_loss(in[0], in[1], tg::Reduction::none)};
    };
    info.reference = [](const Refs& in) {
      const Ref none = ref_map(in, [](const auto& v) { return (v[0] - v[1]) * (v[0] - v[1]); });
      const double total = sum_of(none.v);
      return Refs{Ref{{}, {total / static_cast<double>(none.v.size())}}, Ref{{}, {total}}, none};
    };
    info.errors = {{"shapes differ", [] { tg::mse_loss(f32({2}), f32({3})); }, Raises::shape, {"mse_loss", "'target'", "[3]", "'pred'", "[2]"}},
                   {"no broadcasting", [] { tg::mse_loss(f32({2, 3}), f32({3})); }, Raises::shape, {"mse_loss", "'target'", "[3]", "[2, 3]"}},
                   {"mixed dtypes", [] { tg::mse_loss(f32({2}), f64({2})); }, Raises::dtype, {"mse_loss", "'pred'", "'target'", "same dtype"}},
                   {"unknown reduction", [] { tg::mse_loss(f32({2}), f32({2}), static_cast<tg::Reduction>(-1)); }, Raises::value,
                    {"mse_loss", "'reduction'", "-1"}}};
    t.push_back(info);
  }
  {
    // With weight and bias, with weight only, and with neither. E = 1 rows are constant (output
    // = bias, gradient 0); zero-size rows and widths give empty results.
    OpInfo info;
    info.name = "layer_norm";
    info.covers = {"layer_norm"};
    info.samples = {{{3, 4}, {4}, {4}}, {{2, 3, 5}, {5}, {5}}, {{6}, {6}, {6}}, {{4, 1}, {1}, {1}}, {{0, 3}, {3}, {3}}, {{2, 0}, {0}, {0}}};
    info.op = [](const Ins& in) {
      return Outs{tg::layer_norm(in[0], in[1], in[2]), tg::layer_norm(in[0], in[1]), tg::layer_norm(in[0], Tensor(), Tensor(), 0.1)};
    };
    info.reference = [](const Refs& in) {
      const Ref& x = in[0];
      const std::int64_t e = x.shape.back();
      Refs outs(3, x);
      for (std::int64_t r = 0; e > 0 && r < x.numel() / e; ++r) {
        auto at = [&](std::int64_t j) { return static_cast<std::size_t>(r * e + j); };
        double mu = 0, var = 0;
        for (std::int64_t j = 0; j < e; ++j) mu += x.v[at(j)] / static_cast<double>(e);
        for (std::int64_t j = 0; j < e; ++j) var += (x.v[at(j)] - mu) * (x.v[at(j)] - mu) / static_cast<double>(e);
        for (std::int64_t j = 0; j < e; ++j) {
          const auto k = static_cast<std::size_t>(j);
          outs[0].v[at(j)] = (x.v[at(j)] - mu) / std::sqrt(var + 1e-5) * in[1].v[k] + in[2].v[k];
          outs[1].v[at(j)] = (x.v[at(j)] - mu) / std::sqrt(var + 1e-5) * in[1].v[k];
          outs[2].v[at(j)] = (x.v[at(j)] - mu) / std::sqrt(var + 0.1);
        }
      }
      return outs;
    };
    info.errors = {{"weight of the wrong width", [] { tg::layer_norm(f32({2, 4}), f32({3})); }, Raises::shape,
                    {"layer_norm", "'weight'", "[3]", "[4]", "[2, 4]"}},
                   {"bias of another rank", [] { tg::layer_norm(f32({2, 4}), Tensor(), f32({1, 4})); }, Raises::shape, {"layer_norm", "'bias'", "[1, 4]"}},
                   {"float64 weight for float32 x", [] { tg::layer_norm(f32({2, 4}), f64({4})); }, Raises::dtype, {"layer_norm", "'x'", "'weight'", "same dtype"}},
                   {"negative eps", [] { tg::layer_norm(f32({2, 4}), Tensor(), Tensor(), -1e-5); }, Raises::value, {"layer_norm", "'eps'", ">= 0", "-1e-05"}},
                   {"rank-0 x", [] { tg::layer_norm(f32({})); }, Raises::shape, {"layer_norm", "'x'", "rank >= 1"}},
                   {"integer x", [] { tg::layer_norm(tg::zeros({2}, tg::int64)); }, Raises::dtype, {"layer_norm", "'x'", "int64"}}};
    info.undefined_inputs_unreachable = "weight and bias are optional: an undefined one means none";
    info.errors.push_back(undefined_arg("layer_norm", "x", [] { tg::layer_norm(Tensor()); }));
    t.push_back(info);
  }
  {
    // A fresh Generator(42) per call, so every call (gradcheck makes many) draws the same masks:
    // p = 0.3 while training, then p = 1 (all dropped), then eval mode (x itself).
    OpInfo info;
    info.name = "dropout";
    info.covers = {"dropout"};
    info.samples = unary_shapes();
    info.op = [](const Ins& in) {
      tg::Generator gen(42);
      return Outs{tg::dropout(in[0], 0.3, gen, true), tg::dropout(in[0], 1.0, gen, true), tg::dropout(in[0], 0.3, gen, false)};
    };
    info.reference = [](const Refs& in) {
      // The documented mask: one uniform draw per element in row-major order, kept when u >= p.
      tg::Generator gen(42);
      Ref kept = in[0], none = in[0];
      for (double& v : kept.v) v = gen.uniform() >= 0.3 ? v / 0.7 : 0.0;
      for (double& v : none.v) v = 0.0 * gen.uniform();
      return Refs{kept, none, in[0]};
    };
    info.errors = {{"p above 1", [] { tg::Generator gen(1); tg::dropout(f32({2}), 1.5, gen, true); }, Raises::value, {"dropout", "'p'", "[0, 1]", "1.5"}},
                   {"negative p, even in eval mode", [] { tg::Generator gen(1); tg::dropout(f32({2}), -0.1, gen, false); }, Raises::value,
                    {"dropout", "'p'", "-0.1"}},
                   {"NaN p", [] { tg::Generator gen(1); tg::dropout(f32({2}), std::nan(""), gen, true); }, Raises::value, {"dropout", "'p'", "nan"}},
                   {"integer x", [] { tg::Generator gen(1); tg::dropout(tg::zeros({2}, tg::int64), 0.5, gen, true); }, Raises::dtype,
                    {"dropout", "'x'", "int64"}}};
    t.push_back(info);
  }
  return t;
}

}  // namespace

const std::vector<OpInfo>& op_table() {
  static const std::vector<OpInfo> table = build();
  return table;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& op : op_table()) names.push_back(op.name);
  return names;
}

const OpInfo& find_op(const std::string& name) {
  for (const auto& op : op_table())
    if (op.name == name) return op;
  throw std::logic_error("no op named " + name);
}

}  // namespace tg_test
