// The op table's entries for products: matmul and linear.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_matmul(std::vector<OpInfo>& t) {
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

}

}  // namespace tg_test::table
