// train_sort: a decoder-only transformer learns to sort digits.
//
// Each example is "d_0 ... d_{n-1} | s_0 ... s_{n-1}": n random digits, a separator, and the same
// digits sorted. The model reads the sequence left to right and is trained (cross-entropy) only
// on the sorted half; it is then asked to write the sorted half of 1,000 held-out sequences by
// greedy decoding through its KV cache, and scored on exact sequences.
//
//   ./build/examples/train_sort                       # defaults: reaches >= 99% exact
//   ./build/examples/train_sort --steps 300 --threads 1 --out /tmp/sort
//
// Writes OUT/loss.png (training loss), OUT/accuracy.png (held-out accuracy during training),
// OUT/attention.png (each head's attention in the last block for one held-out sequence) and
// OUT/model.safetensors.
#include <filesystem>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

#include "support/plot.hpp"
#include "support/progress.hpp"

namespace tg = tapegrad;
namespace ex = tapegrad_examples;
using tg::Tensor;

namespace {

struct Options {
  std::int64_t steps = 1200, batch = 64, digits = 8, dim = 64, heads = 4, layers = 2;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  int threads = 0;  // 0: tapegrad's default
  std::int64_t held_out = 1000;
  std::string out = "train_sort_out";
};

constexpr std::int64_t kSep = 10, kVocab = 11, kIgnore = -100;

// `count` sequences of n digits with their sorted copies: inputs [count, 2n] (the sequence
// without its last token) and targets [count, 2n] (the next token, ignored before the separator).
struct Batch {
  Tensor inputs, targets, prompts;  // prompts: [count, n + 1], the digits and the separator
  std::vector<std::int64_t> answers;  // [count * n], the sorted digits
};

Batch make_batch(tg::Generator& gen, std::int64_t count, std::int64_t n) {
  std::vector<std::int64_t> inputs, targets, prompts, answers;
  for (std::int64_t b = 0; b < count; ++b) {
    std::vector<std::int64_t> digits(static_cast<std::size_t>(n));
    for (auto& d : digits) d = static_cast<std::int64_t>(gen.uniform() * 10);
    std::vector<std::int64_t> seq = digits;
    seq.push_back(kSep);
    prompts.insert(prompts.end(), seq.begin(), seq.end());
    std::sort(digits.begin(), digits.end());
    seq.insert(seq.end(), digits.begin(), digits.end());
    answers.insert(answers.end(), digits.begin(), digits.end());
    for (std::int64_t t = 0; t < 2 * n; ++t) {
      inputs.push_back(seq[static_cast<std::size_t>(t)]);
      targets.push_back(t >= n ? seq[static_cast<std::size_t>(t + 1)] : kIgnore);
    }
  }
  auto ids = [](const std::vector<std::int64_t>& v, std::int64_t rows) {
    return tg::from_vector(std::span<const std::int64_t>(v), {rows, static_cast<std::int64_t>(v.size()) / rows});
  };
  return {ids(inputs, count), ids(targets, count), ids(prompts, count), answers};
}

// Exact-sequence accuracy of greedy decoding on the held-out set.
double exact_accuracy(const tg::Decoder& model, const Batch& held_out, std::int64_t n) {
  const Tensor out = model.generate(held_out.prompts, {.new_tokens = n, .temperature = 0});
  const auto ids = out.to_vector<std::int64_t>();
  const std::int64_t count = out.size(0), width = out.size(1);
  std::int64_t exact = 0;
  for (std::int64_t b = 0; b < count; ++b)
    exact += std::equal(ids.begin() + b * width + n + 1, ids.begin() + (b + 1) * width,
                        held_out.answers.begin() + b * n);
  return static_cast<double>(exact) / static_cast<double>(count);
}

void write_figures(const Options& o, const tg::Decoder& model, const Batch& held_out, const ex::Series& loss,
                   const ex::Series& accuracy) {
  ex::plot_lines(o.out + "/loss.png", {"train_sort: training loss", "step", "cross-entropy (sorted half)", {loss}, true});
  ex::plot_lines(o.out + "/accuracy.png", {"train_sort: held-out exact-sequence accuracy", "step", "fraction exact", {accuracy}});
  // The last block's attention for the first held-out sequence, written out in full.
  const Tensor seq = model.generate(tg::slice(held_out.prompts, 0, 0, 1), {.new_tokens = o.digits, .temperature = 0});
  const Tensor weights = model.attention_weights(tg::slice(seq, 1, 0, 2 * o.digits)).back();  // [1, H, T, T]
  std::vector<ex::Heatmap> panels;
  const std::int64_t t = 2 * o.digits;
  for (std::int64_t h = 0; h < o.heads; ++h) {
    panels.push_back(ex::causal_attention_map(fmt::format("head {}", h),
                                              tg::select(tg::select(weights, 0, 0), 0, h).to(tg::float64).to_vector<double>(), t));
  }
  const auto shown = seq.to_vector<std::int64_t>();
  std::string text;
  for (std::int64_t i = 0; i < t; ++i) text += shown[static_cast<std::size_t>(i)] == kSep ? "|" : std::to_string(shown[static_cast<std::size_t>(i)]);
  ex::plot_heatmaps(o.out + "/attention.png", "last block, sequence " + text, panels);
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  CLI::App app{"train_sort: a decoder-only transformer learns to sort digit sequences"};
  app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--digits", o.digits, "digits per sequence")->check(CLI::Range(1, 64));
  app.add_option("--dim", o.dim, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads (must divide --dim)")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "peak learning rate (AdamW, warm-up then cosine)")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed for data, initialisation and dropout");
  app.add_option("--threads", o.threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  app.add_option("--held-out", o.held_out, "held-out sequences to score")->check(CLI::PositiveNumber);
  app.add_option("--out", o.out, "folder for the figures and the checkpoint");
  CLI11_PARSE(app, argc, argv);
  if (o.threads > 0) tg::set_num_threads(o.threads);
  std::filesystem::create_directories(o.out);

  tg::Decoder model({.vocab = kVocab, .max_len = 2 * o.digits + 1, .dim = o.dim, .heads = o.heads, .layers = o.layers, .seed = o.seed});
  tg::AdamW opt(model.named_parameters(), {.lr = o.lr, .weight_decay = 0.01});
  const tg::WarmupCosine schedule(o.lr, o.steps / 20, o.steps, o.lr / 20);
  tg::Generator data(o.seed + 1), held_out_data(o.seed + 2);
  const Batch held_out = make_batch(held_out_data, o.held_out, o.digits);
  fmt::print("train_sort: {} parameters, {} steps of {} sequences of {} digits, {} thread(s)\n", model.parameter_count(), o.steps,
             o.batch, o.digits, tg::num_threads());

  ex::Series loss_curve{"training loss", {}, {}}, accuracy_curve{"held-out exact", {}, {}};
  ex::Progress progress(o.steps);
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const Batch batch = make_batch(data, o.batch, o.digits);
    const Tensor loss = tg::cross_entropy(model.forward(batch.inputs), batch.targets);
    tg::backward(loss);
    tg::clip_grad_norm(model.parameters(), 1.0);
    opt.set_learning_rate(schedule(step));
    opt.step();
    opt.zero_grad();
    loss_curve.x.push_back(static_cast<double>(step + 1));
    loss_curve.y.push_back(loss.item());
    progress.update(step + 1, (step + 1) * o.batch * 2 * o.digits, {{"loss", loss_curve.y.back()}});
    if ((step + 1) % (o.steps / 10 > 0 ? o.steps / 10 : 1) == 0) {
      model.eval();
      accuracy_curve.x.push_back(static_cast<double>(step + 1));
      accuracy_curve.y.push_back(exact_accuracy(model, held_out, o.digits));
      model.train();
    }
  }
  model.eval();
  const double accuracy = exact_accuracy(model, held_out, o.digits);
  fmt::print("held-out exact-sequence accuracy: {:.1f}% of {} sequences ({:.1f} s)\n", 100 * accuracy, o.held_out, progress.seconds());
  write_figures(o, model, held_out, loss_curve, accuracy_curve);
  tg::save(model, o.out + "/model.safetensors", {{"example", "train_sort"}, {"steps", std::to_string(o.steps)}});
  fmt::print("wrote {0}/loss.png, {0}/accuracy.png, {0}/attention.png, {0}/model.safetensors\n", o.out);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "train_sort: {}\n", e.what());
  return 1;
}
