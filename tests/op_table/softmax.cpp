// The op table's entries for softmaxes over the last dim: masked_softmax and log_softmax.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_softmax(std::vector<OpInfo>& t) {
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
}

}  // namespace tg_test::table
