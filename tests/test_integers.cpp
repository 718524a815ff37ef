// Arithmetic on integers a user gives (offsets, lengths, counts, heads, sizes of views that hold
// no element) never overflows: an extreme value is refused with an error whose message shows the
// values as given, or runs. Under UndefinedBehaviorSanitizer (the sanitizer build runs this
// suite) an overflow anywhere on these paths aborts.
#define BOOST_TEST_MODULE integers
#include <limits>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

// A [rows, cols] view of one float that holds no memory of its size.
Tensor broadcast(std::int64_t rows, std::int64_t cols) { return tg::expand(tg::zeros({1, 1}), {rows, cols}); }

// 2^17 + 1 parameters of 2^46 elements each (views of one float): 2^63 + 2^46 elements in all.
class Huge : public tg::Module {
 public:
  Huge() {
    const Tensor one = tg::zeros({1});
    for (int i = 0; i <= 1 << 17; ++i) {
      params.push_back(tg::expand(one, {std::int64_t{1} << 46}).detach().set_requires_grad());
      names.push_back(fmt::format("p{}", i));
    }
  }
  void visit(tg::ModuleVisitor& v) override {
    for (std::size_t i = 0; i < params.size(); ++i) v.parameter(names[i], params[i]);
  }
  std::vector<Tensor> params;
  std::vector<std::string> names;
};
}  // namespace

BOOST_AUTO_TEST_CASE(position_offsets_at_the_int64_limits) {
  const tg::LearnedPositions pos({.max_len = 8, .dim = 4});
  check_throws<tg::ShapeError>([&] { pos.forward(tg::zeros({1, 2, 4}), kMax); },
                               {"LearnedPositions::forward", "T = 2", "offset 9223372036854775807", "[0, 8)"});
  check_throws<tg::ShapeError>([&] { pos.forward(tg::zeros({1, 0, 4}), kMin); }, {"T = 0", "offset -9223372036854775808"});
  BOOST_TEST(pos.forward(tg::zeros({1, 0, 4}), 8).numel() == 0);  // no position at the end
}

BOOST_AUTO_TEST_CASE(an_optimizer_at_the_largest_step_count_refuses_another_step) {
  Tensor w = tg::ones({3}).set_requires_grad();
  for (int kind = 0; kind < 2; ++kind) {
    std::unique_ptr<tg::Optimizer> opt;
    if (kind == 0) opt = std::make_unique<tg::SGD>(std::vector<tg::NamedTensor>{{"w", w}}, tg::SgdOptions{.momentum = 0.5});
    else opt = std::make_unique<tg::AdamW>(std::vector<tg::NamedTensor>{{"w", w}});
    opt->load_state(opt->state(), kMax);
    tg::backward(tg::sum(w * w));
    check_throws<tg::ValueError>([&] { opt->step(); }, {"::step", "9223372036854775807", "load_state"});
    BOOST_TEST(opt->steps() == kMax);
    BOOST_TEST(w.to_vector<double>() == std::vector<double>({1, 1, 1}));  // refused before any update
    w.zero_grad();
  }
}

BOOST_AUTO_TEST_CASE(linear_on_rows_whose_product_with_the_width_passes_int64) {
  // 2^40 rows (a view of one element) times 2^24 outputs: the result cannot exist, and the error
  // says so for linear (the product of the two counts used to wrap to 0 and ask for zeros).
  const tg::Linear lin({.in = 1, .out = std::int64_t{1} << 24, .bias = false});
  check_throws<tg::ShapeError>([&] { lin.forward(broadcast(std::int64_t{1} << 40, 1)); }, {"linear", "addressed"});
}

BOOST_AUTO_TEST_CASE(attention_scores_more_than_int64_can_count_are_refused) {
  // [1, 2^32, 2^32, 1, 1] pairs from rank-5 views of one element each: 2^64 pairs.
  const Tensor q = tg::expand(tg::zeros({1, 1, 1, 1, 1}), {1, std::int64_t{1} << 32, 1, 1, 1});
  const Tensor k = tg::expand(tg::zeros({1, 1, 1, 1, 1}), {1, 1, std::int64_t{1} << 32, 1, 1});
  for (bool fused : {false, true})
    check_throws<tg::ShapeError>([&] { fused ? (void)tg::attention(q, k, k) : (void)tg::scaled_dot_product_attention(q, k, k); },
                                 {"q [1, 4294967296, 1, 1, 1]", "give the scores [1, 4294967296, 4294967296, 1, 1]", "int64 can count"});
  // heads * Q * K past int64 in multihead_attention (heads up to the projection's width).
  const std::int64_t heads = std::int64_t{1} << 40;
  const Tensor x = tg::expand(tg::zeros({1, 1, 1}), {1, std::int64_t{1} << 24, 1});
  const Tensor w = broadcast(1, heads), wo = broadcast(heads, 1);
  check_throws<tg::ShapeError>([&] { tg::multihead_attention({x, x}, {w, w, w, wo}, {.attention_mask = tg::from_bools({true}, {1, 1, 1, 1})}, heads); },
                               {"multihead_attention", "heads = 1099511627776", "[1, 1099511627776, 16777216, 16777216]", "int64 can count"});
}

BOOST_AUTO_TEST_CASE(fused_attention_over_empty_batches_of_long_sequences) {
  // No element, but 2^22 queries, keys and widths: the backward's cost estimate, 2 Q K (D + Dv)
  // = 2^69, multiplies them.
  const std::int64_t n = std::int64_t{1} << 22;
  const Tensor q = tg::zeros({0, n, n}).set_requires_grad(), k = tg::zeros({0, n, n}), v = tg::zeros({0, n, n});
  tg::backward({tg::attention(q, k, v)}, {tg::zeros({0, n, n})});
  BOOST_TEST(q.grad().numel() == 0);
}

BOOST_AUTO_TEST_CASE(attention_over_a_huge_batch_of_empty_matrices_does_no_work) {
  // 2^46 batch entries with no query and no key (views of one element): no scores, so no path
  // may keep anything per batch entry (the fused tiles asked for 2^46 offsets, 512 TiB).
  const std::int64_t n = std::int64_t{1} << 46;
  const Tensor q = tg::expand(tg::zeros({1, 1, 1}), {n, 0, 1}).set_requires_grad(), k = tg::expand(tg::zeros({1, 1, 1}), {n, 0, 1});
  const Tensor v = tg::expand(tg::zeros({1, 1, 1}), {n, 0, 1});
  const Tensor out = tg::attention(q, k, v);
  BOOST_TEST((out.shape() == tg::Shape{n, 0, 1}));
  const tg::AttentionResult r = tg::scaled_dot_product_attention(q, k, v);
  BOOST_TEST((r.weights.shape() == tg::Shape{n, 0, 0}));
  tg::backward({out}, {tg::zeros({n, 0, 1})});
  BOOST_TEST((q.grad().shape() == tg::Shape{n, 0, 1}));
}

BOOST_AUTO_TEST_CASE(generation_lengths_past_int64_or_memory_are_refused_at_once) {
  tg::Decoder model({.vocab = 5, .max_len = 8, .dim = 4, .heads = 1});
  const Tensor prompt = tg::tensor({{1, 2}}, tg::int64);
  // With a window nothing else bounds new_tokens: refused before the first step, not after
  // (or never: the loop would run for 2^63 steps).
  check_throws<tg::ValueError>([&] { model.generate(prompt, {.new_tokens = kMax, .restart_after = 4}); }, {"Decoder::generate", "overflow"});
  check_throws<tg::ValueError>([&] { model.generate(prompt, {.new_tokens = kMax - 2, .restart_after = 4}); },
                               {"Decoder::generate", "9223372036854775807", "allocated"});
  BOOST_TEST(model.generate(prompt, {.new_tokens = 3, .top_k = kMax, .restart_after = 4}).size(1) == 5);
}

BOOST_AUTO_TEST_CASE(configs_whose_tables_cannot_be_allocated_are_value_errors) {
  check_throws<tg::ValueError>([] { tg::SinusoidalPositions({.max_len = std::int64_t{1} << 30, .dim = std::int64_t{1} << 20}); },
                               {"SinusoidalPositions", "config.max_len", "allocated"});
  check_throws<tg::ValueError>([] { tg::FeedForward({.dim = kMax / 2}); }, {"FeedForward", "4 * config.dim", "overflows"});
}

BOOST_AUTO_TEST_CASE(parameter_counts_past_int64_are_refused) {
  Huge huge;
  check_throws<tg::ValueError>([&] { huge.parameter_count(); }, {"parameter_count", "9223372036854775807"});
}
