// The training recipe shown in the README, verbatim between the markers (a test compares the
// two, and another runs this program: it must beat 4 bits per character on held-out text).
// README:begin
#include <cmath>
#include <fstream>

#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;

int main(int argc, char** argv) {
  // Data: a text as byte ids, the first 90% to learn from, the rest to score on.
  std::ifstream file(argc > 1 ? argv[1] : "/usr/share/common-licenses/GPL-3");
  const std::string text{std::istreambuf_iterator<char>(file), {}};
  const tg::CharVocab vocab(text);
  const std::vector<std::int64_t> ids = vocab.encode(text);
  const std::span<const std::int64_t> learn = std::span(ids).first(ids.size() * 9 / 10), held_out = std::span(ids).subspan(learn.size());
  fmt::print("{} characters, {} distinct; {} thread(s) (tg::set_num_threads(n) to change)\n", ids.size(), vocab.size(), tg::num_threads());

  // The model, and AdamW with a warm-up and a cosine decay of its learning rate.
  const tg::DecoderConfig config{.vocab = vocab.size(), .max_len = 64, .dim = 64, .heads = 4, .layers = 2, .seed = 1};
  const tg::AdamWOptions adamw{.lr = 3e-3, .weight_decay = 0.01};
  const std::int64_t steps = 600;
  const tg::WarmupCosine schedule(adamw.lr, 60, steps, adamw.lr / 10);
  tg::Generator gen(2);
  auto train = [&](tg::Decoder& model, tg::AdamW& opt, std::int64_t until) {
    while (opt.steps() < until) {
      const auto [x, y] = tg::random_windows(learn, 16, 64, gen);
      const tg::Tensor loss = tg::cross_entropy(model.forward(x), y);
      tg::backward(loss);
      tg::clip_grad_norm(model.parameters(), 1.0);
      opt.set_learning_rate(schedule(opt.steps()));
      opt.step();
      opt.zero_grad();
      if (opt.steps() % 100 == 0) fmt::print("step {} loss {:.3f}\n", opt.steps(), loss.item());
    }
  };
  tg::Decoder model(config);
  tg::AdamW opt(model.named_parameters(), adamw);
  train(model, opt, steps / 2);

  // One checkpoint file (model, optimizer, step, the data's stream), then training resumed from it.
  tg::save_training_state("checkpoint.safetensors", {.model = model, .optimizer = opt, .generators = {{"data", gen}}, .step = opt.steps()});
  tg::Decoder resumed(config);
  tg::AdamW resumed_opt(resumed.named_parameters(), adamw);
  tg::TrainingState state{.model = resumed, .optimizer = resumed_opt, .generators = {{"data", gen}}};
  tg::load_training_state("checkpoint.safetensors", state);
  train(resumed, resumed_opt, steps);

  // The held-out loss, in bits per character.
  resumed.eval();
  tg::Generator held_out_gen(3);
  const auto [x, y] = tg::random_windows(held_out, 32, 64, held_out_gen);
  const double bits = tg::cross_entropy(resumed.forward(x), y).item() / std::log(2.0);
  fmt::print("held-out: {:.2f} bits per character (uniform over the vocabulary: {:.2f})\n", bits, std::log2(vocab.size()));

  // Text continued through the KV cache, greedily and by sampling.
  const tg::Tensor prompt = tg::from_vector(vocab.encode("This License"), {1, 12});
  fmt::print("greedy:  {}\n", vocab.decode(resumed.generate(prompt, {.new_tokens = 48, .temperature = 0})));
  fmt::print("sampled: {}\n", vocab.decode(resumed.generate(prompt, {.new_tokens = 48, .temperature = 0.8, .top_k = 8, .seed = 4})));
  return bits < 4.0 ? 0 : 1;
}
// README:end
