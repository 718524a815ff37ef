// sample() over logits (greedy, temperature, top-k, top-p) against the softmax it draws from,
// and generate() over a model that is not a Decoder.
#define BOOST_TEST_MODULE sampling
#include <cmath>
#include <limits>
#include <vector>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// `draws` samples of one row: the frequency of each token.
std::vector<double> frequencies(const std::vector<double>& logits, const tg::SampleOptions& o, std::int64_t draws,
                                std::uint64_t seed = 1) {
  const auto vocab = static_cast<std::int64_t>(logits.size());
  std::vector<double> rows;
  for (std::int64_t i = 0; i < draws; ++i) rows.insert(rows.end(), logits.begin(), logits.end());
  tg::Generator gen(seed);
  std::vector<double> f(logits.size(), 0.0);
  for (std::int64_t id : tg::sample(tg::from_vector(rows, {draws, vocab}), o, gen).to_vector<std::int64_t>()) f[static_cast<std::size_t>(id)] += 1;
  for (double& x : f) x /= static_cast<double>(draws);
  return f;
}

// Each frequency within five standard deviations of its probability; a probability of 0 is never drawn.
void check_frequencies(const std::vector<double>& f, const std::vector<double>& p, std::int64_t draws, const std::string& what) {
  BOOST_REQUIRE(f.size() == p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double bound = 5 * std::sqrt(p[i] * (1 - p[i]) / static_cast<double>(draws));
    if (p[i] == 0)
      BOOST_CHECK_MESSAGE(f[i] == 0, what << ": token " << i << " is outside the set yet was drawn " << f[i] << " of the time");
    else
      BOOST_CHECK_MESSAGE(std::abs(f[i] - p[i]) <= bound, what << ": token " << i << " drawn " << f[i] << ", expected " << p[i]);
  }
}

// softmax(logits / t) over the tokens `keep` marks, 0 elsewhere.
std::vector<double> softmax_over(const std::vector<double>& logits, double t, const std::vector<bool>& keep) {
  std::vector<double> p(logits.size(), 0.0);
  double z = 0;
  for (std::size_t i = 0; i < p.size(); ++i) z += p[i] = keep[i] ? std::exp(logits[i] / t) : 0.0;
  for (double& x : p) x /= z;
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sampling)

BOOST_AUTO_TEST_CASE(temperature_zero_is_the_argmax_and_draws_nothing) {
  tg::Generator gen(3);
  const tg::Tensor before = gen.get_state();
  const tg::Tensor logits = tg::tensor({{1.0, 3.0, 3.0, 0.0}, {-kInf, -2.0, -5.0, -2.0}, {0.5, 0.25, 0.75, 0.0}}, tg::float64);
  BOOST_TEST(tg::sample(logits, {.temperature = 0}, gen).to_vector<std::int64_t>() == std::vector<std::int64_t>({1, 1, 2}));
  BOOST_TEST(tg::sample(logits.to(tg::float32), {.temperature = 0, .top_k = 2, .top_p = 0.1}, gen).to_vector<std::int64_t>() ==
             std::vector<std::int64_t>({1, 1, 2}));
  BOOST_TEST(gen.get_state().to_vector<std::int64_t>() == before.to_vector<std::int64_t>());
  // [V] gives a scalar id.
  const tg::Tensor one = tg::sample(tg::tensor({0.0, 2.0, 1.0}), {.temperature = 0}, gen);
  BOOST_TEST(one.shape() == tg::Shape{});
  BOOST_TEST(one.item() == 1);
}

BOOST_AUTO_TEST_CASE(top_k_one_is_greedy_at_any_temperature) {
  const tg::Tensor logits = tg::randn({200, 9}, 4, tg::float64);
  tg::Generator a(1), b(2);
  const auto greedy = tg::sample(logits, {.temperature = 0}, a).to_vector<std::int64_t>();
  BOOST_TEST(tg::sample(logits, {.temperature = 7, .top_k = 1}, a).to_vector<std::int64_t>() == greedy);
  BOOST_TEST(tg::sample(logits, {.temperature = 0.1, .top_p = 1e-9}, b).to_vector<std::int64_t>() == greedy);
  // and without either, higher temperatures leave the argmax often.
  BOOST_TEST(tg::sample(logits, {.temperature = 7}, b).to_vector<std::int64_t>() != greedy);
}

BOOST_AUTO_TEST_CASE(draws_follow_the_softmax_of_logits_over_temperature) {
  const std::vector<double> logits{2.0, 1.0, 0.5, 0.0, -1.0, -3.0};
  const std::vector<bool> all(logits.size(), true);
  constexpr std::int64_t n = 20000;
  for (const double t : {1.0, 0.6, 2.5})
    check_frequencies(frequencies(logits, {.temperature = t}, n), softmax_over(logits, t, all), n, fmt::format("temperature {}", t));
  // Row order does not matter: the same logits shuffled give the shuffled frequencies.
  const std::vector<double> shuffled{-1.0, 2.0, -3.0, 0.0, 1.0, 0.5};
  check_frequencies(frequencies(shuffled, {.temperature = 0.8}, n, 5), softmax_over(shuffled, 0.8, all), n, "shuffled");
}

BOOST_AUTO_TEST_CASE(top_k_draws_only_the_k_most_likely) {
  const std::vector<double> logits{0.1, 2.0, -1.0, 1.5, 1.0, 0.0};
  constexpr std::int64_t n = 20000;
  check_frequencies(frequencies(logits, {.temperature = 1.3, .top_k = 3}, n), softmax_over(logits, 1.3, {false, true, false, true, true, false}),
                    n, "top_k 3");
  check_frequencies(frequencies(logits, {.temperature = 1.0, .top_k = 100}, n), softmax_over(logits, 1.0, std::vector<bool>(6, true)), n,
                    "top_k beyond the vocabulary");
  // Ties at the k-th logit are kept, as Hugging Face's TopKLogitsWarper keeps them.
  const std::vector<double> tied{3.0, 2.0, 1.0, 2.0};
  check_frequencies(frequencies(tied, {.top_k = 2}, n), softmax_over(tied, 1.0, {true, true, false, true}), n, "tie at the k-th");
}

BOOST_AUTO_TEST_CASE(top_p_draws_only_the_nucleus_after_top_k) {
  // Probabilities 0.5, 0.25, 0.15, 0.1 (token order shuffled).
  const std::vector<double> logits{std::log(0.15), std::log(0.5), std::log(0.1), std::log(0.25)};
  constexpr std::int64_t n = 20000;
  // 0.8: tokens 1 and 3 hold 0.75 < 0.8, so token 0 joins; the three hold 0.9 >= 0.8, so 2 stays out.
  check_frequencies(frequencies(logits, {.top_p = 0.8}, n), softmax_over(logits, 1.0, {true, true, false, true}), n, "top_p 0.8");
  check_frequencies(frequencies(logits, {.top_p = 0.6}, n), softmax_over(logits, 1.0, {false, true, false, true}), n, "top_p 0.6");
  // Always at least the most likely token.
  check_frequencies(frequencies(logits, {.temperature = 3, .top_p = 0.01}, n), {0, 1, 0, 0}, n, "top_p 0.01");
  // top_k first, then the nucleus of what it kept: after top_k = 2 token 1 holds 2/3 >= 0.6, so
  // it alone remains (over the whole distribution it would be tokens 1 and 3).
  check_frequencies(frequencies(logits, {.top_k = 2, .top_p = 0.6}, n), {0, 1, 0, 0}, n, "top_k then top_p");
  // top_p = 1 keeps every token.
  check_frequencies(frequencies(logits, {.top_p = 1}, n), softmax_over(logits, 1.0, std::vector<bool>(4, true)), n, "top_p 1");
  // A tie across the nucleus's boundary is cut by id (sampling.hpp), where top_k keeps ties.
  const std::vector<double> tied{0.0, 0.0, 0.0};
  check_frequencies(frequencies(tied, {.top_p = 0.5}, n), {0.5, 0.5, 0}, n, "tie at the top_p boundary");
}

BOOST_AUTO_TEST_CASE(minus_infinity_is_never_drawn) {
  const std::vector<double> logits{-kInf, 0.0, -kInf, 1.0, -kInf};
  constexpr std::int64_t n = 5000;
  check_frequencies(frequencies(logits, {.temperature = 50}, n), softmax_over(logits, 50, {false, true, false, true, false}), n, "-inf");
  check_frequencies(frequencies(logits, {.temperature = 50, .top_k = 4}, n), softmax_over(logits, 50, {false, true, false, true, false}), n,
                    "-inf within top_k");
}

BOOST_AUTO_TEST_CASE(each_row_takes_one_uniform_in_order) {
  const tg::Tensor logits = tg::randn({5, 7}, 8, tg::float32);
  tg::Generator batch(9), rows(9);
  const auto together = tg::sample(logits, {.temperature = 1.5, .top_k = 4}, batch).to_vector<std::int64_t>();
  for (std::int64_t b = 0; b < 5; ++b)
    BOOST_TEST(tg::sample(tg::select(logits, 0, b), {.temperature = 1.5, .top_k = 4}, rows).item() == together[b]);
  BOOST_TEST(batch.uniform() == rows.uniform());
}

BOOST_AUTO_TEST_CASE(bad_logits_and_options_are_refused) {
  tg::Generator gen(1);
  const tg::Tensor ok = tg::zeros({2, 3});
  check_throws<tg::ValueError>([&] { tg::sample(ok, {.temperature = -1}, gen); }, {"sample", "options.temperature", "-1"});
  check_throws<tg::ValueError>([&] { tg::sample(ok, {.temperature = kInf}, gen); }, {"sample", "options.temperature", "finite", "inf"});
  check_throws<tg::ValueError>([&] { tg::sample(ok, {.temperature = std::nan("")}, gen); }, {"sample", "options.temperature", "nan"});
  check_throws<tg::ValueError>([&] { tg::sample(ok, {.top_k = -2}, gen); }, {"sample", "options.top_k", ">= 0", "-2"});
  check_throws<tg::ValueError>([&] { tg::sample(ok, {.top_p = 0}, gen); }, {"sample", "options.top_p", "(0, 1]", "got 0"});
  check_throws<tg::ValueError>([&] { tg::sample(ok, {.top_p = 1.5}, gen); }, {"sample", "options.top_p", "1.5"});
  // check_sample_options is public: a null caller's name is its own, not fmt's format_error.
  check_throws<tg::ValueError>([&] { tg::check_sample_options(nullptr, {.top_p = 2}); }, {"check_sample_options", "options.top_p", "got 2"});
  check_throws<tg::ValueError>([&] { tg::sample(ok, {.top_p = std::nan("")}, gen); }, {"sample", "options.top_p", "nan"});
  check_throws<tg::DTypeError>([&] { tg::sample(tg::zeros({2, 3}, tg::int64), {}, gen); }, {"sample", "'logits'", "int64"});
  check_throws<tg::ShapeError>([&] { tg::sample(tg::zeros({2, 3, 4}), {}, gen); }, {"sample", "'logits'", "[V] or [B, V]", "[2, 3, 4]"});
  check_throws<tg::ShapeError>([&] { tg::sample(tg::zeros({2, 0}), {}, gen); }, {"sample", "V >= 1", "[2, 0]"});
  check_throws<tg::ValueError>([&] { tg::sample(tg::tensor({{0.0, 1.0}, {std::nan(""), 0.0}}), {}, gen); }, {"sample", "nan", "row 1, token 0"});
  check_throws<tg::ValueError>([&] { tg::sample(tg::tensor({0.0, kInf}), {.temperature = 0}, gen); }, {"sample", "inf", "token 1"});
  check_throws<tg::ValueError>([&] { tg::sample(tg::tensor({{0.0, 1.0}, {-kInf, -kInf}}), {}, gen); }, {"sample", "row 1", "-inf everywhere"});
  check_throws<tg::Error>([&] { tg::sample(Tensor(), {}, gen); }, {"sample", "'logits'", "undefined"});
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// A model that is not a Decoder: the logits of the next token are a table's row for the last
// token, and its cache counts positions, refusing more than `limit` and counting fresh starts.
struct Bigram {
  struct Cache {
    std::int64_t positions = 0;
  };
  tg::Tensor table;  // [V, V]
  std::int64_t limit = 0;
  mutable int starts = 0;
  Cache start_cache() const {
    ++starts;
    return {};
  }
  tg::Tensor decode_step(const tg::Tensor& tokens, Cache& cache) const {
    cache.positions += tokens.size(1);
    BOOST_REQUIRE(limit == 0 || cache.positions <= limit);
    return tg::index_select(table, 0, tg::select(tokens, 1, -1));
  }
};
static_assert(tg::CachedModel<Bigram>);
static_assert(tg::CachedModel<tg::Decoder>);

// Token t is followed by t + 1 (mod 5) with logit 4 above the others.
Bigram counting_bigram(std::int64_t limit = 0) {
  std::vector<double> t(25, 0.0);
  for (int i = 0; i < 5; ++i) t[static_cast<std::size_t>(i * 5 + (i + 1) % 5)] = 4.0;
  return {tg::from_vector(t, {5, 5}), limit};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(generation)

BOOST_AUTO_TEST_CASE(generate_runs_any_cached_model) {
  const Bigram model = counting_bigram();
  const tg::Tensor prompt = tg::from_vector(std::vector<std::int64_t>{0, 1, 3, 4}, {2, 2});
  tg::Generator gen(1);
  BOOST_TEST(tg::generate(model, prompt, {.new_tokens = 4, .temperature = 0}, gen).to_vector<std::int64_t>() ==
             std::vector<std::int64_t>({0, 1, 2, 3, 4, 0, 3, 4, 0, 1, 2, 3}));
  // Sampling is sample() on each step's logits, drawn from the generator it is given.
  const tg::GenerateOptions o{.new_tokens = 12, .temperature = 2.0, .top_k = 3, .top_p = 0.9};
  tg::Generator a(7), b(7);
  const auto out = tg::generate(model, prompt, o, a).to_vector<std::int64_t>();
  std::vector<std::int64_t> last{1, 4}, expected[2] = {{0, 1}, {3, 4}};
  for (int step = 0; step < 12; ++step) {
    const tg::Tensor logits = tg::index_select(model.table, 0, tg::from_vector(last, {2}));
    last = tg::sample(logits, {.temperature = 2.0, .top_k = 3, .top_p = 0.9}, b).to_vector<std::int64_t>();
    for (int r = 0; r < 2; ++r) expected[r].push_back(last[static_cast<std::size_t>(r)]);
  }
  expected[0].insert(expected[0].end(), expected[1].begin(), expected[1].end());
  BOOST_TEST(out == expected[0]);
  BOOST_TEST(out != tg::generate(model, prompt, {.new_tokens = 12, .temperature = 0}, gen).to_vector<std::int64_t>());
}

BOOST_AUTO_TEST_CASE(generate_restarts_a_full_cache_from_the_tail) {
  // The cache refuses a fifth position: with restart_after = 4 generation starts it afresh from
  // the last 2 tokens whenever the next would not fit, and the bigram's tokens do not change.
  const Bigram limited = counting_bigram(4), free = counting_bigram();
  const tg::Tensor prompt = tg::from_vector(std::vector<std::int64_t>{2, 3}, {1, 2});
  tg::Generator a(3), b(3);
  const tg::GenerateOptions o{.new_tokens = 9, .temperature = 1.0, .restart_after = 4};
  BOOST_TEST(tg::generate(limited, prompt, o, a).to_vector<std::int64_t>() ==
             tg::generate(free, prompt, {.new_tokens = 9, .temperature = 1.0}, b).to_vector<std::int64_t>());
  // Steps 0-2 fill 2 (the prompt), 3, 4 positions; steps 3 and 6 restart from 2 tokens, each
  // followed by two steps that fill it again: three starts in all.
  BOOST_TEST(limited.starts == 3);
  BOOST_TEST(free.starts == 1);
}

BOOST_AUTO_TEST_CASE(generate_checks_its_prompt_options_and_model) {
  const Bigram model = counting_bigram();
  tg::Generator gen(1);
  const tg::Tensor prompt = tg::from_vector(std::vector<std::int64_t>{0, 1}, {1, 2});
  check_throws<tg::DTypeError>([&] { tg::generate(model, prompt.to(tg::float32), {}, gen); }, {"generate", "'prompt'", "int64"});
  check_throws<tg::ShapeError>([&] { tg::generate(model, tg::select(prompt, 0, 0), {}, gen); }, {"generate", "[B, T0]", "[2]"});
  check_throws<tg::ValueError>([&] { tg::generate(model, prompt, {.new_tokens = -1}, gen); }, {"generate", "options.new_tokens", "-1"});
  check_throws<tg::ValueError>([&] { tg::generate(model, prompt, {.top_p = 0}, gen); }, {"generate", "options.top_p", "got 0"});
  check_throws<tg::ValueError>([&] { tg::generate(model, prompt, {.restart_after = 1}, gen); }, {"generate", "options.restart_after", "1"});
  check_throws<tg::ValueError>([&] { tg::generate(model, prompt, {.restart_after = 2}, gen); }, {"generate", "fewer than options.restart_after = 2"});
  const Bigram wrong{tg::zeros({5, 2, 5}), 0};
  check_throws<tg::ShapeError>([&] { tg::generate(wrong, prompt, {}, gen); }, {"generate", "decode_step", "[B = 1, V]", "[1, 2, 5]"});
  // Logits sample() refuses are named as the model's, by generate, with sample's reason.
  const Bigram nan_logits{tg::full({5, 5}, std::nan(""), tg::float64), 0};
  check_throws<tg::ValueError>([&] { tg::generate(nan_logits, prompt, {}, gen); },
                               {"generate: the logits the model's decode_step returned at step 0 cannot be sampled", "nan", "row 0"});
  const Bigram int_logits{tg::zeros({5, 5}, tg::int64), 0};
  check_throws<tg::DTypeError>([&] { tg::generate(int_logits, prompt, {}, gen); }, {"generate", "decode_step", "int64"});
  const Bigram no_vocab{tg::zeros({5, 0}), 0};
  check_throws<tg::ShapeError>([&] { tg::generate(no_vocab, prompt, {}, gen); }, {"generate", "decode_step", "V >= 1"});
}

// Decoder::generate is generate() over the Decoder's decode_step (both run detail::generate_tokens).
BOOST_AUTO_TEST_CASE(decoder_generates_through_generate) {
  tg::Decoder model({.vocab = 7, .max_len = 9, .dim = 8, .heads = 2, .layers = 2, .seed = 11});
  model.eval();
  const tg::Tensor prompt = tg::from_vector(std::vector<std::int64_t>{1, 2, 5, 6}, {2, 2});
  tg::Generator gen(4);
  const tg::GenerateOptions o{.new_tokens = 7, .temperature = 1.2, .top_k = 5, .seed = 4, .top_p = 0.8};
  BOOST_TEST(tg::generate(model, prompt, o, gen).to_vector<std::int64_t>() == model.generate(prompt, o).to_vector<std::int64_t>());
  tg::Decoder::Cache short_cache(1);
  check_throws<tg::ValueError>([&] { model.decode_step(prompt, short_cache); }, {"Decoder::decode_step", "'cache'", "1 KV caches", "2 blocks"});
  check_throws<tg::ValueError>([&] { model.generate(prompt, {.top_p = 2}); }, {"Decoder::generate", "options.top_p", "got 2"});
  // Its position table bounds generate() as it bounds Decoder::generate, before any step runs.
  const tg::GenerateOptions fits{.new_tokens = 7, .temperature = 0}, too_long{.new_tokens = 8, .temperature = 0};
  BOOST_TEST(tg::generate(model, prompt, fits, gen).to_vector<std::int64_t>() == model.generate(prompt, fits).to_vector<std::int64_t>());
  check_throws<tg::ValueError>([&] { tg::generate(model, prompt, too_long, gen); },
                               {"generate: the prompt's 2 positions plus options.new_tokens = 8", "the model's max_positions() = 9",
                                "restart_after"});
  check_throws<tg::ValueError>([&] { model.generate(prompt, too_long); }, {"Decoder::generate", "must fit config.max_len = 9"});
  check_throws<tg::ValueError>([&] { tg::generate(model, prompt, {.restart_after = 10}, gen); },
                               {"generate", "options.restart_after must be at most the model's max_positions() = 9", "got 10"});
  BOOST_TEST(tg::generate(model, prompt, {.new_tokens = 30, .temperature = 0, .restart_after = 9}, gen).size(1) == 32);
}

BOOST_AUTO_TEST_SUITE_END()
