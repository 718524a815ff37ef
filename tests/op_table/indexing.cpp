// The op table's entries for training ops that take ids: clone, index_select, embedding, gather, argmax.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_indexing(std::vector<OpInfo>& t) {
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
    info.errors = {{"undefined input", [] { tg::clone(Tensor()); }, Raises::error, {"clone", "'x'", "undefined"}}};
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
                   {"undefined x", [ids] { tg::index_select(Tensor(), 0, ids); }, Raises::error, {"index_select", "'x'", "undefined"}}};
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
}

}  // namespace tg_test::table
