// train_chars: a character-level language model on a text file, then text generated from it.
//
// The model is a small decoder-only transformer (tapegrad::Decoder) trained with AdamW on
// random windows of the first 90% of the text; the last 10% scores it (validation loss per
// character, in nats and bits). It then continues a prompt through its KV cache, greedily and by
// sampling with a temperature and top-k. The checkpoint, one file with the whole training state
// (model, optimizer, step, the data's and dropout's random streams), continues the run exactly
// (--resume, in a new process: the same losses and parameters as a run never stopped) or only
// generates (--generate).
//
//   ./build/examples/train_chars                                  # GPL-3 text, about a minute
//   ./build/examples/train_chars --text book.txt --steps 5000
//   ./build/examples/train_chars --steps 1000 --stop-at 400 && ./build/examples/train_chars --resume
//   ./build/examples/train_chars --generate --prompt "This License" --tokens 400
//   ./build/examples/train_chars --positions rotary               # RoPE in every block's attention
//   ./build/examples/train_chars --positions alibi --kv-heads 1 --window 16   # ALiBi, one key/value head, a sliding window
//   ./build/examples/train_chars --arch llama                     # RMSNorm, SwiGLU, no biases, rotary, 2 key/value heads
//   ./build/examples/train_chars --tokenizer bpe --vocab-size 512  # SentencePiece subwords instead of bytes
//   mpirun -np 2 ./build/examples/train_chars --distributed       # two processes, each half of every batch
//
// --distributed splits each step's batch into --micro-batches (M) that the processes share
// (DataParallel): the same windows, dropout keyed by micro-batch, and the gradients summed in one
// fixed order, so the run is the same bits on 1, 2, 4 (any count dividing M) processes. Rank 0
// prints, validates, draws the figures and writes the checkpoint, which resumes on any count.
//
// Writes OUT/loss.png, OUT/attention.png, OUT/checkpoint.safetensors, and with
// --tokenizer bpe|unigram OUT/tokenizer.model.
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

#include "support/parse.hpp"
#include "support/plot.hpp"
#include "support/progress.hpp"

namespace tg = tapegrad;
namespace ex = tapegrad_examples;
using tg::Tensor;

namespace {

struct Options {
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::int64_t steps = 1000, batch = 32, context = 64, dim = 64, heads = 4, layers = 2;
  std::int64_t stop_at = 0, log_every = 100;  // 0: run all the steps
  double lr = 2e-3, dropout = 0.2;
  std::uint64_t seed = 1;
  std::string arch = "gpt";              // gpt or llama
  std::string positions;                 // learned, sinusoidal, rotary or alibi; empty: the arch's (sinusoidal, rotary)
  std::string tokenizer = "char";        // char, bpe or unigram
  std::int64_t vocab_size = 512;         // bpe and unigram
  std::int64_t kv_heads = 0, window = 0;  // 0: as many key/value heads as heads (llama: half); no window
  bool tie_embeddings = false;
  int threads = 0;
  std::string out = "train_chars_out";
  bool resume = false, generate_only = false;
  bool distributed = false, shard_optimizer = false;
  std::int64_t micro_batches = 4;  // with --distributed
  std::string reduction = "exact";
  std::string prompt = "This License";
  std::int64_t tokens = 300, top_k = 10;
  double temperature = 0.8;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The model's shape, kept in the checkpoint's metadata so that --generate can rebuild it, and
// the run's training options, so that --resume continues the same run; a subword vocabulary is
// kept beside it (tokenizer_path), the bytes of a char one in it.
std::map<std::string, std::string> describe(const Options& o, const tg::Tokenizer& vocab) {
  std::map<std::string, std::string> meta{{"example", "train_chars"}, {"tokenizer", o.tokenizer},
          {"arch", o.arch}, {"tie_embeddings", o.tie_embeddings ? "1" : "0"},
          {"context", std::to_string(o.context)}, {"dim", std::to_string(o.dim)},
          {"heads", std::to_string(o.heads)},     {"layers", std::to_string(o.layers)},
          {"positions", o.positions},
          {"kv_heads", std::to_string(o.kv_heads)}, {"window", std::to_string(o.window)},
          {"total_steps", std::to_string(o.steps)}, {"batch", std::to_string(o.batch)},
          {"lr", fmt::format("{}", o.lr)}, {"dropout", fmt::format("{}", o.dropout)},
          {"micro_batches", std::to_string(o.distributed ? o.micro_batches : 0)}, {"reduction", o.reduction}};
  if (const auto* chars = dynamic_cast<const tg::CharVocab*>(&vocab)) meta["alphabet"] = chars->to_codes();
  return meta;
}

std::string tokenizer_path(const Options& o) { return o.out + "/tokenizer.model"; }

// The text's bytes, or SentencePiece subwords trained on the text (saved beside the checkpoint).
std::unique_ptr<tg::Tokenizer> make_tokenizer(const Options& o, const std::string& text) {
  if (o.tokenizer == "char") return std::make_unique<tg::CharVocab>(text);
  auto subwords = tg::SubwordTokenizer::train(
      text, {.model = o.tokenizer == "bpe" ? tg::SubwordModel::bpe : tg::SubwordModel::unigram, .vocab_size = o.vocab_size});
  subwords.save(tokenizer_path(o));
  return std::make_unique<tg::SubwordTokenizer>(std::move(subwords));
}

tg::PositionKind position_kind(const std::string& name) {
  if (name == "learned") return tg::PositionKind::learned;
  if (name == "rotary") return tg::PositionKind::rotary;
  if (name == "alibi") return tg::PositionKind::alibi;
  if (name == "sinusoidal") return tg::PositionKind::sinusoidal;
  throw std::invalid_argument(fmt::format("'{}' is not a kind of positions (learned, sinusoidal, rotary or alibi)", name));
}

// gpt: LayerNorm, GELU, biases (the library's defaults); llama: RMSNorm, SwiGLU, no biases, and
// no length limit where the positions need no table.
tg::Decoder make_model(const Options& o, const tg::Tokenizer& vocab) {
  const bool llama = o.arch == "llama";
  const tg::PositionKind positions = position_kind(o.positions);
  const bool table = positions == tg::PositionKind::learned || positions == tg::PositionKind::sinusoidal;
  return tg::Decoder({.vocab = vocab.size(), .max_len = llama && !table ? 0 : o.context,
                      .dim = o.dim, .heads = o.heads, .layers = o.layers,
                      .activation = llama ? tg::Activation::swiglu : tg::Activation::gelu, .dropout = o.dropout,
                      .positions = positions, .norm = llama ? tg::NormKind::rms : tg::NormKind::layer, .bias = !llama,
                      .tie_embeddings = o.tie_embeddings, .seed = o.seed, .kv_heads = o.kv_heads, .window = o.window});
}

// Reads the shape, the vocabulary and (for --resume) the training options back from a
// checkpoint's metadata into `o`; a field that is missing or cannot be read is named with the file
// and its value. `steps_given`: --steps was on the command line and extends the run.
std::unique_ptr<tg::Tokenizer> restore_description(Options& o, const std::string& path, bool steps_given = false) {
  const auto meta = tg::load_safetensors(path).metadata;
  auto where = [&](const char* key) { return fmt::format("{}: metadata field '{}'", path, key); };
  auto field = [&](const char* key) {
    const auto it = meta.find(key);
    if (it == meta.end()) throw std::runtime_error(fmt::format("{}: no '{}' in the metadata; not a train_chars checkpoint", path, key));
    return it->second;
  };
  auto number = [&](const char* key) { return ex::parse_int(field(key), where(key)); };
  o.context = number("context");
  o.dim = number("dim");
  o.heads = number("heads");
  o.layers = number("layers");
  o.kv_heads = number("kv_heads");
  o.window = number("window");
  o.positions = field("positions");
  o.tokenizer = field("tokenizer");
  o.arch = field("arch");
  o.tie_embeddings = number("tie_embeddings") != 0;
  o.batch = number("batch");
  o.lr = ex::parse_double(field("lr"), where("lr"));
  o.dropout = ex::parse_double(field("dropout"), where("dropout"));
  if (!steps_given) o.steps = number("total_steps");
  // A data-parallel run continues as one, with its micro-batches (files from before have none).
  if (meta.count("micro_batches") > 0) {
    o.micro_batches = number("micro_batches");
    o.distributed = o.micro_batches > 0;
    o.reduction = field("reduction");
    if (o.reduction != "exact" && o.reduction != "fast")
      throw std::invalid_argument(fmt::format("{}: '{}' is not a reduction (exact or fast)", where("reduction"), o.reduction));
  }
  // The library's messages name the value; the file and the field go in front.
  auto in_field = [&](const char* key, auto&& read) {
    try {
      return read();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{}: {}", where(key), e.what()));
    }
  };
  in_field("positions", [&] { return position_kind(o.positions); });
  in_field("arch", [&] {
    if (o.arch != "gpt" && o.arch != "llama") throw std::invalid_argument(fmt::format("'{}' is not an arch (gpt or llama)", o.arch));
  });
  if (o.tokenizer != "char") return std::make_unique<tg::SubwordTokenizer>(tg::SubwordTokenizer::load(tokenizer_path(o)));
  return in_field("alphabet", [&] { return std::make_unique<tg::CharVocab>(tg::CharVocab::from_codes(field("alphabet"))); });
}

// The model a checkpoint's metadata describes: an impossible shape names the file.
tg::Decoder restored_model(const Options& o, const tg::Tokenizer& vocab, const std::string& path) {
  try {
    return make_model(o, vocab);
  } catch (const tg::Error& e) {
    throw std::invalid_argument(fmt::format("{}: the metadata describe no model this example can build: {}", path, e.what()));
  }
}

// Mean cross-entropy per token over consecutive windows covering the validation text, 64 windows
// per forward so that a long text does not need one huge batch, and the characters (bytes) per
// predicted token, which turn it into bits per character whatever the vocabulary.
struct Validation {
  double nats_per_token, chars_per_token;
  double bits_per_char() const { return nats_per_token / chars_per_token / std::log(2.0); }
};
Validation validation_loss(const tg::Decoder& model, const tg::Tokenizer& vocab, const std::vector<std::int64_t>& text, std::size_t begin,
                           std::int64_t context) {
  tg::NoGradGuard no_grad;
  const auto c = static_cast<std::size_t>(context);
  double total = 0;
  std::int64_t windows = 0;
  std::size_t chars = 0;
  for (std::size_t at = begin; at + c + 1 <= text.size();) {
    std::vector<std::int64_t> x, y;
    std::int64_t rows = 0;
    for (; rows < 64 && at + c + 1 <= text.size(); ++rows, at += c) {
      x.insert(x.end(), text.begin() + static_cast<std::ptrdiff_t>(at), text.begin() + static_cast<std::ptrdiff_t>(at + c));
      y.insert(y.end(), text.begin() + static_cast<std::ptrdiff_t>(at + 1), text.begin() + static_cast<std::ptrdiff_t>(at + c + 1));
    }
    const Tensor logits = model.forward(tg::from_vector(x, {rows, context}));
    total += tg::cross_entropy(logits, tg::from_vector(y, {rows, context})).item() * static_cast<double>(rows);
    windows += rows;
    chars += vocab.decode(y).size();
  }
  return {total / static_cast<double>(windows), static_cast<double>(chars) / static_cast<double>(windows * context)};
}

std::string generate(const tg::Decoder& model, const tg::Tokenizer& vocab, const Options& o, double temperature) {
  const auto ids = vocab.encode(o.prompt);
  const Tensor prompt = tg::from_vector(ids, {1, static_cast<std::int64_t>(ids.size())});
  return vocab.decode(model.generate(prompt, {.new_tokens = o.tokens, .temperature = temperature, .top_k = o.top_k, .seed = o.seed,
                                              .restart_after = o.context}));
}

void show_samples(const tg::Decoder& model, const tg::Tokenizer& vocab, const Options& o) {
  const auto started = std::chrono::steady_clock::now();
  const std::string greedy = generate(model, vocab, o, 0.0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  fmt::print("\n--- greedy ({} tokens, {:.0f} tokens/s with the KV cache) ---\n{}\n", o.tokens, o.tokens / seconds, greedy);
  fmt::print("\n--- temperature {}, top-k {} ---\n{}\n", o.temperature, o.top_k, generate(model, vocab, o, o.temperature));
}

void attention_figure(const tg::Decoder& model, const tg::Tokenizer& vocab, const Options& o, const std::vector<std::int64_t>& text,
                      std::size_t at) {
  const std::int64_t t = std::min<std::int64_t>(o.context, 32);
  std::vector<std::int64_t> ids(text.begin() + static_cast<std::ptrdiff_t>(at), text.begin() + static_cast<std::ptrdiff_t>(at) + t);
  const Tensor weights = model.attention_weights(tg::from_vector(ids, {1, t})).back();
  std::string shown = vocab.decode(ids);
  std::replace(shown.begin(), shown.end(), '\n', ' ');
  std::vector<ex::Heatmap> panels;
  for (std::int64_t h = 0; h < o.heads; ++h) {
    panels.push_back(ex::causal_attention_map(fmt::format("head {}", h),
                                              tg::select(tg::select(weights, 0, 0), 0, h).to(tg::float64).to_vector<double>(), t));
  }
  ex::plot_heatmaps(o.out + "/attention.png", fmt::format("last block on \"{}\"", shown), panels);
}

// The data-parallel step: this process's micro-batches of the step's windows, their gradients
// exchanged; returns the mean loss over all M micro-batches (the same on every process).
double distributed_step(tg::DataParallel& dp, tg::Decoder& model, tg::AdamW& opt, const tg::Windows& batch, const Options& o,
                        std::int64_t step) {
  const std::int64_t rows = o.batch / o.micro_batches;
  std::vector<double> losses;
  for (std::int64_t k = dp.first_micro_batch(); k < dp.end_micro_batch(); ++k) {
    tg::key_generators(model, o.seed, step * o.micro_batches + k);
    const Tensor loss = tg::cross_entropy(model.forward(tg::narrow(batch.x, 0, k * rows, rows)), tg::narrow(batch.y, 0, k * rows, rows));
    dp.backward(loss);
    losses.push_back(loss.item());
  }
  dp.synchronize();
  dp.clip_grad_norm(1.0);
  opt.step();
  dp.share_parameters();
  double sum = 0;
  for (const double l : tg::all_gather(dp.group(), losses)) sum += l;
  return sum / static_cast<double>(o.micro_batches);
}

int run(tg::ProcessGroup& group, int argc, char** argv) {
  Options o;
  CLI::App app{"train_chars: a character-level transformer language model"};
  app.add_option("--text", o.text, "text file to learn")->check(CLI::ExistingFile);
  const auto* steps_option =
      app.add_option("--steps", o.steps, "training steps in all, the schedule's length (with --resume: the saved run's unless given)")
          ->check(CLI::NonNegativeNumber);
  app.add_option("--stop-at", o.stop_at, "stop after this step, saving the checkpoint, to continue with --resume (0: run every step)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-every", o.log_every, "print the loss every N steps when the output is not a terminal")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "windows per step")->check(CLI::PositiveNumber);
  app.add_option("--context", o.context, "characters per window")->check(CLI::PositiveNumber);
  app.add_option("--dim", o.dim, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads (must divide --dim)")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--dropout", o.dropout, "dropout probability")->check(CLI::Range(0.0, 0.9));
  app.add_option("--seed", o.seed, "seed for data, initialisation, dropout and sampling");
  app.add_option("--arch", o.arch,
                 "gpt: LayerNorm, GELU, biases, sinusoidal positions; llama: RMSNorm, SwiGLU, no biases, rotary positions, "
                 "half as many key/value heads as heads")
      ->check(CLI::IsMember({"gpt", "llama"}));
  app.add_option("--positions", o.positions,
                 "position information: a learned table, a sinusoidal one, rotary (RoPE) or ALiBi's distance penalties in the attention "
                 "(default: the arch's)")
      ->check(CLI::IsMember({"learned", "sinusoidal", "rotary", "alibi"}));
  app.add_option("--kv-heads", o.kv_heads, "key/value heads, dividing --heads (grouped-query attention; 0: --heads, llama: --heads / 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--tie-embeddings", o.tie_embeddings, "the output projection is the token table transposed (one parameter)");
  app.add_option("--window", o.window, "attend to the last W positions only (sliding window; 0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--tokenizer", o.tokenizer, "the text's bytes, or SentencePiece subwords (BPE or unigram) trained on the text")
      ->check(CLI::IsMember({"char", "bpe", "unigram"}));
  app.add_option("--vocab-size", o.vocab_size, "subword vocabulary size (--tokenizer bpe or unigram)")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  app.add_option("--out", o.out, "folder for figures and checkpoints");
  app.add_flag("--resume", o.resume, "continue the run OUT/checkpoint.safetensors holds, with its options");
  app.add_flag("--generate", o.generate_only, "only load the model of OUT/checkpoint.safetensors and generate");
  app.add_option("--prompt", o.prompt, "text to continue");
  app.add_option("--tokens", o.tokens, "characters to generate")->check(CLI::PositiveNumber);
  app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", o.top_k, "sample among the k most likely characters (0: all)")->check(CLI::NonNegativeNumber);
  app.add_flag("--distributed", o.distributed,
               "data-parallel: the processes an MPI launcher started share each batch's micro-batches (alone: one process, the same bits)");
  app.add_option("--micro-batches", o.micro_batches, "with --distributed: micro-batches per step, dividing --batch; the process count must divide it")
      ->check(CLI::PositiveNumber);
  app.add_option("--reduction", o.reduction,
                 "with --distributed: exact (one fixed order of the sum: the same bits on any process count) or fast (MPI's all-reduce)")
      ->check(CLI::IsMember({"exact", "fast"}));
  app.add_flag("--shard-optimizer", o.shard_optimizer, "with --distributed: each process keeps the optimizer state of its share of the parameters (ZeRO-1)");
  CLI11_PARSE(app, argc, argv);
  if (group.size() > 1 && !o.distributed && !o.resume)
    throw std::invalid_argument(fmt::format("an MPI launcher started {} processes; add --distributed to train them together", group.size()));
  if (group.size() > 1 && o.generate_only) throw std::invalid_argument("--generate runs in one process, not under an MPI launcher");
  const bool speaker = group.rank() == 0;  // prints, validates, draws and writes
  if (o.positions.empty()) o.positions = o.arch == "llama" ? "rotary" : "sinusoidal";
  if (o.arch == "llama" && o.kv_heads == 0 && o.heads % 2 == 0) o.kv_heads = o.heads / 2;
  if (o.threads > 0) tg::set_num_threads(o.threads);
  // Found now rather than after training: generation restarts within the trained context.
  if (static_cast<std::int64_t>(o.prompt.size()) >= o.context && !o.generate_only)
    throw std::invalid_argument(fmt::format("--prompt has {} characters; it must be shorter than --context = {}", o.prompt.size(), o.context));
  std::filesystem::create_directories(o.out);
  const std::string path = o.out + "/checkpoint.safetensors";

  if (o.generate_only) {
    const auto vocab = restore_description(o, path);
    tg::Decoder model = restored_model(o, *vocab, path);
    tg::load_training_state_model(path, model);
    model.eval();
    show_samples(model, *vocab, o);
    return 0;
  }

  const std::string raw = read_file(o.text);
  const std::unique_ptr<const tg::Tokenizer> vocab = o.resume ? restore_description(o, path, steps_option->count() > 0) : make_tokenizer(o, raw);
  if (group.size() > 1 && !o.distributed)
    throw std::invalid_argument(fmt::format("{} is not a data-parallel run's; resume it in one process", path));
  if (o.distributed && o.batch % o.micro_batches != 0)
    throw std::invalid_argument(fmt::format("--batch {} must be a multiple of --micro-batches {}", o.batch, o.micro_batches));
  const std::vector<std::int64_t> text = vocab->encode(raw);
  const std::size_t split = text.size() * 9 / 10;
  if (text.size() - split < static_cast<std::size_t>(o.context) + 2)
    throw std::runtime_error(fmt::format("{} is too short for windows of {} tokens", o.text, o.context));

  tg::Decoder model = o.resume ? restored_model(o, *vocab, path) : make_model(o, *vocab);
  std::optional<tg::DataParallel> dp;
  if (o.distributed)
    dp.emplace(group, model, tg::DataParallelOptions{.micro_batches = o.micro_batches,
                                                     .reduction = o.reduction == "fast" ? tg::GradientReduction::fast : tg::GradientReduction::exact,
                                                     .shard_optimizer_state = o.shard_optimizer});
  tg::AdamW opt(dp ? dp->optimizer_parameters() : model.named_parameters(), {.lr = o.lr, .weight_decay = 0.01});
  // The windows come from one stream that the checkpoint saves (docs/training.md says why), as
  // are the dropout layers' streams (the model's named_generators()).
  tg::Generator data(o.seed);
  tg::TrainingState state{.model = model, .optimizer = opt, .generators = {{"data", data}}};
  if (o.resume && dp) tg::load_training_state(path, state, *dp);
  else if (o.resume) tg::load_training_state(path, state);
  const std::int64_t done = state.step, total = o.steps, stop = o.stop_at > 0 ? std::min(o.stop_at, total) : total;
  if (total < done)
    throw std::invalid_argument(fmt::format("--steps {} is fewer than the {} steps {} has done", total, done, path));
  const tg::WarmupCosine schedule(o.lr, std::min<std::int64_t>(100, total / 10), total, o.lr / 10);
  if (speaker)
    fmt::print("train_chars: {} {} tokens ({} in the vocabulary) of {} characters from {}; {} parameters; steps {} to {} of {}; {} thread(s)\n",
               text.size(), o.tokenizer, vocab->size(), raw.size(), o.text, model.parameter_count(), done, std::max(done, stop), total,
               tg::num_threads());
  if (speaker && dp) {
    double state_bytes = 0;  // the optimizer state this process keeps (about 1/P of it when sharded)
    for (const auto& t : opt.state()) state_bytes += static_cast<double>(t.tensor.numel() * static_cast<std::int64_t>(tg::itemsize(t.tensor.dtype())));
    fmt::print("data-parallel: {} process(es) ({}), {} micro-batches of {} windows per step, {} reduction, optimizer state {:.2f} MB on rank 0{}\n",
               group.size(), group.backend(), o.micro_batches, o.batch / o.micro_batches, o.reduction, state_bytes / 1e6,
               o.shard_optimizer ? " (sharded)" : "");
  }

  ex::Series train_curve{"training", {}, {}}, validation_curve{"validation", {}, {}};
  ex::Progress progress(total, o.log_every, done);
  double training_seconds = 0;  // the steps alone, without the validation passes
  for (std::int64_t step = done; step < stop; ++step) {
    const auto step_started = std::chrono::steady_clock::now();
    const tg::Windows batch = tg::random_windows(std::span(text).first(split), o.batch, o.context, data);
    opt.set_learning_rate(schedule(step));
    double loss_value = 0;
    if (dp) {
      loss_value = distributed_step(*dp, model, opt, batch, o, step);
    } else {
      const Tensor loss = tg::cross_entropy(model.forward(batch.x), batch.y);
      tg::backward(loss);
      tg::clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      loss_value = loss.item();
    }
    opt.zero_grad();
    training_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_started).count();
    if (!speaker) continue;
    train_curve.x.push_back(static_cast<double>(step + 1));
    train_curve.y.push_back(loss_value);
    if ((step + 1) % 250 == 0 || step + 1 == total) {
      model.eval();
      validation_curve.x.push_back(static_cast<double>(step + 1));
      validation_curve.y.push_back(validation_loss(model, *vocab, text, split, o.context).nats_per_token);
      model.train();
    }
    std::vector<std::pair<std::string, double>> shown{{"loss", train_curve.y.back()}};
    if (!validation_curve.y.empty()) shown.emplace_back("val", validation_curve.y.back());
    progress.update(step + 1, (step + 1 - done) * o.batch * o.context, shown);
  }
  state.step = std::max(done, stop);
  state.metadata = describe(o, *vocab);
  if (dp) {
    tg::key_generators(model, o.seed, state.step * o.micro_batches);  // the streams of the next step, whoever saves
    tg::save_training_state(path, state, *dp);
  } else {
    tg::save_training_state(path, state);
  }
  if (!speaker) return 0;
  model.eval();
  const Validation val = validation_loss(model, *vocab, text, split, o.context);
  fmt::print("validation loss {:.4f} nats per token = {:.3f} bits per character ({:.3f} characters per token; uniform over the vocabulary: "
             "{:.3f} bits per token)\n",
             val.nats_per_token, val.bits_per_char(), val.chars_per_token, std::log2(static_cast<double>(vocab->size())));
  if (stop > done)
    fmt::print("{} positions, {} key/value heads, window {}: {:.1f} ms per training step\n", o.positions, o.kv_heads == 0 ? o.heads : o.kv_heads,
               o.window == 0 ? std::string("none") : std::to_string(o.window), 1000 * training_seconds / static_cast<double>(stop - done));
  if (!train_curve.x.empty())
    ex::plot_lines(o.out + "/loss.png", {"train_chars: cross-entropy per token", "step", "nats", {train_curve, validation_curve}, true});
  attention_figure(model, *vocab, o, text, split);
  show_samples(model, *vocab, o);
  fmt::print("\nwrote {0}/loss.png, {0}/attention.png, {0}/checkpoint.safetensors (step {1} of {2})\n", o.out, state.step, total);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  tg::ProcessGroup group;  // MPI's processes under a launcher, else this one alone
  try {
    return run(group, argc, argv);
  } catch (const std::exception& e) {
    if (group.size() > 1) group.abort(fmt::format("train_chars: {}", e.what()));  // ends every process
    throw;
  }
} catch (const std::exception& e) {
  fmt::print(stderr, "train_chars: {}\n", e.what());
  return 1;
}
