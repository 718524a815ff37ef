// The op table's entries for views, joins and broadcasting.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_views(std::vector<OpInfo>& t) {
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

}

}  // namespace tg_test::table
