// The op table's entries for elementwise ops: arithmetic, unary functions, comparisons, logic, selection and casts.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_elementwise(std::vector<OpInfo>& t) {
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
  t.push_back(unary("sigmoid", [](auto& x) { return tg::sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }));
  t.push_back(unary("silu", [](auto& x) { return tg::silu(x); }, [](double x) { return x / (1 + std::exp(-x)); }));
  t.push_back(unary("abs", [](auto& x) { return tg::abs(x); }, [](double x) { return std::abs(x); }));
  {
    // Far from 0 (|x| up to ~100), where e^-|x| alone is left: the logistic must neither overflow
    // nor turn inf / inf into NaN.
    OpInfo info = unary("sigmoid/silu far out", [](auto& x) { return tg::sigmoid(x * 40.0); }, [](double x) { return 1 / (1 + std::exp(-40 * x)); });
    info.covers = {"sigmoid", "silu"};
    info.op = [](const Ins& in) { return Outs{tg::sigmoid(in[0] * 40.0), tg::silu(in[0] * 40.0)}; };
    info.reference = [](const Refs& in) {
      return Refs{ref_map(in, [](const auto& x) { return 1 / (1 + std::exp(-40 * x[0])); }),
                  ref_map(in, [](const auto& x) { return 40 * x[0] / (1 + std::exp(-40 * x[0])); })};
    };
    info.errors.clear();  // the entries above have them
    info.undefined_inputs_unreachable = "op scales its input before the call";
    t.push_back(info);
  }
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

}

}  // namespace tg_test::table
