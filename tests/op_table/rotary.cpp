// The op table's entry for rotary position embeddings: both layouts, a partial rotary_dim,
// negative positions and a decode-like offset.
#include "op_table/common.hpp"

namespace tg_test::table {
namespace {

// positions[l] = 3l - 2 (negative first) and 1000 + l (a KV-cache step's offset).
std::vector<std::int64_t> positions_of(std::int64_t length, bool offset) {
  std::vector<std::int64_t> p;
  for (std::int64_t l = 0; l < length; ++l) p.push_back(offset ? 1000 + l : 3 * l - 2);
  return p;
}

struct Variant {
  bool offset;
  double base;
  std::int64_t rotary_dim;  // 0: all of D
  tg::RotaryLayout layout;
};
std::vector<Variant> variants() {
  using L = tg::RotaryLayout;
  return {{false, 10000.0, 0, L::half_split}, {false, 10000.0, 0, L::interleaved}, {true, 100.0, 2, L::half_split},
          {true, 100.0, 2, L::interleaved}};
}

// Plain loops from the formula: channel j of row l belongs to pair i with partner channel k.
Ref ref_rotary(const Ref& x, const std::vector<std::int64_t>& pos, const Variant& v) {
  const std::int64_t d = x.shape.back(), len = x.shape[x.shape.size() - 2];
  const std::int64_t r = v.rotary_dim == 0 ? d : v.rotary_dim;
  Ref out{x.shape, x.v};
  for (std::int64_t flat = 0; flat < x.numel(); ++flat) {
    const std::int64_t j = flat % d, l = (flat / d) % len;
    if (j >= r) continue;
    std::int64_t i = 0, first = 0, second = 0;
    if (v.layout == tg::RotaryLayout::half_split) {
      i = j % (r / 2);
      first = i, second = i + r / 2;
    } else {
      i = j / 2;
      first = 2 * i, second = 2 * i + 1;
    }
    const double theta = static_cast<double>(pos[static_cast<std::size_t>(l)]) * std::pow(v.base, -2.0 * static_cast<double>(i) / static_cast<double>(r));
    const double a = x.v[static_cast<std::size_t>(flat - j + first)], b = x.v[static_cast<std::size_t>(flat - j + second)];
    out.v[static_cast<std::size_t>(flat)] = j == first ? a * std::cos(theta) - b * std::sin(theta) : a * std::sin(theta) + b * std::cos(theta);
  }
  return out;
}

}  // namespace

void add_rotary(std::vector<OpInfo>& t) {
  OpInfo info;
  info.name = "rotary";
  info.covers = {"rotary"};
  info.samples = {{{3, 4}}, {{2, 3, 6}}, {{2, 1, 5, 4}}, {{1, 2}}, {{0, 4}}, {{0, 3, 4}}};
  info.op = [](const Ins& in) {
    Outs outs;
    for (const Variant& v : variants()) {
      const auto p = positions_of(in[0].size(-2), v.offset);
      const Tensor positions = arg(tg::from_vector(std::span<const std::int64_t>(p), {in[0].size(-2)}));
      outs.push_back(tg::rotary(in[0], positions, {.base = v.base, .rotary_dim = v.rotary_dim, .layout = v.layout}));
    }
    return outs;
  };
  info.reference = [](const Refs& in) {
    Refs outs;
    for (const Variant& v : variants()) outs.push_back(ref_rotary(in[0], positions_of(in[0].shape[in[0].shape.size() - 2], v.offset), v));
    return outs;
  };
  const auto ids = [](std::vector<std::int64_t> v) { return tg::from_vector(std::span<const std::int64_t>(v), {static_cast<std::int64_t>(v.size())}); };
  info.errors = {
      {"integer x", [ids] { tg::rotary(tg::zeros({2, 4}, tg::int64), ids({0, 1})); }, Raises::dtype, {"rotary", "'x'", "int64", "[2, 4]"}},
      {"x of rank 1", [ids] { tg::rotary(f32({4}), ids({0})); }, Raises::shape, {"rotary", "'x'", "rank >= 2", "[4]"}},
      {"float positions", [] { tg::rotary(f32({2, 4}), f32({2})); }, Raises::dtype, {"rotary", "'positions'", "int64", "float32"}},
      {"one position too few", [ids] { tg::rotary(f32({3, 4}), ids({0, 1})); }, Raises::shape, {"rotary", "'positions'", "[3]", "[2]", "[3, 4]"}},
      {"positions of rank 2", [] { tg::rotary(f32({3, 4}), tg::zeros({1, 3}, tg::int64)); }, Raises::shape, {"rotary", "'positions'", "[3]", "[1, 3]"}},
      {"odd rotary_dim", [ids] { tg::rotary(f32({1, 4}), ids({0}), {.rotary_dim = 3}); }, Raises::value, {"rotary", "options.rotary_dim", "even", "got 3"}},
      {"odd D, rotary_dim all of it", [ids] { tg::rotary(f32({1, 5}), ids({0})); }, Raises::value, {"rotary", "options.rotary_dim", "D = 5", "odd here", "[1, 5]"}},
      {"rotary_dim past D", [ids] { tg::rotary(f32({1, 4}), ids({0}), {.rotary_dim = 6}); }, Raises::value, {"rotary", "options.rotary_dim", "D = 4", "got 6"}},
      {"negative rotary_dim", [ids] { tg::rotary(f32({1, 4}), ids({0}), {.rotary_dim = -2}); }, Raises::value, {"rotary", "options.rotary_dim", "got -2"}},
      {"zero base", [ids] { tg::rotary(f32({1, 4}), ids({0}), {.base = 0.0}); }, Raises::value, {"rotary", "options.base", ">= 1", "got 0"}},
      {"base below 1", [ids] { tg::rotary(f32({1, 4}), ids({0}), {.base = 0.5}); }, Raises::value, {"rotary", "options.base", ">= 1", "got 0.5"}},
      {"infinite base", [ids] { tg::rotary(f32({1, 4}), ids({0}), {.base = HUGE_VAL}); }, Raises::value, {"rotary", "options.base", "finite", "inf"}},
      {"NaN base", [ids] { tg::rotary(f32({1, 4}), ids({0}), {.base = std::nan("")}); }, Raises::value, {"rotary", "options.base", "nan"}},
      {"position past 2^53", [ids] { tg::rotary(f32({2, 4}), ids({0, (std::int64_t{1} << 53) + 1})); }, Raises::value,
       {"rotary", "'positions'", "9007199254740993", "[1]", "2^53"}},
      undefined_arg("rotary", "x", [ids] { tg::rotary(Tensor(), ids({0})); }),
      undefined_arg("rotary", "positions", [] { tg::rotary(f32({1, 2}), Tensor()); }),
      // an undefined argument is named before another argument's shape is judged
      undefined_arg("rotary", "positions", [] { tg::rotary(f32({2}), Tensor()); })};
  info.undefined_inputs_unreachable = "op builds the positions from the input's shape";
  t.push_back(info);
}

}  // namespace tg_test::table
