// save_training_state / load_training_state: a run resumed from one file into fresh objects
// continues bit for bit as the uninterrupted run, and a file that does not fit changes nothing.
#define BOOST_TEST_MODULE training_state
#include <unistd.h>

#include <filesystem>

#include "support.hpp"

namespace tg = tapegrad;
namespace fs = std::filesystem;
using namespace tg_test;

namespace {

struct TempDir {
  TempDir() : path(fs::temp_directory_path() / fmt::format("tapegrad-training-state-{}", ::getpid())) { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

// A small decoder with dropout, AdamW and a data stream: everything a run's next step depends on.
struct Run {
  explicit Run(std::uint64_t seed)
      : model({.vocab = 11, .max_len = 8, .dim = 8, .heads = 2, .layers = 2, .dropout = 0.3, .seed = seed}),
        opt(model.named_parameters(), {.lr = 0.01}),
        data(seed + 100) {}
  tg::TrainingState state() { return {.model = model, .optimizer = opt, .generators = {{"data", data}}}; }
  // `n` steps from `step` on, with a schedule keyed by step; returns each step's loss.
  std::vector<float> train(std::int64_t step, std::int64_t n) {
    static const std::vector<std::int64_t> text = [] {
      std::vector<std::int64_t> t;
      for (int i = 0; i < 200; ++i) t.push_back((i * 7 + i / 3) % 11);
      return t;
    }();
    std::vector<float> losses;
    for (std::int64_t s = step; s < step + n; ++s) {
      const auto [x, y] = tg::random_windows(text, 3, 8, data);
      const tg::Tensor loss = tg::cross_entropy(model.forward(x), y);
      tg::backward(loss);
      opt.set_learning_rate(0.01 / static_cast<double>(s + 1));
      opt.step();
      opt.zero_grad();
      losses.push_back(loss.to_vector<float>()[0]);
    }
    return losses;
  }
  std::vector<std::vector<float>> parameters() {
    std::vector<std::vector<float>> out;
    for (const tg::Tensor& p : model.parameters()) out.push_back(p.to_vector<float>());
    for (const tg::NamedTensor& t : opt.state()) out.push_back(t.tensor.to(tg::float32).to_vector<float>());
    return out;
  }
  tg::Decoder model;
  tg::AdamW opt;
  tg::Generator data;
};

// `run` after `steps` steps, saved in `dir` at that step with the metadata {vocab: abc}: the file.
fs::path trained_and_saved(const TempDir& dir, Run& run, std::int64_t steps) {
  run.train(0, steps);
  tg::TrainingState saved = run.state();
  saved.step = steps;
  saved.metadata = {{"vocab", "abc"}};
  const fs::path file = dir.path / "state.safetensors";
  tg::save_training_state(file, saved);
  return file;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_resumed_run_equals_the_uninterrupted_one) {
  TempDir dir;
  Run run(1);
  const fs::path file = trained_and_saved(dir, run, 3);
  const std::vector<float> after = run.train(3, 4);

  Run resumed(2);  // other weights, another data stream: the file must replace all of them
  tg::TrainingState state = resumed.state();
  tg::load_training_state(file, state);
  BOOST_TEST(state.step == 3);
  BOOST_TEST((state.metadata == std::map<std::string, std::string>{{"vocab", "abc"}}));
  BOOST_TEST(resumed.opt.steps() == 3);
  BOOST_TEST(resumed.opt.learning_rate() == 0.01 / 3);
  BOOST_TEST(resumed.train(3, 4) == after);  // bitwise: dropout and the data resumed too
  BOOST_TEST(resumed.parameters() == run.parameters());
  // Without the dropout streams the losses differ: the check above sees them.
  Run no_dropout_state(2);
  tg::TrainingState partial = no_dropout_state.state();
  tg::load_training_state(file, partial);
  for (const tg::NamedGenerator& g : no_dropout_state.model.named_generators()) g.generator.get() = tg::Generator(5);
  BOOST_TEST(no_dropout_state.train(3, 4) != after);
}

BOOST_AUTO_TEST_CASE(a_file_that_does_not_fit_changes_nothing) {
  TempDir dir;
  const fs::path file = dir.path / "state.safetensors";
  Run run(1);
  run.train(0, 2);
  tg::save_training_state(file, run.state());

  Run other(3);
  const auto before = other.parameters();
  const tg::Tensor data_before = other.data.get_state();
  auto unchanged = [&] {
    BOOST_TEST(other.parameters() == before);
    BOOST_TEST(other.data.get_state().to_vector<std::int64_t>() == data_before.to_vector<std::int64_t>());
    BOOST_TEST(other.opt.steps() == 0);
  };
  // Another generator name: one missing, one unexpected.
  tg::TrainingState renamed{.model = other.model, .optimizer = other.opt, .generators = {{"batches", other.data}}};
  check_throws<tg::ValueError>([&] { tg::load_training_state(file, renamed); },
                               {"load_training_state", "state.safetensors", "2 problems", "missing 'generator.batches'",
                                "unexpected 'generator.data'", "nothing was changed"});
  unchanged();
  // Another model: every difference named under model.
  tg::Decoder wider({.vocab = 11, .max_len = 8, .dim = 12, .heads = 2, .layers = 2, .dropout = 0.3});
  tg::AdamW wider_opt(wider.named_parameters());
  tg::TrainingState wide{.model = wider, .optimizer = wider_opt, .generators = {{"data", other.data}}};
  check_throws<tg::ValueError>([&] { tg::load_training_state(file, wide); }, {"load_training_state", "model: 'tok.weight': shape [11, 12]"});
  // Another optimizer: its own check, before it copies anything.
  tg::SGD sgd(other.model.named_parameters(), {.momentum = 0.9});
  tg::TrainingState with_sgd{.model = other.model, .optimizer = sgd, .generators = {{"data", other.data}}};
  check_throws<tg::ValueError>([&] { tg::load_training_state(file, with_sgd); }, {"load_training_state", "does not fit the optimizer", "SGD::load_state"});
  unchanged();
  // A generator's state the generator refuses.
  tg::SafetensorsFile f = tg::load_safetensors(file);
  for (tg::NamedTensor& t : f.tensors)
    if (t.name == "generator.data") t.tensor = tg::slice(t.tensor, 0, 0, 5);
  tg::save_safetensors(file, f.tensors, f.metadata);
  tg::TrainingState state = other.state();
  check_throws<tg::ValueError>([&] { tg::load_training_state(file, state); }, {"'generator.data'", "Generator::set_state", "shape [5]"});
  unchanged();
  // A file save_training_state did not write, and metadata it would not write.
  tg::save(other.model, file);
  check_throws<tg::FormatError>([&] { tg::load_training_state(file, state); }, {"load_training_state", "no metadata 'tapegrad.step'"});
  f.metadata["tapegrad.learning_rate"] = "0.1x";
  tg::save_safetensors(file, f.tensors, f.metadata);
  check_throws<tg::FormatError>([&] { tg::load_training_state(file, state); }, {"load_training_state", "'tapegrad.learning_rate'", "'0.1x'"});
  unchanged();
}

BOOST_AUTO_TEST_CASE(the_model_alone_loads_for_inference) {
  TempDir dir;
  Run run(1);
  const fs::path file = trained_and_saved(dir, run, 2);

  tg::Decoder model({.vocab = 11, .max_len = 8, .dim = 8, .heads = 2, .layers = 2, .dropout = 0.3, .seed = 9});
  std::vector<tg::Tensor> streams;
  for (const tg::NamedGenerator& g : model.named_generators()) streams.push_back(g.generator.get().get_state());
  BOOST_TEST((tg::load_training_state_model(file, model) == std::map<std::string, std::string>{{"vocab", "abc"}}));
  const auto loaded = model.parameters(), trained = run.model.parameters();
  BOOST_REQUIRE(loaded.size() == trained.size());
  for (std::size_t i = 0; i < loaded.size(); ++i) BOOST_TEST(loaded[i].to_vector<float>() == trained[i].to_vector<float>());
  std::size_t i = 0;  // the random streams are left as they were
  for (const tg::NamedGenerator& g : model.named_generators())
    BOOST_TEST(g.generator.get().get_state().to_vector<std::int64_t>() == streams[i++].to_vector<std::int64_t>());

  tg::Decoder wider({.vocab = 11, .max_len = 8, .dim = 12, .heads = 2, .layers = 2});
  const auto before = wider.parameters()[0].to_vector<float>();
  check_throws<tg::ValueError>([&] { tg::load_training_state_model(file, wider); },
                               {"load_training_state_model", "state.safetensors", "does not fit the model", "'tok.weight': shape [11, 12]",
                                "nothing was changed"});
  BOOST_TEST(wider.parameters()[0].to_vector<float>() == before);
  tg::save(model, file);
  check_throws<tg::FormatError>([&] { tg::load_training_state_model(file, model); },
                                {"load_training_state_model", "no metadata 'tapegrad.step'"});
}

BOOST_AUTO_TEST_CASE(save_refuses_what_it_could_not_load) {
  TempDir dir;
  const fs::path file = dir.path / "state.safetensors";
  Run run(1);
  tg::TrainingState state = run.state();
  state.step = -1;
  check_throws<tg::ValueError>([&] { tg::save_training_state(file, state); }, {"save_training_state", "state.step", "-1"});
  state.step = 0;
  state.metadata = {{"tapegrad.step", "4"}};
  check_throws<tg::ValueError>([&] { tg::save_training_state(file, state); }, {"save_training_state", "'tapegrad.step'", "keeps"});
  state.metadata.clear();
  state.generators.push_back({"", run.data});
  check_throws<tg::ValueError>([&] { tg::save_training_state(file, state); }, {"save_training_state", "state.generators[1]", "empty name"});
  state.generators.back().name = "data";
  check_throws<tg::ValueError>([&] { tg::save_training_state(file, state); }, {"save_training_state", "'generator.data'", "unique"});
  BOOST_TEST(!fs::exists(file));
}
