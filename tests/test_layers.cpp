// The layers that train a transformer: each checked for its formula, its initialisation, its
// parameters' names, a float64 gradcheck with respect to its input and every parameter, and its
// configuration and argument errors.
#define BOOST_TEST_MODULE layers
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {

std::vector<std::string> names_of(tg::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.name);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(linear)

BOOST_AUTO_TEST_CASE(computes_x_w_plus_b_with_pytorch_initialisation) {
  tg::Linear lin({.in = 4, .out = 3, .dtype = tg::float64, .seed = 7});
  BOOST_TEST(names_of(lin) == (std::vector<std::string>{"weight", "bias"}), boost::test_tools::per_element());
  BOOST_TEST(lin.parameter_count() == 15);
  for (double w : lin.weight.to_vector<double>()) BOOST_TEST(std::abs(w) <= 0.5);  // 1/sqrt(4)
  const Tensor x = tg::randn({2, 5, 4}, 1, tg::float64);
  const Tensor expected = tg::matmul(x, lin.weight) + lin.bias;
  check_close(lin.forward(x).to_vector<double>(), expected.to_vector<double>(), 0, 0, "x W + b");
  tg::Linear no_bias({.in = 4, .out = 3, .bias = false});
  BOOST_TEST(names_of(no_bias) == (std::vector<std::string>{"weight"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(gradcheck_input_and_parameters) {
  tg::Linear lin({.in = 3, .out = 2, .dtype = tg::float64, .seed = 1});
  const Tensor x = tg::randn({2, 3}, 2, tg::float64).set_requires_grad();
  auto params = lin.parameters();
  params.push_back(x);
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{lin.forward(x)}; }, params);
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(r.elements_checked == 6u + 2u + 6u);
}

BOOST_AUTO_TEST_CASE(bad_configuration_and_inputs_are_named) {
  check_throws<tg::ValueError>([] { tg::Linear({.in = 0, .out = 3}); }, {"Linear", "config.in", ">= 1", "0"});
  check_throws<tg::ValueError>([] { tg::Linear({.in = 1LL << 40, .out = 1LL << 40}); }, {"Linear", "config.in * config.out", "overflows"});
  check_throws<tg::DTypeError>([] { tg::Linear({.in = 2, .out = 2, .dtype = tg::int64}); }, {"Linear", "config.dtype", "int64"});
  tg::Linear lin({.in = 4, .out = 3});
  check_throws<tg::ShapeError>([&] { lin.forward(tg::zeros({2, 5})); }, {"Linear::forward", "'x'", "[..., 4]", "[2, 5]"});
  check_throws<tg::DTypeError>([&] { lin.forward(tg::zeros({2, 4}, tg::float64)); }, {"Linear::forward", "'x'", "float64", "float32"});
  check_throws<tg::Error>([&] { lin.forward(Tensor()); }, {"Linear::forward", "'x'", "undefined"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(positions)

BOOST_AUTO_TEST_CASE(sinusoidal_table_matches_the_formula) {
  tg::SinusoidalPositions pos({.max_len = 10, .dim = 6, .dtype = tg::float64});
  BOOST_TEST(pos.parameter_count() == 0);
  const auto t = pos.table.to_vector<double>();
  for (int p : {0, 3, 9})
    for (int i = 0; i < 6; ++i) {
      const double angle = p / std::pow(10000.0, (i - i % 2) / 6.0);
      BOOST_TEST(t[static_cast<std::size_t>(p * 6 + i)] == (i % 2 ? std::cos(angle) : std::sin(angle)));
    }
  const Tensor x = tg::zeros({2, 3, 6}, tg::float64);
  const auto y = pos.forward(x, 4).to_vector<double>();  // rows 4, 5, 6 of the table, each batch
  BOOST_TEST(y[0] == t[4 * 6]);
  BOOST_TEST(y[18 + 2 * 6 + 5] == t[6 * 6 + 5]);
}

BOOST_AUTO_TEST_CASE(learned_table_gets_the_gradient_of_the_rows_used) {
  tg::LearnedPositions pos({.max_len = 5, .dim = 2, .dtype = tg::float64, .seed = 3});
  BOOST_TEST(names_of(pos) == (std::vector<std::string>{"table"}), boost::test_tools::per_element());
  const Tensor x = tg::randn({3, 2, 2}, 1, tg::float64).set_requires_grad();
  tg::backward(tg::sum(pos.forward(x, 1)));
  check_close(pos.table.grad(), {0, 0, 3, 3, 3, 3, 0, 0, 0, 0}, 0, "rows 1 and 2, summed over the batch of 3");
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{tg::pow(pos.forward(x, 1), 2.0)}; }, {pos.table, x});
  BOOST_TEST(r.ok, r.report());
}

BOOST_AUTO_TEST_CASE(positions_past_the_table_are_an_error) {
  tg::SinusoidalPositions pos({.max_len = 4, .dim = 2});
  check_throws<tg::ShapeError>([&] { pos.forward(tg::zeros({1, 3, 2}), 2); }, {"SinusoidalPositions::forward", "offset 2", "[0, 4)", "max_len"});
  check_throws<tg::ShapeError>([&] { pos.forward(tg::zeros({1, 3, 5})); }, {"SinusoidalPositions::forward", "'x'", "[B, T, 2]"});
  check_throws<tg::ValueError>([] { tg::LearnedPositions({.max_len = 0, .dim = 2}); }, {"LearnedPositions", "config.max_len"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(embedding_norm_feed_forward)

BOOST_AUTO_TEST_CASE(embedding_picks_rows_and_accumulates_repeated_ids) {
  tg::Embedding emb({.vocab = 5, .dim = 3, .dtype = tg::float64, .seed = 2});
  const Tensor ids = tg::from_vector(std::vector<std::int64_t>{4, 0, 4}, {1, 3});
  const Tensor y = emb.forward(ids);
  BOOST_TEST(y.shape() == (tg::Shape{1, 3, 3}));
  const auto w = emb.weight.to_vector<double>();
  BOOST_TEST(y.to_vector<double>()[0] == w[12]);
  tg::backward(tg::sum(y));
  check_close(emb.weight.grad(), {1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2}, 0, "row 4 used twice");
  check_throws<tg::DTypeError>([&] { emb.forward(tg::zeros({2})); }, {"Embedding::forward", "'ids'", "int64", "float32"});
  check_throws<tg::ValueError>([&] { emb.forward(tg::from_vector(std::vector<std::int64_t>{5}, {1})); }, {"embedding", "'ids'", "5", "[0, 5)"});
}

BOOST_AUTO_TEST_CASE(layer_norm_normalises_and_gradchecks) {
  tg::LayerNorm ln({.dim = 4, .dtype = tg::float64});
  BOOST_TEST(names_of(ln) == (std::vector<std::string>{"weight", "bias"}), boost::test_tools::per_element());
  const Tensor x = tg::randn({3, 4}, 5, tg::float64).set_requires_grad();
  const auto y = ln.forward(x).to_vector<double>();
  for (int r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int j = 0; j < 4; ++j) mean += y[r * 4 + j] / 4;
    for (int j = 0; j < 4; ++j) var += (y[r * 4 + j] - mean) * (y[r * 4 + j] - mean) / 4;
    BOOST_TEST(std::abs(mean) < 1e-12);
    BOOST_TEST(std::abs(var - 1) < 1e-4);  // 1 - eps / (var_x + eps)
  }
  tg::copy_(ln.weight, tg::tensor({1.5, -0.5, 2.0, 1.0}, tg::float64));
  auto params = ln.parameters();
  params.push_back(x);
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{ln.forward(x)}; }, params);
  BOOST_TEST(r.ok, r.report());
  tg::LayerNorm plain({.dim = 4, .affine = false});
  BOOST_TEST(plain.parameter_count() == 0);
  check_throws<tg::ValueError>([] { tg::LayerNorm({.dim = 4, .eps = 0}); }, {"LayerNorm", "config.eps"});
  check_throws<tg::ShapeError>([&] { ln.forward(tg::zeros({2, 5}, tg::float64)); }, {"LayerNorm::forward", "[..., 4]", "[2, 5]"});
}

BOOST_AUTO_TEST_CASE(rms_norm_divides_by_the_root_mean_square_and_gradchecks) {
  tg::RMSNorm norm({.dim = 4, .eps = 1e-12, .dtype = tg::float64});
  BOOST_TEST(names_of(norm) == (std::vector<std::string>{"weight"}), boost::test_tools::per_element());
  // Rows far from mean 0: layer_norm would centre them, rms_norm keeps their sign.
  const Tensor x = (tg::randn({3, 4}, 5, tg::float64) + 4.0).detach().set_requires_grad();
  const auto y = norm.forward(x).to_vector<double>();
  for (int r = 0; r < 3; ++r) {
    double ms = 0;
    for (int j = 0; j < 4; ++j) ms += y[r * 4 + j] * y[r * 4 + j] / 4;
    BOOST_TEST(std::abs(ms - 1) < 1e-12);
    for (int j = 0; j < 4; ++j) BOOST_TEST(y[r * 4 + j] > 0);
  }
  tg::copy_(norm.weight, tg::tensor({1.5, -0.5, 2.0, 1.0}, tg::float64));
  auto params = norm.parameters();
  params.push_back(x);
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{norm.forward(x)}; }, params);
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(tg::RMSNorm({.dim = 4, .affine = false}).parameter_count() == 0);
  check_throws<tg::ValueError>([] { tg::RMSNorm({.dim = 4, .eps = -1}); }, {"RMSNorm", "config.eps", "> 0", "-1"});
  check_throws<tg::ValueError>([] { tg::RMSNorm({.dim = 0}); }, {"RMSNorm", "config.dim", ">= 1", "0"});
  check_throws<tg::ShapeError>([&] { norm.forward(tg::zeros({2, 5}, tg::float64)); }, {"RMSNorm::forward", "'x'", "[..., 4]", "[2, 5]"});
  check_throws<tg::DTypeError>([&] { norm.forward(tg::zeros({2, 4})); }, {"RMSNorm::forward", "'x'", "float32", "config.dtype"});
}

BOOST_AUTO_TEST_CASE(a_norm_is_the_layer_or_rms_norm_its_kind_names) {
  tg::Norm layer(tg::NormKind::layer, 4, tg::float64), rms(tg::NormKind::rms, 4, tg::float64);
  BOOST_TEST(names_of(layer) == (std::vector<std::string>{"weight", "bias"}), boost::test_tools::per_element());
  BOOST_TEST(names_of(rms) == (std::vector<std::string>{"weight"}), boost::test_tools::per_element());
  const Tensor x = tg::randn({2, 4}, 3, tg::float64) + 1.0;
  BOOST_TEST(layer.forward(x).to_vector<double>() == tg::layer_norm(x).to_vector<double>(), boost::test_tools::per_element());
  BOOST_TEST(rms.forward(x).to_vector<double>() == tg::rms_norm(x).to_vector<double>(), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(swiglu_is_down_of_silu_gate_times_up_with_llamas_width) {
  tg::FeedForward ff({.dim = 6, .activation = tg::Activation::swiglu, .dtype = tg::float64, .seed = 4});
  BOOST_TEST(names_of(ff) == (std::vector<std::string>{"up.weight", "up.bias", "gate.weight", "gate.bias", "down.weight", "down.bias"}),
             boost::test_tools::per_element());
  BOOST_TEST(ff.up.config().out == 16);  // 8 * 6 / 3 = 16, already a multiple of 8
  const Tensor x = tg::randn({2, 3, 6}, 1, tg::float64).set_requires_grad();
  const Tensor h = tg::silu(tg::matmul(x, ff.gate->weight) + ff.gate->bias) * (tg::matmul(x, ff.up.weight) + ff.up.bias);
  check_close(ff.forward(x).to_vector<double>(), (tg::matmul(h, ff.down.weight) + ff.down.bias).to_vector<double>(), 1e-14, 1e-14,
              "down(silu(gate x) * up x)");
  auto params = ff.parameters();
  params.push_back(x);
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{ff.forward(x)}; }, params);
  BOOST_TEST(r.ok, r.report());
  // 8 * 10 / 3 = 26, rounded up to 32 (or to 30 with multiple_of 5); no biases on request.
  tg::FeedForward wide({.dim = 10, .activation = tg::Activation::swiglu, .bias = false});
  BOOST_TEST(wide.up.config().out == 32);
  BOOST_TEST(wide.parameter_count() == 3 * 10 * 32);
  BOOST_TEST(names_of(wide) == (std::vector<std::string>{"up.weight", "gate.weight", "down.weight"}), boost::test_tools::per_element());
  BOOST_TEST(tg::FeedForward({.dim = 10, .activation = tg::Activation::swiglu, .multiple_of = 5}).up.config().out == 30);
  BOOST_TEST(tg::FeedForward({.dim = 10}).up.config().out == 40);  // GELU keeps 4 * dim
  check_throws<tg::ValueError>([] { tg::FeedForward({.dim = 4, .multiple_of = 0}); }, {"FeedForward", "config.multiple_of", ">= 1", "0"});
  check_throws<tg::ValueError>([] { tg::FeedForward({.dim = INT64_MAX / 4, .activation = tg::Activation::swiglu}); },
                               {"FeedForward", "8 * config.dim / 3", "overflows", "config.hidden"});
}

BOOST_AUTO_TEST_CASE(a_llama_block_without_biases_gradchecks) {
  // RMSNorm, SwiGLU, grouped heads and rotary positions, no bias anywhere, float64.
  tg::TransformerBlock block({.dim = 8, .heads = 2, .norm = tg::NormKind::rms, .bias = false, .dtype = tg::float64, .seed = 6,
                              .rotary = tg::RotaryOptions{}, .kv_heads = 1});
  for (const auto& name : names_of(block)) BOOST_TEST(name.find("bias") == std::string::npos, name);
  const Tensor x = tg::randn({1, 4, 8}, 2, tg::float64).set_requires_grad();
  auto params = block.parameters();
  params.push_back(x);
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{block.forward(x)}; }, params, {.atol = 1e-6, .rtol = 1e-5});
  BOOST_TEST(r.ok, r.report());
}

BOOST_AUTO_TEST_CASE(dropout_is_seeded_in_training_and_the_identity_in_eval) {
  tg::Dropout a(0.5, 3), b(0.5, 3);
  const Tensor x = tg::ones({1000});
  const auto ya = a.forward(x).to_vector<float>(), yb = b.forward(x).to_vector<float>();
  BOOST_TEST(ya == yb);  // same seed, same mask
  const auto kept = std::count(ya.begin(), ya.end(), 2.0f);
  BOOST_TEST(kept > 400);
  BOOST_TEST(kept < 600);
  BOOST_TEST(std::count(ya.begin(), ya.end(), 0.0f) == 1000 - kept);
  a.eval();
  BOOST_TEST(a.forward(x).shares_storage_with(x));
  check_throws<tg::ValueError>([] { tg::Dropout(1.0); }, {"Dropout", "[0, 1)", "1"});
}

BOOST_AUTO_TEST_CASE(feed_forward_is_up_activation_down) {
  for (auto act : {tg::Activation::gelu, tg::Activation::relu}) {
    tg::FeedForward ff({.dim = 3, .hidden = 5, .activation = act, .dtype = tg::float64, .seed = 4});
    BOOST_TEST(names_of(ff) == (std::vector<std::string>{"up.weight", "up.bias", "down.weight", "down.bias"}),
               boost::test_tools::per_element());
    const Tensor x = tg::randn({2, 4, 3}, 6, tg::float64).set_requires_grad();
    const Tensor h = tg::matmul(x, ff.up.weight) + ff.up.bias;
    const Tensor expected = tg::matmul(act == tg::Activation::gelu ? tg::gelu(h) : tg::relu(h), ff.down.weight) + ff.down.bias;
    check_close(ff.forward(x).to_vector<double>(), expected.to_vector<double>(), 0, 0, "formula");
    auto params = ff.parameters();
    params.push_back(x);
    const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{ff.forward(x)}; }, params);
    BOOST_TEST(r.ok, r.report());
  }
  BOOST_TEST(tg::FeedForward({.dim = 3}).up.weight.shape() == (tg::Shape{3, 12}));  // hidden defaults to 4 dim
}

// FeedForward's GELU runs on the float32 kernels (where the float64 gradcheck above does not
// reach): its output and every gradient must still be the gelu op's.
BOOST_AUTO_TEST_CASE(feed_forward_float32_matches_the_gelu_op) {
  tg::FeedForward ff({.dim = 8, .hidden = 32, .dtype = tg::float32, .seed = 5});
  Tensor x = (tg::randn({3, 7, 8}, 9, tg::float32) * 3.0).detach().set_requires_grad();
  auto grads = [&](const Tensor& y) {
    for (auto p : ff.parameters()) p.zero_grad();
    x.zero_grad();
    tg::backward(tg::sum(y * tg::randn(y.shape(), 10, tg::float32)));
    std::vector<std::vector<double>> out{x.grad().to_vector<double>()};
    for (const auto& p : ff.parameters()) out.push_back(p.grad().to_vector<double>());
    return out;
  };
  const Tensor fused = ff.forward(x);
  const auto fused_grads = grads(fused);
  const Tensor plain = tg::linear(tg::gelu(tg::linear(x, ff.up.weight, ff.up.bias)), ff.down.weight, ff.down.bias);
  const auto plain_grads = grads(plain);
  check_close(fused.to_vector<double>(), plain.to_vector<double>(), 1e-6, 1e-6, "output");
  for (std::size_t i = 0; i < plain_grads.size(); ++i) check_close(fused_grads[i], plain_grads[i], 1e-5, 1e-5, "gradient");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(transformer)

// An enum field outside its enum (a cast from a config file's integer, say) is refused, as
// TokenFile and SubwordTokenizer::train refuse theirs, rather than picking a layer silently.
BOOST_AUTO_TEST_CASE(enum_fields_outside_their_enum_are_refused) {
  const auto bad_activation = static_cast<tg::Activation>(7);
  const auto bad_norm = static_cast<tg::NormKind>(7);
  const auto bad_positions = static_cast<tg::PositionKind>(7);
  check_throws<tg::ValueError>([&] { tg::FeedForward({.dim = 4, .activation = bad_activation}); },
                               {"FeedForward", "config.activation", "Activation::gelu, Activation::relu or Activation::swiglu", "7"});
  check_throws<tg::ValueError>([&] { tg::Norm(bad_norm, 4, tg::float32); }, {"Norm", "'kind'", "NormKind::layer or NormKind::rms", "7"});
  check_throws<tg::ValueError>([&] { tg::TransformerBlock({.dim = 4, .activation = bad_activation}); },
                               {"TransformerBlock", "config.activation", "7"});
  check_throws<tg::ValueError>([&] { tg::TransformerBlock({.dim = 4, .norm = bad_norm}); }, {"TransformerBlock", "config.norm", "7"});
  check_throws<tg::ValueError>([&] { tg::Decoder({.vocab = 3, .max_len = 4, .dim = 4, .activation = bad_activation}); },
                               {"Decoder", "config.activation", "7"});
  check_throws<tg::ValueError>([&] { tg::Decoder({.vocab = 3, .max_len = 4, .dim = 4, .norm = bad_norm}); }, {"Decoder", "config.norm", "7"});
  check_throws<tg::ValueError>([&] { tg::Decoder({.vocab = 3, .max_len = 4, .dim = 4, .positions = bad_positions}); },
                               {"Decoder", "config.positions", "PositionKind::learned, PositionKind::sinusoidal, PositionKind::rotary or PositionKind::alibi", "7"});
}


namespace {
tg::Decoder tiny_decoder(tg::DType dtype, tg::PositionKind positions = tg::PositionKind::learned) {
  return tg::Decoder({.vocab = 7, .max_len = 9, .dim = 8, .heads = 2, .layers = 2, .hidden = 16, .positions = positions, .dtype = dtype, .seed = 11});
}
Tensor ids_of(std::vector<std::int64_t> v, std::int64_t rows) {
  const auto cols = static_cast<std::int64_t>(v.size()) / rows;
  return tg::from_vector(std::span<const std::int64_t>(v), {rows, cols});
}
}  // namespace

BOOST_AUTO_TEST_CASE(parameters_are_named_like_the_modules) {
  tg::Decoder model = tiny_decoder(tg::float32);
  const auto names = names_of(model);
  BOOST_TEST(names.front() == "tok.weight");
  BOOST_TEST(names[1] == "pos.table");
  BOOST_TEST(std::count(names.begin(), names.end(), "blocks.1.attn.w_q") == 1);
  BOOST_TEST(std::count(names.begin(), names.end(), "blocks.0.ff.down.bias") == 1);
  BOOST_TEST(names.back() == "head.bias");
  // tok 7x8, pos 9x8, 2 blocks of (2 LayerNorms 32, attention 4x64 + 4x8, feed-forward 8x16+16+16x8+8), ln_f 16, head 8x7+7
  BOOST_TEST(model.parameter_count() == 56 + 72 + 2 * (32 + 288 + 280) + 16 + 63);
}

BOOST_AUTO_TEST_CASE(a_block_is_causal) {
  tg::TransformerBlock block({.dim = 8, .heads = 2, .dtype = tg::float64, .seed = 3});
  const Tensor x = tg::randn({1, 5, 8}, 1, tg::float64);
  const Tensor y = block.forward(x);
  // Changing position 3 changes outputs 3 and 4 only.
  Tensor x2 = tg::clone(x);
  tg::fill_(tg::select(tg::select(x2, 0, 0), 0, 3), 9.0);
  const auto a = y.to_vector<double>(), b = block.forward(x2).to_vector<double>();
  for (int i = 0; i < 5 * 8; ++i) BOOST_TEST((a[i] == b[i]) == (i < 3 * 8), "element " << i);
}

BOOST_AUTO_TEST_CASE(the_whole_tiny_model_gradchecks_with_respect_to_every_parameter) {
  // 2 blocks, width 8, 2 heads, sequence 5, float64, every kind of positions (rotary: each
  // block's q and k turned by position, nothing added to the embeddings).
  for (auto positions : {tg::PositionKind::learned, tg::PositionKind::sinusoidal, tg::PositionKind::rotary}) {
    tg::Decoder model = tiny_decoder(tg::float64, positions);
    const Tensor ids = ids_of({1, 5, 2, 6, 0, 3, 3, 4, 0, 1}, 2);
    const Tensor targets = ids_of({5, 2, 6, 0, -100, 3, 4, 0, 1, 2}, 2);
    const auto r = tg::gradcheck_parameters(
        [&] { return std::vector<Tensor>{tg::cross_entropy(model.forward(ids), targets)}; }, model.parameters(),
        {.atol = 1e-6, .rtol = 1e-5});
    BOOST_TEST(r.ok, r.report());
    BOOST_TEST(r.elements_checked == static_cast<std::size_t>(model.parameter_count()));
  }
}

BOOST_AUTO_TEST_CASE(greedy_generation_with_the_cache_equals_argmax_of_the_full_forward) {
  // Rotary positions: each decoded position is turned by its absolute index (the cache length).
  for (auto positions : {tg::PositionKind::learned, tg::PositionKind::rotary})
  for (auto dtype : {tg::float64, tg::float32}) {
    tg::Decoder model = tiny_decoder(dtype, positions);
    model.eval();
    const Tensor prompt = ids_of({1, 2, 3, 4, 4, 0}, 2);
    const Tensor out = model.generate(prompt, {.new_tokens = 5, .temperature = 0});
    BOOST_TEST(out.shape() == (tg::Shape{2, 8}));
    // Recompute each step from scratch without a cache.
    std::vector<std::int64_t> seq = prompt.to_vector<std::int64_t>();
    std::vector<std::vector<std::int64_t>> rows{{seq.begin(), seq.begin() + 3}, {seq.begin() + 3, seq.end()}};
    for (int step = 0; step < 5; ++step) {
      std::vector<std::int64_t> flat;
      for (auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
      tg::NoGradGuard no_grad;
      const Tensor logits = model.forward(ids_of(flat, 2));
      const auto next = tg::argmax(tg::select(logits, 1, -1), -1).to_vector<std::int64_t>();
      for (int b = 0; b < 2; ++b) rows[b].push_back(next[b]);
    }
    std::vector<std::int64_t> flat;
    for (auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    BOOST_TEST(out.to_vector<std::int64_t>() == flat, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(a_rotary_decoder_adds_no_table_and_every_block_rotates) {
  tg::Decoder model = tiny_decoder(tg::float64, tg::PositionKind::rotary);
  const auto names = names_of(model);
  BOOST_TEST(std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.rfind("pos.", 0) == 0; }) == 0);
  BOOST_TEST(model.parameter_count() == 56 + 2 * (32 + 288 + 280) + 16 + 63);
  for (const auto& block : model.blocks) BOOST_TEST(block.attn.config().rotary.has_value());
  // Last logits by cached decoding, prompt in one piece then one token at a time, equal the
  // full forward's.
  check_decoding_equals_forward(model, ids_of({1, 5, 2, 6, 0, 3, 3, 4}, 1), 3, "rotary");
}

BOOST_AUTO_TEST_CASE(a_llama_style_decoder_has_no_biases_and_decodes_like_its_forward) {
  // Rotary positions with no length limit (max_len 0), 4 heads sharing 2 key/value heads, a
  // window of 3, RMSNorm, SwiGLU, no biases.
  tg::Decoder model({.vocab = 7, .max_len = 0, .dim = 8, .heads = 4, .layers = 2, .activation = tg::Activation::swiglu,
                     .positions = tg::PositionKind::rotary, .norm = tg::NormKind::rms, .bias = false, .dtype = tg::float64, .seed = 11,
                     .kv_heads = 2, .window = 3});
  const auto names = names_of(model);
  for (const auto& name : names) BOOST_TEST(name.find("bias") == std::string::npos, name);
  BOOST_TEST(std::count(names.begin(), names.end(), "blocks.1.ff.gate.weight") == 1);
  BOOST_TEST(std::count(names.begin(), names.end(), "blocks.0.ln2.weight") == 1);
  BOOST_TEST(names.back() == "head.weight");
  // tok 7x8; per block: 2 RMSNorms 16, attention w_q, w_o 8x8 and w_k, w_v 8x4, SwiGLU 3 x 8x24
  // (8 * 8 / 3 = 21 rounded up to 24); ln_f 8; head 8x7.
  BOOST_TEST(model.parameter_count() == 56 + 2 * (16 + 192 + 576) + 8 + 56);
  check_decoding_equals_forward(model, ids_of({1, 5, 2, 6, 0, 3, 3, 4, 2, 2}, 1), 3, "llama");
  // No table, no limit: generation runs as long as asked, and a long forward is fine.
  model.eval();
  tg::NoGradGuard no_grad;
  BOOST_TEST(model.generate(ids_of({1, 2}, 1), {.new_tokens = 30, .temperature = 0}).shape() == (tg::Shape{1, 32}));
  BOOST_TEST(model.forward(ids_of(std::vector<std::int64_t>(40, 3), 1)).shape() == (tg::Shape{1, 40, 7}));
  BOOST_TEST(model.generate(ids_of({1, 2}, 1), {.new_tokens = 9, .temperature = 0, .restart_after = 6}).shape() == (tg::Shape{1, 11}));
}

BOOST_AUTO_TEST_CASE(tied_embeddings_are_one_parameter_that_both_uses_train) {
  const tg::DecoderConfig config{.vocab = 7, .max_len = 6, .dim = 8, .heads = 2, .hidden = 8, .tie_embeddings = true, .dtype = tg::float64,
                                 .seed = 5};
  tg::Decoder model(config);
  const auto names = names_of(model);
  BOOST_TEST(!model.head.has_value());
  BOOST_TEST(std::count(names.begin(), names.end(), "tok.weight") == 1);
  BOOST_TEST(std::none_of(names.begin(), names.end(), [](const std::string& n) { return n.rfind("head", 0) == 0; }));
  // The untied model has the head's 8x7 + 7 more.
  tg::DecoderConfig untied = config;
  untied.tie_embeddings = false;
  BOOST_TEST(tg::Decoder(untied).parameter_count() == model.parameter_count() + 63);
  // The logits are the final norm's output times the table transposed.
  const Tensor ids = ids_of({1, 5, 2, 6, 0}, 1);
  const Tensor h = tg::randn({1, 5, 8}, 3, tg::float64);
  check_close(model.logits(h).to_vector<double>(), tg::matmul(model.ln_f.forward(h), tg::transpose(model.tok.weight, 0, 1)).to_vector<double>(),
              1e-14, 1e-14, "h W^T");
  // The table's gradient sums both uses: the rows the ids pick, and every row through the head.
  const Tensor targets = ids_of({5, 2, 6, 0, 3}, 1);
  const auto loss = [&] { return std::vector<Tensor>{tg::cross_entropy(model.forward(ids), targets)}; };
  const auto r = tg::gradcheck_parameters(loss, model.parameters(), {.atol = 1e-6, .rtol = 1e-5});
  BOOST_TEST(r.ok, r.report());
  tg::backward(loss()[0]);
  const auto g = model.tok.weight.grad().to_vector<double>();
  for (std::int64_t j = 0; j < 8; ++j) BOOST_TEST(g[static_cast<std::size_t>(4 * 8 + j)] != 0.0);  // id 4 never embedded, still a logit
  // Saved once, and a fresh model loads it.
  const std::string path = "test_layers_tied.safetensors";
  tg::save(model, path);
  BOOST_TEST(tg::load_safetensors(path).tensors.size() == model.named_parameters().size());
  tg::DecoderConfig other = config;
  other.seed = 9;
  tg::Decoder loaded(other);
  tg::load(loaded, path);
  tg::NoGradGuard no_grad;
  BOOST_TEST(loaded.forward(ids).to_vector<double>() == model.forward(ids).to_vector<double>());
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(sampling_is_seeded_and_respects_top_k) {
  tg::Decoder model = tiny_decoder(tg::float32);
  model.eval();
  const Tensor prompt = ids_of({1, 2}, 1);
  const auto a = model.generate(prompt, {.new_tokens = 6, .temperature = 1.5, .seed = 3}).to_vector<std::int64_t>();
  const auto b = model.generate(prompt, {.new_tokens = 6, .temperature = 1.5, .seed = 3}).to_vector<std::int64_t>();
  BOOST_TEST(a == b);
  // top_k = 1 is greedy whatever the temperature.
  BOOST_TEST(model.generate(prompt, {.new_tokens = 6, .temperature = 5, .top_k = 1, .seed = 4}).to_vector<std::int64_t>() ==
             model.generate(prompt, {.new_tokens = 6, .temperature = 0}).to_vector<std::int64_t>());
  check_throws<tg::ValueError>([&] { model.generate(prompt, {.new_tokens = 8}); }, {"Decoder::generate", "max_len = 9"});
  check_throws<tg::ValueError>([&] { model.generate(prompt, {.temperature = -1}); }, {"Decoder::generate", "temperature"});
}

BOOST_AUTO_TEST_CASE(training_lowers_the_loss_and_is_bit_reproducible) {
  // Copy the first token to every later position: needs attention to position 0.
  auto run = [] {
    tg::Decoder model({.vocab = 6, .max_len = 6, .dim = 16, .heads = 2, .layers = 1, .seed = 5});
    tg::AdamW opt(model.named_parameters(), {.lr = 1e-2, .weight_decay = 0.0});
    tg::Generator gen(1);
    std::vector<double> losses;
    for (int step = 0; step < 200; ++step) {
      std::vector<std::int64_t> ids, targets;
      for (int b = 0; b < 16; ++b) {
        const auto first = static_cast<std::int64_t>(gen.uniform() * 6);
        for (int t = 0; t < 6; ++t) {
          ids.push_back(t == 0 ? first : static_cast<std::int64_t>(gen.uniform() * 6));
          targets.push_back(t == 5 ? -100 : first);
        }
      }
      const Tensor loss = tg::cross_entropy(model.forward(ids_of(ids, 16)), ids_of(targets, 16));
      tg::backward(loss);
      tg::clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      opt.zero_grad();
      losses.push_back(loss.item());
    }
    return losses;
  };
  const auto a = run(), b = run();
  BOOST_TEST(a == b);  // bit-identical
  BOOST_TEST_MESSAGE("copy-first-token loss " << a.front() << " -> " << a.back() << " (log 6 = 1.79)");
  BOOST_TEST(a.front() > 1.5);
  BOOST_TEST(a.back() < 0.1);
}

BOOST_AUTO_TEST_CASE(a_decoder_round_trips_through_a_checkpoint) {
  tg::Decoder a = tiny_decoder(tg::float32), b = tg::Decoder({.vocab = 7, .max_len = 9, .dim = 8, .heads = 2, .layers = 2, .hidden = 16, .seed = 99});
  const std::string path = "test_layers_decoder.safetensors";
  tg::save(a, path);
  tg::load(b, path);
  const Tensor ids = ids_of({1, 2, 3}, 1);
  tg::NoGradGuard no_grad;
  BOOST_TEST(a.forward(ids).to_vector<float>() == b.forward(ids).to_vector<float>());
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_SUITE_END()

// The "Adding a layer" example of docs/api.md, as written there.
namespace {
struct Gated : tg::Module {
  Gated(std::int64_t dim, std::uint64_t seed, tg::DType dtype = tg::float32)
      : proj({.in = dim, .out = 2 * dim, .dtype = dtype, .seed = seed}),
        scale(tg::ones({dim}, dtype).set_requires_grad()) {}
  tg::Tensor forward(const tg::Tensor& x) const {  // x [..., dim]
    const tg::Tensor h = proj.forward(x);
    const std::int64_t d = x.size(-1);
    return tg::narrow(h, -1, 0, d) * tg::tanh(tg::narrow(h, -1, d, d)) * scale;
  }
  void visit(tg::ModuleVisitor& v) override {
    v.module("proj", proj);  // its parameters become proj.weight, proj.bias
    v.parameter("scale", scale);
  }
  tg::Linear proj;
  tg::Tensor scale;
};
}  // namespace

BOOST_AUTO_TEST_CASE(the_readme_layer_example_works_as_described) {
  Gated layer(3, 1);
  BOOST_TEST(names_of(layer) == (std::vector<std::string>{"proj.weight", "proj.bias", "scale"}), boost::test_tools::per_element());
  Gated layer64(3, 1, tg::float64);
  const Tensor x = tg::randn({2, 3}, 4, tg::float64).set_requires_grad();
  auto params = layer64.parameters();
  params.push_back(x);
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{layer64.forward(x)}; }, params);
  BOOST_TEST(r.ok, r.report());
  tg::AdamW opt(layer.named_parameters());
  tg::backward(tg::sum(layer.forward(tg::ones({2, 3}))));
  opt.step();
  BOOST_TEST(layer.scale.to_vector<float>() != (std::vector<float>{1, 1, 1}));  // the optimizer reached it
}

BOOST_AUTO_TEST_CASE(decoder_errors_name_the_decoder) {
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 5, .max_len = 4, .dim = 8, .heads = 3}); }, {"Decoder", "config.heads = 3", "config.dim = 8"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 5, .max_len = 4, .dim = 0}); }, {"Decoder", "config.dim"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 5, .max_len = 4, .dim = 8, .dropout = 1.0}); }, {"Decoder", "config.dropout"});
  tg::Decoder model({.vocab = 5, .max_len = 4, .dim = 8, .heads = 2});
  const auto ids = [](std::vector<std::int64_t> v) { return tg::from_vector(std::span<const std::int64_t>(v), {1, static_cast<std::int64_t>(v.size())}); };
  check_throws<tg::ShapeError>([&] { model.forward(ids({1, 2, 3, 4, 0})); }, {"Decoder::forward", "'ids'", "5 positions", "max_len = 4"});
  check_throws<tg::ValueError>([&] { model.forward(ids({1, 7})); }, {"Decoder::forward", "'ids'", "id 7", "[0, 5)"});
  check_throws<tg::ValueError>([&] { model.generate(ids({-1}), {.new_tokens = 1}); }, {"Decoder::generate", "'prompt'", "id -1"});
  // max_len sizes learned and sinusoidal tables; rotary and alibi take 0 for no limit.
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 5, .dim = 8}); }, {"Decoder", "config.max_len", ">= 1", "learned or sinusoidal", "got 0"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 5, .dim = 8, .positions = tg::PositionKind::sinusoidal}); },
                               {"Decoder", "config.max_len", ">= 1", "got 0"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 5, .max_len = -1, .dim = 8, .positions = tg::PositionKind::alibi}); },
                               {"Decoder", "config.max_len", ">= 0", "no limit", "got -1"});
  tg::Decoder unbounded({.vocab = 5, .dim = 8, .positions = tg::PositionKind::alibi});
  check_throws<tg::ValueError>([&] { unbounded.generate(ids({1}), {.restart_after = 1}); }, {"Decoder::generate", "restart_after", "at least 2", "got 1"});
  check_throws<tg::ValueError>([&] { model.generate(ids({1}), {.restart_after = 5}); }, {"Decoder::generate", "restart_after", "config.max_len = 4", "got 5"});
  tg::LayerNorm ln({.dim = 2});
  check_throws<tg::DTypeError>([&] { ln.forward(tg::zeros({1, 2}, tg::float64)); }, {"LayerNorm::forward", "'x'", "float64", "config.dtype"});
}
