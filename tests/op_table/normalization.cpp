// The op table's entries for layer_norm, rms_norm and dropout.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_normalization(std::vector<OpInfo>& t) {
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
    // With a weight and without (and another eps). E = 1 rows give sign(x) (times the weight);
    // zero-size rows and widths give empty results.
    OpInfo info;
    info.name = "rms_norm";
    info.covers = {"rms_norm"};
    info.samples = {{{3, 4}, {4}}, {{2, 3, 5}, {5}}, {{6}, {6}}, {{4, 1}, {1}}, {{0, 3}, {3}}, {{2, 0}, {0}}};
    info.op = [](const Ins& in) { return Outs{tg::rms_norm(in[0], in[1]), tg::rms_norm(in[0], Tensor(), 0.1)}; };
    info.reference = [](const Refs& in) {
      const Ref& x = in[0];
      const std::int64_t e = x.shape.back();
      Refs outs(2, x);
      for (std::int64_t r = 0; e > 0 && r < x.numel() / e; ++r) {
        auto at = [&](std::int64_t j) { return static_cast<std::size_t>(r * e + j); };
        double ms = 0;
        for (std::int64_t j = 0; j < e; ++j) ms += x.v[at(j)] * x.v[at(j)] / static_cast<double>(e);
        for (std::int64_t j = 0; j < e; ++j) {
          outs[0].v[at(j)] = x.v[at(j)] / std::sqrt(ms + 1e-5) * in[1].v[static_cast<std::size_t>(j)];
          outs[1].v[at(j)] = x.v[at(j)] / std::sqrt(ms + 0.1);
        }
      }
      return outs;
    };
    info.errors = {{"weight of the wrong width", [] { tg::rms_norm(f32({2, 4}), f32({3})); }, Raises::shape,
                    {"rms_norm", "'weight'", "[3]", "[4]", "[2, 4]"}},
                   {"float64 weight for float32 x", [] { tg::rms_norm(f32({2, 4}), f64({4})); }, Raises::dtype, {"rms_norm", "'x'", "'weight'", "same dtype"}},
                   {"NaN eps", [] { tg::rms_norm(f32({2, 4}), Tensor(), std::nan("")); }, Raises::value, {"rms_norm", "'eps'", ">= 0", "nan"}},
                   {"rank-0 x", [] { tg::rms_norm(f32({})); }, Raises::shape, {"rms_norm", "'x'", "rank >= 1", "[]"}},
                   {"integer x", [] { tg::rms_norm(tg::zeros({2}, tg::int64)); }, Raises::dtype, {"rms_norm", "'x'", "int64"}}};
    info.undefined_inputs_unreachable = "the weight is optional: an undefined one means none";
    info.errors.push_back(undefined_arg("rms_norm", "x", [] { tg::rms_norm(Tensor()); }));
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
}

}  // namespace tg_test::table
