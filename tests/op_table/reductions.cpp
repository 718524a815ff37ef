// The op table's entries for reductions: sum, mean and max over dims and over everything.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_reductions(std::vector<OpInfo>& t) {
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

}

}  // namespace tg_test::table
