// The op table's entries for losses: cross_entropy and mse_loss.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_losses(std::vector<OpInfo>& t) {
  for (const auto& option : std::vector<std::pair<double, std::int64_t>>{{0.0, -100}, {0.2, 1}}) {
    const double smoothing = option.first;  // not a structured binding: clang 14 cannot capture those
    const std::int64_t ignore = option.second;
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
}

}  // namespace tg_test::table
